"""A reasoning model's thinking: the part of a reply between <think> and </think>.

Llama-architecture reasoning models (the DeepSeek-R1 distillations, for one) write their
thinking before the answer, inside the markers. Either the model writes the opening marker
itself, or its template ends the generation prompt with it (then the reply starts inside the
thinking). Front ends show the two parts differently; the session keeps the reply whole,
opening marker included, and the model's template decides what later turns see of it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from llama_chat.engine.generation import Piece
from llama_chat.text.chat_format import THINKING_CLOSE as CLOSE
from llama_chat.text.chat_format import THINKING_OPEN as OPEN
from llama_chat.text.held_prefix import HeldPrefix
from llama_chat.text.tokenizer import Tokenizer

THINKING, ANSWER = "thinking", "answer"  # the parts of a reply
# The splitter's other states: before it knows whether the reply thinks, and between the
# closing marker and the answer's first character.
_UNDECIDED, _ANSWER_START = "undecided", "answer-start"


def thinking_opened_by_prompt(tokenizer: Tokenizer, prompt: Sequence[int]) -> str:
    """The opening marker (with the whitespace after it) that ends this prompt, when the
    template's generation prompt opens the thinking itself; else ""."""
    tail = tokenizer.decode(list(prompt[-8:]))
    start = tail.rfind(OPEN)
    return tail[start:] if start >= 0 and not tail[start + len(OPEN):].strip() else ""


@dataclass
class Thought:
    """How long the thinking went on, for the line it folds into."""

    tokens: int = 0
    seconds: float = 0.0
    finished: bool = False  # the closing marker came

    def line(self) -> str:
        plural = "" if self.tokens == 1 else "s"
        unfinished = "" if self.finished else ", unfinished"
        return f"thought for {self.tokens} token{plural}, {self.seconds:.1f} s{unfinished}"


class ThinkingSplitter:
    """Splits a streamed reply into (part, text) pairs, part THINKING or ANSWER, markers and
    the whitespace around them left out. Text that may be the start of a marker waits for
    the next piece."""

    def __init__(self, opened: bool) -> None:
        self.state = THINKING if opened else _UNDECIDED
        self.start = ""  # the reply's start, until it is known whether it opens the thinking
        self.close = HeldPrefix([CLOSE])
        self.thinking = ""  # all of it so far, for front ends that redraw
        self.answer = ""
        self.thought: Thought | None = Thought() if opened else None
        self._tokens_before = 0  # tokens read before it was known whether thinking starts
        self._started: float | None = None
        self.ended = False  # the reply is over (finish() was called)

    def feed(self, piece: Piece) -> list[tuple[str, str]]:
        if self._started is None:
            self._started = time.perf_counter()
        counted = self.state in (THINKING, _UNDECIDED) and piece.token_id is not None
        parts = self._split(piece.text, final=False)
        if counted and self.thought is not None:
            self.thought.tokens += 1 + self._tokens_before
            self._tokens_before = 0
        elif counted and self.state == _UNDECIDED:
            self._tokens_before += 1
        return parts

    def finish(self) -> list[tuple[str, str]]:
        """What was held back, at the end of the reply."""
        self.ended = True
        return self._split("", final=True)

    def _split(self, text: str, final: bool) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        if self.state == _UNDECIDED:
            self.start += text
            start = self.start.lstrip()
            if not final and (not start or OPEN.startswith(start)):
                return parts  # "", "<", "<thi": not known yet
            if start.startswith(OPEN):
                self.state, text, self.thought = THINKING, start[len(OPEN):], Thought()
            else:
                self.state, text = ANSWER, self.start
        if self.state == THINKING:
            thinking, marker = self.close.feed(text)
            self._add(parts, THINKING, thinking + (self.close.release() if final and marker is None else ""))
            self._clock()
            if marker is None:
                return parts
            self.state, text = _ANSWER_START, self.close.release()
            self.thought.finished = True
        if self.state == _ANSWER_START:  # the blank lines after the closing marker go
            text = text.lstrip()
            if text or final:
                self.state = ANSWER
        if self.state == ANSWER:
            self._add(parts, ANSWER, text)
        return parts

    def _clock(self) -> None:
        self.thought.seconds = time.perf_counter() - (self._started or time.perf_counter())

    def _add(self, parts: list[tuple[str, str]], part: str, text: str) -> None:
        if part == THINKING and not self.thinking:
            text = text.lstrip()
        if text:
            parts.append((part, text))
            if part == THINKING:
                self.thinking += text
            else:
                self.answer += text


def answer_of(reply: str) -> str:
    """A whole reply's answer, its thinking left out (what a reader would copy)."""
    splitter = ThinkingSplitter(opened=False)
    splitter.feed(Piece(token_id=None, text=reply))
    splitter.finish()
    return splitter.answer
