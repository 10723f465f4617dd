"""Files the file tools read, as they read them: only regular files (never waiting on a FIFO
or reading a device that never ends), opened beneath their folder (tools/beneath.py), text
only where it is UTF-8 without NUL bytes.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llama_chat.tools.folders import Place

SNIFF_BYTES = 8192  # how much of a file tells text from binary
READ_BUFFER = 1 << 20  # how much of a file is read at a time
_READING = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY  # O_NONBLOCK: a FIFO put in a file's place does not wait


def open_regular(place: Place) -> io.BufferedReader:
    """The file at `place` open for binary reading; OSError (strerror "not a regular file")
    for a folder, FIFO, socket or device, and for a link put in the place of a name since
    the place was resolved."""
    return _regular(place.open(_READING), str(place.path))


def open_regular_in(folder: int, name: str) -> io.BufferedReader:
    """The file `name` in the folder open as `folder`, as open_regular opens one."""
    return _regular(os.open(name, _READING | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder), name)


def _regular(descriptor: int, shown: str) -> io.BufferedReader:
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(0, "not a regular file", shown)
    return os.fdopen(descriptor, "rb", buffering=READ_BUFFER)


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


def sniff_binary(file: io.BufferedReader) -> bool:
    """Whether `file` is binary, by its first SNIFF_BYTES (read where they are, the file's
    position kept); OSError passes through."""
    start = os.pread(file.fileno(), SNIFF_BYTES, 0)
    return is_binary(start, whole=len(start) < SNIFF_BYTES)


class NotText(ValueError):
    """A file that is binary: not UTF-8, or with a NUL byte."""


class TooLarge(ValueError):
    """A file larger than its reader takes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size:,} bytes")
        self.size = size


def read_text(file: io.BufferedReader, limit: int) -> str:
    """An open regular file's whole text, refused unread (TooLarge) where it has more than
    `limit` bytes and refused (NotText) where it is binary; OSError passes through."""
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
    if error.errno in (errno.ELOOP, errno.EXDEV):
        return f"{reason}: a name on the way to it was swapped for a link while it was used; look again"
    if error.errno == errno.ENOTDIR:
        return f"{reason}: a name on the way to it is no folder now (a file or a link took its place); look again"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{reason}: the user must make room"
    return f"{reason}: tell the user"
