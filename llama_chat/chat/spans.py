"""Each exchange's token ids as they went through the model, and whether ids read from a
file hold the text they stand for."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llama_chat.chat.exchange import Exchange
from llama_chat.text.chat_format import THINKING_CLOSE

_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Span:
    """The ids one exchange added to the conversation."""

    user: list[int]  # the user turn and the generation prompt
    reply: list[int]  # the reply as generated (calls and results too), then the end-of-turn ids


class Spans:
    """Each exchange's span, by the exchange itself: two exchanges of the same text (a reply
    retried to the same words) are two, each with the ids it went through the model as."""

    def __init__(self) -> None:
        self._spans: dict[int, tuple[Exchange, Span]] = {}  # by id(): the exchange kept, its id never reused

    def get(self, exchange: Exchange) -> Span | None:
        entry = self._spans.get(id(exchange))
        return entry[1] if entry is not None else None

    def __setitem__(self, exchange: Exchange, span: Span) -> None:
        self._spans[id(exchange)] = (exchange, span)


def ids_hold_text(
    system: str | None, spans: Sequence[tuple[Exchange, Span]], head: Sequence[int],
    decode: Callable[[list[int]], str],
) -> bool:
    """Whether token ids hold the text they stand for, so that the model reads what the
    conversation shows: each exchange's ids decode to text holding its user message, then its
    reply's answer (what follows any thinking, which a template may leave out); the first
    exchange's, with the head ids, hold the system prompt before them. Whitespace is not
    compared: templates trim it. Ids with more in them than the text pass."""
    for number, (exchange, span) in enumerate(spans):
        ids = span.user + span.reply
        expected = [exchange.user, exchange.reply.rpartition(THINKING_CLOSE)[2]]
        if number == 0:
            ids, expected = [*head, *ids], [system or "", *expected]
        if not _holds_in_order(decode(ids), expected):
            return False
    return True


def _holds_in_order(text: str, parts: Sequence[str]) -> bool:
    text = _WHITESPACE.sub("", text)
    position = 0
    for part in parts:
        part = _WHITESPACE.sub("", part)
        found = text.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return True
