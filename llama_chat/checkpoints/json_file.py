"""Reading the JSON files of a checkpoint directory, with one clear error for a bad one."""

from __future__ import annotations

import json
from pathlib import Path

from llama_chat.errors import LlamaChatError


def read_json_object(path: Path) -> dict | None:
    """A JSON object file's contents, or None when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as file:
            contents = json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LlamaChatError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(contents, dict):
        raise LlamaChatError(f"{path}: expected a JSON object")
    return contents
