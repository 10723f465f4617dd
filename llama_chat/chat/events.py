"""A reply as a front end sees it: one stream of events (`Turn.events()`), and the one place
a round's streamed text becomes them: the calls it writes left out (chat/call_text), the
thinking apart from the answer (chat/thinking)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llama_chat.chat.call_text import CallText
from llama_chat.chat.exchange import ToolRound
from llama_chat.chat.thinking import THINKING, ThinkingSplitter, Thought
from llama_chat.engine.generation import GenerationStats, Piece
from llama_chat.text.tool_calls import CallSyntax


@dataclass(frozen=True)
class Text:
    """The answer's text as it streams (the whole reply's, thinking included, where the
    thinking is not split off)."""

    text: str


@dataclass(frozen=True)
class Thinking:
    """A reasoning model's thinking as it streams, its markers left out."""

    text: str


@dataclass(frozen=True)
class ThoughtDone:
    """The thinking is over (the answer starts, or the round ended within it)."""

    thought: Thought


@dataclass(frozen=True)
class ToolCalls:
    """The round wrote calls: the turn runs them next, through the tool runner it was given."""

    tool_round: ToolRound


@dataclass(frozen=True)
class Done:
    """The reply is over: its statistics, what to say of it, and the calls it made."""

    stats: GenerationStats
    notes: list[str] = field(default_factory=list)
    calls_made: int = 0
    tool_seconds: float = 0.0


Event = Text | Thinking | ThoughtDone | ToolCalls | Done


class RoundText:
    """A round's pieces in, its events out. `opened`: the prompt opened the thinking; with
    `split` off the thinking stays in the text, markers and all."""

    def __init__(self, syntax: CallSyntax | None, opened: bool, split: bool = True) -> None:
        self.calls = CallText(syntax) if syntax is not None else None
        self.splitter = ThinkingSplitter(opened) if split else None
        self.folded = False  # ThoughtDone given
        self.ended = False

    def feed(self, piece: Piece) -> list[Event]:
        text = piece.text if self.calls is None else self.calls.feed(piece.text)
        if self.splitter is None:
            return [Text(text)] if text else []
        return self._events(self.splitter.feed(Piece(piece.token_id, text)))

    def end(self) -> list[Event]:
        """What was held back, and the thinking's end, once the round is over."""
        if self.ended:
            return []
        self.ended = True
        held = "" if self.calls is None else self.calls.flush()
        if self.splitter is None:
            return [Text(held)] if held else []
        events = self._events(self.splitter.feed(Piece(None, held)) + self.splitter.finish())
        return events + self._thought_done()

    def _events(self, parts: list[tuple[str, str]]) -> list[Event]:
        events: list[Event] = []
        for part, text in parts:
            if part == THINKING:
                events.append(Thinking(text))
            else:
                events += self._thought_done() + [Text(text)]
        return events

    def _thought_done(self) -> list[Event]:
        thought = self.splitter.thought
        if thought is None or self.folded:
            return []
        self.folded = True
        return [ThoughtDone(thought)]
