"""Text as it arrives from outside: command-line arguments, stdin, the terminal, files.

Python hands over bytes that are not UTF-8 as lone surrogates (U+DC80..U+DCFF, by its
"surrogateescape" rule), which no tokenizer takes. They become U+FFFD here, the
replacement character, and the caller says so in one line.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_undecodable(text: str) -> tuple[str, int]:
    """The text with every undecodable byte (or other lone surrogate) as U+FFFD, and how
    many were replaced."""
    count = len(_SURROGATE.findall(text))
    if not count:
        return text, 0
    try:  # the escaped bytes decoded again: a valid sequence among them comes back whole
        cleaned = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # surrogates not made by surrogateescape
        cleaned = _SURROGATE.sub("\ufffd", text)
    return cleaned, count


def undecodable_note(where: str, count: int) -> str:
    what = "1 byte that is" if count == 1 else f"{count} bytes that are"
    return f"{where} had {what} not UTF-8 text; each is read as U+FFFD (\ufffd)"


def has_undecodable(text: str) -> bool:
    return _SURROGATE.search(text) is not None
