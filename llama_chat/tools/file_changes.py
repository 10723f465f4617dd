"""A change to a text file, as the user sees it before saying yes (a unified diff) and as
it is made (all at once: the new text goes to a file beside the old one, which then takes
its place, so that no one ever reads half of it).

The change is made through a descriptor of the file's folder, opened beneath the folder the
tools may use, so it lands where it was checked or nowhere. The temporary file's name holds
the writer's process id: one left by a write that was killed is removed by the next write
in its folder, once its process is gone.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import secrets
import stat

from llama_chat.tools.beneath import open_beneath, open_folder
from llama_chat.tools.folders import Place

_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")  # lines end at "\n" alone, as the tools count them
NO_NEWLINE = "\\ No newline at end of file\n"
_TEMPORARY = re.compile(r"\..*\.llama-chat-([1-9][0-9]{0,9})-[0-9a-f]{12}\.tmp", re.DOTALL)  # the writer's pid
_FOLDER = os.O_RDONLY | os.O_DIRECTORY  # read too: its leftovers are listed


class Replaced(Exception):
    """The file a change was made from is no longer the one at its name."""


def lines_of(text: str) -> list[str]:
    """`text` cut into lines, each with its own ending."""
    return _LINE.findall(text)


def unified_diff(old: str | None, new: str, shown: str) -> str:
    """The change from `old` (None: no file yet) to `new` in the file shown as `shown`."""
    if old == new:
        return f"no change: {shown} already holds this text\n"
    if old is None and not new:
        return f"a new, empty file: {shown}\n"
    diff = difflib.unified_diff(lines_of(old or ""), lines_of(new), "/dev/null" if old is None else shown, shown)
    return "".join(line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}" for line in diff)


def write_atomically(place: Place, text: str, previous: os.stat_result | None) -> None:
    """Put `text` in the file at `place` in one step, making the folders it needs. `previous`
    is the file there as it was read (None: none was): it keeps its permissions, less
    setuid and setgid, and must still be at its name (else Replaced, nothing written).
    OSError passes through, with nothing left behind."""
    folder = _folder_made(place.parent())
    try:
        _remove_leftovers(folder)
        name = place.names[-1]
        # A name of its own beside the file: short, whatever the file's is, no one else's, and the writer's pid.
        temporary = f".{name[:64]}.llama-chat-{os.getpid()}-{secrets.token_hex(6)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=folder)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(text.encode("utf-8"))
                if previous is not None:
                    os.fchmod(file.fileno(), stat.S_IMODE(previous.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                file.flush()
                os.fsync(file.fileno())
            if not _same(folder, name, previous):
                raise Replaced()
            # a link put at `name` since is replaced, never followed
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        os.close(folder)


def _folder_made(place: Place) -> int:
    """A descriptor of the folder at `place`, opened beneath its folder, with the folders
    missing on the way made (each made in the one before it and opened from there)."""
    try:
        return place.open(_FOLDER)
    except FileNotFoundError:
        pass
    current = open_folder(place.folder)
    try:
        for name in place.names:
            try:
                step = open_beneath(current, [name], _FOLDER, place.openat2)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=current)
                step = open_beneath(current, [name], _FOLDER, place.openat2)
            os.close(current)
            current = step
    except BaseException:
        os.close(current)
        raise
    return current


def _same(folder: int, name: str, previous: os.stat_result | None) -> bool:
    """Whether `name` in `folder` is still the file `previous` (or still none)."""
    try:
        now = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return previous is None
    return previous is not None and (now.st_dev, now.st_ino) == (previous.st_dev, previous.st_ino)


def _remove_leftovers(folder: int) -> None:
    """Remove the temporary files writes in this folder left when they were killed: ours,
    named by a process that is gone."""
    with os.scandir(folder) as entries:
        names = [entry.name for entry in entries if entry.name.startswith(".") and entry.name.endswith(".tmp")]
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None or _alive(int(match[1])):
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            found = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid():
                os.unlink(name, dir_fd=folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # PermissionError: another user's; OverflowError: no pid at all
        return True
    return True
