"""Opening beneath a folder: a link anywhere on the way, or a way out, makes the open fail,
by the kernel's openat2 where it has it and by the walk a name at a time."""

import errno
import os

import pytest

from llama_chat.tools.beneath import FOLDER_PATH, kernel_resolves_beneath, open_beneath, open_folder
from llama_chat.tools.folders import Folders

WAYS = [pytest.param(kernel_resolves_beneath(), id="kernel"), pytest.param(False, id="walk")]


@pytest.fixture
def folder(tmp_path):
    """work/ holding sub/file.txt, a link to sub, a link to the file, and a link out."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "file.txt").write_text("inside\n")
    (work / "to-sub").symlink_to("sub")
    (work / "to-file").symlink_to("sub/file.txt")
    (tmp_path / "outside.txt").write_text("outside\n")
    (work / "out").symlink_to(tmp_path / "outside.txt")
    descriptor = open_folder(work)
    yield descriptor
    os.close(descriptor)


def read(descriptor: int) -> str:
    with os.fdopen(descriptor) as file:
        return file.read()


@pytest.mark.parametrize("openat2", WAYS)
def test_what_lies_beneath_opens(folder, openat2):
    assert read(open_beneath(folder, ["sub", "file.txt"], os.O_RDONLY, openat2)) == "inside\n"
    inner = open_beneath(folder, ["sub"], os.O_RDONLY | os.O_DIRECTORY, openat2)
    try:
        assert os.listdir(inner) == ["file.txt"]
    finally:
        os.close(inner)


@pytest.mark.parametrize("openat2", WAYS)
@pytest.mark.parametrize("names, flags", [
    (["to-sub", "file.txt"], os.O_RDONLY),  # a link on the way
    (["to-file"], os.O_RDONLY),  # a link last
    (["out"], os.O_RDONLY),  # a link out
    (["to-sub"], FOLDER_PATH),  # a link to a folder, opened as a folder
])
def test_a_link_anywhere_makes_the_open_fail(folder, openat2, names, flags):
    with pytest.raises(OSError) as raised:
        os.close(open_beneath(folder, names, flags, openat2))
    assert raised.value.errno in (errno.ELOOP, errno.ENOTDIR)


@pytest.mark.parametrize("openat2", WAYS)
@pytest.mark.parametrize("names", [[".."], ["sub", "..", ".."], ["/etc"], [""], ["sub/file.txt"]])
def test_names_that_could_lead_elsewhere_are_no_names(folder, openat2, names):
    with pytest.raises(ValueError, match="is no name of a file or folder"):
        open_beneath(folder, names, os.O_RDONLY, openat2)


def test_folders_open_by_openat2_where_the_kernel_has_it(tmp_path):
    assert Folders(tmp_path).openat2 == kernel_resolves_beneath()
    assert Folders(tmp_path, openat2=False).openat2 is False
