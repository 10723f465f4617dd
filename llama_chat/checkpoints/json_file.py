"""Reading JSON that strangers wrote (a model folder's files, a saved conversation, a
safetensors header), with one clear error for a bad one.

The json module recurses once per level of nesting, so a file of a few hundred thousand
brackets would end in RecursionError; a linear scan of the bracket depth outside string
literals refuses such a file before it is parsed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from llama_chat.checkpoints.regular_file import read_text_file
from llama_chat.errors import LlamaChatError

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
