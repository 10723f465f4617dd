"""Opening a file someone named for reading: only a regular file, never waiting on a FIFO
or reading a device that never ends."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_regular_file(path: Path) -> BinaryIO:
    """`path` open for binary reading; OSError (strerror "not a regular file") for a
    directory, FIFO, socket or device. FileNotFoundError and the like pass through."""
    return open(path, "rb", opener=_open_regular)


def _open_regular(path: str, flags: int) -> int:
    descriptor = os.open(path, flags | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(0, "not a regular file", path)
    return descriptor
