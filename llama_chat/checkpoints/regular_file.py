"""Opening a file someone named for reading: only a regular file, never waiting on a FIFO
or reading a device that never ends, and its text only up to a size its kind never passes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from llama_chat.errors import LlamaChatError


def open_regular_file(path: Path) -> BinaryIO:
    """`path` open for binary reading; OSError (strerror "not a regular file") for a
    directory, FIFO, socket or device. FileNotFoundError and the like pass through."""
    return open(path, "rb", opener=_open_regular)


def read_text_file(path: Path, limit: int) -> str:
    """A regular file's UTF-8 text, refused unread when larger than `limit` bytes.
    FileNotFoundError passes through; every other failure is a LlamaChatError naming the file."""
    try:
        with open_regular_file(path) as file:
            size = os.fstat(file.fileno()).st_size
            if size > limit:
                raise LlamaChatError(f"{path}: {size} bytes, more than a file of its kind holds (at most {limit})")
            return file.read(limit + 1).decode("utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise LlamaChatError(f"{path}: not UTF-8 text") from None
    except OSError as error:
        raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error})") from None


def _open_regular(path: str, flags: int) -> int:
    descriptor = os.open(path, flags | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(0, "not a regular file", path)
    return descriptor
