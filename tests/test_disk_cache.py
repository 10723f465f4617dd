"""The one way llama-chat keeps cache entries (disk_cache.py): keyed by what they depend on,
written whole or not at all, removed with a one-line reason when they do not read back."""

import json
import os
import subprocess
import sys

import pytest

from llama_chat import disk_cache, paths
from llama_chat.errors import CorruptFileError
from llama_chat.options import DataFolders


def test_a_key_depends_on_the_description_not_its_order():
    key = disk_cache.cache_key({"source": ["a.gguf", 10], "cpu": "avx2"})
    assert key == disk_cache.cache_key({"cpu": "avx2", "source": ["a.gguf", 10]})
    assert key != disk_cache.cache_key({"cpu": "avx2", "source": ["a.gguf", 11]})
    assert len(key) == 24 and len(disk_cache.cache_key([], length=20)) == 20


def test_entries_are_under_the_cache_folder_and_nowhere_when_it_is_off(tmp_path):
    previous = paths.configure(DataFolders(cache=tmp_path))
    try:
        assert disk_cache.entry_path("packed", "x.safetensors") == tmp_path / "packed" / "x.safetensors"
        paths.configure(DataFolders(cache_off=True))
        assert disk_cache.entry_path("packed", "x.safetensors") is None
    finally:
        paths.configure(previous)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "folder" / "entry.json"
    with disk_cache.staged(path) as staging:
        staging.write_text("old")
    with pytest.raises(OSError), disk_cache.staged(path) as staging:
        staging.write_text("half")
        raise OSError("disk full")
    assert path.read_text() == "old" and [p.name for p in path.parent.iterdir()] == ["entry.json"]


def test_what_a_killed_writer_left_goes_with_the_next_write(tmp_path):
    """A writer killed mid-way (SIGKILL runs no cleanup) leaves its temporary file; the
    next writer of the entry removes it, and leaves a running writer's alone."""
    path = tmp_path / "entry.bin"
    killed = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".entry.bin.{killed.stdout.strip()}.abc123{disk_cache.STAGING_SUFFIX}"
    left.write_bytes(b"half")
    running = tmp_path / f".entry.bin.{os.getppid()}.def456{disk_cache.STAGING_SUFFIX}"
    running.write_bytes(b"going on")
    with disk_cache.staged(path) as staging:
        staging.write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["entry.bin", running.name])


def test_an_entry_that_does_not_read_back_is_removed_with_one_line(tmp_path):
    entry, record = tmp_path / "entry.json", tmp_path / "entry.json.sha256"
    entry.write_text("{not json")
    record.write_text("")
    value, damage = disk_cache.read_checked([entry, record], lambda: json.loads(entry.read_text()))
    assert value is None and damage.startswith("Expecting property name") and "\n" not in damage
    assert not entry.exists() and not record.exists()
    entry.write_text("[1]")
    assert disk_cache.read_checked([entry], lambda: json.loads(entry.read_text())) == ([1], "")


def test_only_the_errors_named_as_damage_remove_an_entry(tmp_path):
    entry = tmp_path / "entry"
    entry.write_text("x")

    def mismatched():
        raise KeyError("another model's")

    with pytest.raises(KeyError):
        disk_cache.read_checked([entry], mismatched)
    assert entry.exists()

    def damaged():
        raise CorruptFileError("its header is not the one it was written with\nsecond line")

    assert disk_cache.read_checked([entry], damaged) == (None, "its header is not the one it was written with")
    assert not entry.exists()


def test_an_entry_that_cannot_be_removed_is_left(tmp_path):
    folder = tmp_path / "entry"
    folder.mkdir()  # a folder where the entry's file should be
    assert disk_cache.read_checked([folder], folder.read_text)[1]
    assert folder.is_dir()
