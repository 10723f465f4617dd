"""Values read from a model file, checked before any arithmetic uses them, and shown
short in the one-line messages that refuse them."""

from __future__ import annotations

import math
from typing import Any

from llama_chat.errors import LlamaChatError
from llama_chat.untrusted_files import shown

LARGEST_WHOLE_NUMBER = 1 << 31  # far above any model's sizes, and small enough for any arithmetic on them
# Llama 3.1 405B has 126 layers; the names of every layer's tensors are listed before any is
# read, so a count in the billions would take minutes and gigabytes.
MAX_LAYERS = 1024
# A cache of the whole context grows the rotary tables to it (4 bytes a position and head
# dimension): a context of two billion claimed by a file would take hundreds of GB.
MAX_CONTEXT = 1 << 18  # 262,144: twice Llama 3.1's context


def whole_number(value: Any, name: str, source: object) -> int:
    """`value` if it is a whole number from 1 to LARGEST_WHOLE_NUMBER (not a bool), else
    LlamaChatError naming `source` and `name`."""
    if type(value) is not int or not 0 < value <= LARGEST_WHOLE_NUMBER:
        raise LlamaChatError(f"{source}: {name} is {shown(value)}, where a positive whole number belongs")
    return value


def layer_count(value: Any, name: str, source: object) -> int:
    """`value` if it is a whole number of layers up to MAX_LAYERS, else LlamaChatError."""
    if whole_number(value, name, source) > MAX_LAYERS:
        raise LlamaChatError(f"{source}: {name} is {value}, more layers than llama-chat runs (at most {MAX_LAYERS})")
    return value


def context_length(value: Any, name: str, source: object) -> int:
    """A whole number of positions, read as at most MAX_CONTEXT (more than a chat on one
    machine reaches; llama-chat's default context is 4096)."""
    return min(whole_number(value, name, source), MAX_CONTEXT)


def real_number(value: Any, name: str, source: object) -> float:
    """`value` as a float if it is a finite number (not a bool), else LlamaChatError."""
    if (type(value) is int and abs(value) <= 1 << 53) or (type(value) is float and math.isfinite(value)):
        return float(value)
    raise LlamaChatError(f"{source}: {name} is {shown(value)}, where a number belongs")


def positive_number(value: Any, name: str, source: object) -> float:
    """`value` as a float if it is a finite number above 0, else LlamaChatError."""
    number = real_number(value, name, source)
    if number <= 0:
        raise LlamaChatError(f"{source}: {name} is {shown(value)}, where a positive number belongs")
    return number


_KIND_NAMES = {str: "text", int: "a whole number", float: "a number", bool: "true or false", list: "a list"}


def of_type(value: Any, kind: type, name: str, source: object) -> Any:
    """`value` if it is a `kind` (a bool is not an int here, nor an int a float), else
    LlamaChatError."""
    if type(value) is not kind:
        raise LlamaChatError(f"{source}: {name} is {shown(value)}, where {_KIND_NAMES[kind]} belongs")
    return value
