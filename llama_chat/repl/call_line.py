"""A tool call as a person is asked about it: one line with the tool's name, where it comes
from (built-in, or which MCP server's) and its arguments as JSON, every character that does
not print escaped (chat.display.literal).

Given a width, the line keeps to it, so that the start of what will run is on screen when
the question below it is asked, however the arguments are padded: the short strings are
shown whole; in a long one, a run of one character is written once with its count, and
what is still too long is cut to its start and its end with the count of characters
between; too many pieces even so (a thousand keys) fold the line the same way. A fold is
written outside the string's quotes ("start" …[N characters folded]… "end"), where the
arguments' own text cannot put it: between quotes JSON escapes every quote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len

from llama_chat.chat.display import literal
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools.tool import BUILT_IN, ToolSpec

MIN_STRING_CELLS = 64  # a folded string keeps about 20 cells of its start and 10 of its end, however long the call
FOLD = " …[{:,} characters folded]… "
REPEATED = " …[{} × {:,}]… "  # a run of one character in a folded string
_RUN = re.compile(r"(.)\1{31,}", re.DOTALL)  # 32 of one character or more

Unit = tuple[str, int]  # text shown, never cut, and the characters of the arguments it stands for


@dataclass(frozen=True)
class CallLine:
    """The line, and whether it folds some of the arguments (then the whole call is longer)."""

    text: str
    folded: bool


def source_label(spec: ToolSpec) -> str:
    """Where a tool comes from, as a person reads it: built-in, or the MCP server's name."""
    return "built-in" if spec.source == BUILT_IN else f'MCP server "{literal(spec.source)}"'


def call_line(call: ToolCall, spec: ToolSpec, cells: int | None = None) -> CallLine:
    """The call in one line of about `cells` terminal cells at most (None: whole, however long)."""
    head = f"{literal(call.name)} ({source_label(spec)}) "
    pieces = list(_pieces(dict(call.arguments)))
    if cells is None:
        return CallLine(head + "".join(piece if isinstance(piece, str) else _quoted(piece.text) for piece in pieces),
                        False)
    # The strings share the room the rest leaves, the shortest first: a string that fits in
    # its share is shown whole and leaves what it did not use to the longer ones.
    room = cells - _width(head) - sum(_width(piece) for piece in pieces if isinstance(piece, str))
    strings = sorted((index for index, piece in enumerate(pieces) if not isinstance(piece, str)),
                     key=lambda index: len(pieces[index].text))
    shown = [piece if isinstance(piece, str) else "" for piece in pieces]
    folded = False
    for order, index in enumerate(strings):
        share = max(room // (len(strings) - order), MIN_STRING_CELLS)
        text = pieces[index].text
        whole = _quoted(text) if len(text) <= share else None  # longer in characters is wider too
        if whole is not None and _width(whole) <= share:
            shown[index] = whole
        else:
            shown[index], folded = _folded_string(text, share), True
        room -= _width(shown[index])
    if room >= 0:
        return CallLine(head + "".join(shown), folded)
    # Too many pieces even so: the line's start and end. Strings are not cut again; numbers
    # and punctuation are, anywhere.
    units: list[Unit] = []
    for text, piece in zip(shown, pieces):
        units += [(text, len(piece.text) + 2)] if isinstance(piece, _String) else [(character, 1) for character in text]
    total = sum(count for _, count in units)
    return CallLine(head + _cut(units, reversed(units), total, cells - _width(head)), True)


@dataclass(frozen=True)
class _String:
    text: str


def _pieces(value: Any) -> Iterator[str | _String]:
    """The JSON of `value` in pieces: its strings (keys too) apart, the rest as text."""
    if isinstance(value, str):
        yield _String(value)
    elif isinstance(value, dict):
        yield "{"
        for number, (key, item) in enumerate(value.items()):
            yield ", " if number else ""
            yield _String(str(key))
            yield ": "
            yield from _pieces(item)
        yield "}"
    elif isinstance(value, (list, tuple)):
        yield "["
        for number, item in enumerate(value):
            yield ", " if number else ""
            yield from _pieces(item)
        yield "]"
    else:
        yield literal(json.dumps(value))


def _quoted(text: str) -> str:
    return f'"{_escaped(text)}"'


def _escaped(text: str) -> str:
    """A string's text as JSON writes it between quotes, with what does not print escaped too."""
    return literal(json.dumps(text, ensure_ascii=False)[1:-1])


def _folded_string(text: str, cells: int) -> str:
    """`text` quoted in about `cells`: each run of one character written once with its count,
    and where that is still too wide, cut to its start and its end."""
    shown, room = [], cells - 2  # the quotes
    for unit, _ in _units(text):
        room -= _width(unit)
        if room < 0:
            return '"' + _cut(_units(text), _units(text, backwards=True), len(text), cells - 2, quote='"') + '"'
        shown.append(unit)
    return '"' + "".join(shown) + '"'


def _units(text: str, backwards: bool = False) -> Iterator[Unit]:
    """`text` as it is shown, from its start or its end: each character escaped, each run of
    one character as that character and its count."""
    parts, position = [], 0
    for run in _RUN.finditer(text):
        parts += [(position, run.start(), False), (run.start(), run.end(), True)]
        position = run.end()
    parts.append((position, len(text), False))
    for start, end, repeated in reversed(parts) if backwards else parts:
        if repeated:
            yield f'"{REPEATED.format(_quoted(text[start]), end - start)}"', end - start
        else:
            for index in range(end - 1, start - 1, -1) if backwards else range(start, end):
                yield _escaped(text[index]), 1


def _cut(forwards: Iterable[Unit], backwards: Iterable[Unit], total: int, cells: int, quote: str = "") -> str:
    """The units that fit in two thirds of `cells` from the start and in a third from the end
    (`backwards`: the same units from the end), with the count of the `total` characters
    they stand for that are between; `quote` closes the text before the count and opens it after."""
    room = cells - len(FOLD.format(total)) - 2 * len(quote)
    start, start_count = _taken(forwards, room * 2 // 3, total)
    end, end_count = _taken(backwards, room - room * 2 // 3, total - start_count)
    between = total - start_count - end_count
    return f"{''.join(start)}{quote}{FOLD.format(between)}{quote}{''.join(reversed(end))}"


def _taken(units: Iterable[Unit], cells: int, most: int) -> tuple[list[str], int]:
    """The units that fit in `cells`, standing for `most` characters at most, and the
    characters they stand for."""
    taken, count = [], 0
    for shown, stands_for in units:
        cells -= _width(shown)
        if cells < 0 or count + stands_for > most:
            break
        taken.append(shown)
        count += stands_for
    return taken, count


def _width(text: str) -> int:
    """The cells `text` takes on a terminal, each character counted as one at least (a mark
    that combines with the one before takes none, but a thousand of them are not nothing)."""
    return len(text) + sum(max(cell_len(character) - 1, 0) for character in text if ord(character) > 0x7f)
