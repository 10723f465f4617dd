"""Files the file tools read, as they read them: only regular files (never waiting on a FIFO
or reading a device that never ends), text only where it is UTF-8 without NUL bytes.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import stat
from pathlib import Path

SNIFF_BYTES = 8192  # how much of a file tells text from binary
MISSING, FOLDER, FILE, OTHER = "missing", "folder", "file", "other"  # what a path names, for file_kind


def open_regular(path: Path) -> io.BufferedReader:
    """`path` open for binary reading; OSError (strerror "not a regular file") for a folder,
    FIFO, socket or device, and for a link put in the place of a path already resolved."""
    return open(path, "rb", opener=_open_regular)


def _open_regular(path: str, flags: int) -> int:
    descriptor = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW)  # O_NONBLOCK: a FIFO does not wait
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(0, "not a regular file", path)
    return descriptor


def file_kind(path: Path) -> str:
    """What `path` (resolved) names: MISSING, FOLDER, FILE (a regular one) or OTHER (a pipe,
    socket or device). OSError where it cannot be looked at (permission denied, say)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a file on the way to it
        return MISSING
    if stat.S_ISDIR(mode):
        return FOLDER
    return FILE if stat.S_ISREG(mode) else OTHER


def is_binary(start: bytes, whole: bool) -> bool:
    """Whether a file that starts with `start` is binary: a NUL byte, or bytes that are not
    UTF-8 (a character cut at the end of `start` counts as text, unless `start` is `whole`)."""
    if b"\0" in start:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(start, final=whole)
    except UnicodeDecodeError:
        return True
    return False


def sniff_binary(path: Path) -> bool:
    """Whether the file at `path` is binary, by its first SNIFF_BYTES; OSError passes through."""
    with open_regular(path) as file:
        start = file.read(SNIFF_BYTES)
        return is_binary(start, whole=len(start) < SNIFF_BYTES)


class NotText(ValueError):
    """A file that is binary: not UTF-8, or with a NUL byte."""


class TooLarge(ValueError):
    """A file larger than its reader takes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size:,} bytes")
        self.size = size


def read_text(path: Path, limit: int) -> str:
    """A regular file's whole text, refused unread (TooLarge) where it has more than `limit`
    bytes and refused (NotText) where it is binary; OSError passes through."""
    with open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise TooLarge(size)
        data = file.read(limit + 1)
    if len(data) > limit:  # it grew since
        raise TooLarge(len(data))
    if b"\0" in data:
        raise NotText()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotText() from None


def error_reason(error: OSError) -> str:
    """An OSError as its reason and, where it is one people can act on, what to do."""
    reason = error.strerror or str(error)
    if error.errno == errno.ENOENT:
        return f"{reason}: it is gone; look again with list_directory"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"{reason}: the user can change its permissions"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{reason}: the user must make room"
    return f"{reason}: tell the user"
