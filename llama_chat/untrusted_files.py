"""Files and values that strangers wrote (a model folder's files, a saved conversation, a
safetensors header, another tool's store), read with one clear error for a bad one:
- only a regular file is opened for reading, never a FIFO that waits or a device that
  never ends, and its text only up to a size its kind never passes;
- JSON is refused unparsed when it nests deeper than real files do: the json module
  recurses once per level, so a few hundred thousand brackets would end in RecursionError,
  and a linear scan of the bracket depth outside string literals finds them first;
- a value is shown short, on one line, in the message that refuses it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

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


MAX_NESTING = 64  # real files nest a handful of levels
MAX_JSON_FILE_BYTES = 64 * 2**20  # far above any config, template or conversation
_SCAN_CHUNK = 1 << 20  # brackets counted at a time, to bound the memory the count takes

# A string literal (or an unterminated one's rest: every match moves on, so the scan is
# linear), or a run of characters that are neither brackets nor quotes.
_NOT_BRACKETS = re.compile(r'"[^"\\]*+(?:\\[\s\S]?[^"\\]*+)*+(?:"|\Z)|[^"\[\]{}]++')
_STEP = np.zeros(256, np.int64)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1


def check_nesting(text: str) -> None:
    """Raise ValueError when brackets outside string literals nest deeper than MAX_NESTING."""
    brackets = np.frombuffer(_NOT_BRACKETS.sub("", text).encode("ascii"), np.uint8)
    depth = 0
    for start in range(0, len(brackets), _SCAN_CHUNK):
        running = np.cumsum(_STEP[brackets[start : start + _SCAN_CHUNK]]) + depth
        if running.max() > MAX_NESTING:
            raise ValueError(f"nested more than {MAX_NESTING} levels deep")
        depth = int(running[-1])


def parse_json(text: str | bytes) -> Any:
    """json.loads with nesting bounded first; ValueError (json.JSONDecodeError or a depth
    error, or UnicodeDecodeError for bytes that are not UTF-8) for text that is not JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    check_nesting(text)
    return json.loads(text)


def read_json_object(path: Path) -> dict | None:
    """A JSON object file's contents, or None when the file does not exist."""
    try:
        text = read_text_file(path, MAX_JSON_FILE_BYTES)
    except FileNotFoundError:
        return None
    try:
        contents = parse_json(text)
    except ValueError as error:
        raise LlamaChatError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(contents, dict):
        raise LlamaChatError(f"{path}: expected a JSON object")
    return contents


def shown(value: Any, limit: int = 40) -> str:
    """A value from a file as a short one-line repr, for messages."""
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python converts
        return f"a {type(value).__name__} too long to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."
