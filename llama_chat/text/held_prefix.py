"""Streamed text held back while it may be the start of a marker (a stop string, the end of
a model's thinking, the opening of a tool call), so that a marker split over several pieces
is still found, and never half shown."""

from __future__ import annotations

from collections.abc import Iterable


def _partial(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker` (0 if none)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


class HeldPrefix:
    """Text pieces in; out, the text known to come before any of `markers`, and the first
    marker once it is whole. The text after that marker stays held (`release` gives it)."""

    def __init__(self, markers: Iterable[str]) -> None:
        self.markers = [marker for marker in markers if marker]
        self.held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """The text that is safe to pass on now, and the marker reached (None while none is)."""
        self.held += text
        found = [(start, marker) for marker in self.markers if (start := self.held.find(marker)) >= 0]
        if found:
            start, marker = min(found)
            before, self.held = self.held[:start], self.held[start + len(marker):]
            return before, marker
        cut = len(self.held) - max((_partial(self.held, marker) for marker in self.markers), default=0)
        before, self.held = self.held[:cut], self.held[cut:]
        return before, None

    def release(self) -> str:
        """All that is held (at the end of the stream, or after a marker)."""
        rest, self.held = self.held, ""
        return rest
