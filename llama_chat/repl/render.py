"""What the chat shows, through rich: streamed replies, notes, errors, statistics.

Model output is literal: pieces are written with markup and emoji codes off and control
characters escaped by `chat.display.visible`, so "[bold]" or an escape sequence in a reply is shown as
those characters. Styles (dim notes, red errors, Markdown) are used only when the console
is a terminal and NO_COLOR is not set; otherwise everything is plain text.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from llama_chat.chat.display import stats_line, visible
from llama_chat.engine.generation import Piece

if TYPE_CHECKING:
    from llama_chat.chat.session import Turn


class Renderer:
    """Writes the chat to a rich Console (stdout by default)."""

    def __init__(self, console: Console | None = None, *, markdown: bool = False) -> None:
        self.console = console or Console(highlight=False)
        self.markdown = markdown  # render finished replies as Markdown

    @property
    def styled(self) -> bool:
        return self.console.is_terminal and not self.console.no_color and not os.environ.get("NO_COLOR")

    def line(self, text: str, style: str = "") -> None:
        """A line of text shown as it is (never parsed as markup)."""
        self.console.print(Text(visible(text), style=style if self.styled else ""), soft_wrap=True)

    def note(self, text: str) -> None:
        self.line(text, "dim")

    def error(self, text: str) -> None:
        self.line(text, "red")

    def play(self, turn: Turn) -> None:
        """Stream a reply; Ctrl-C stops it (the partial reply stays); then the stats line."""
        if turn.dropped:
            plural = "s" if turn.dropped > 1 else ""
            self.note(f"context full: dropped the {turn.dropped} oldest exchange{plural} to make room")
        try:
            if self.markdown and self.styled:
                self._stream_markdown(turn)
            else:
                self._stream_text(turn)
        except KeyboardInterrupt:
            pass  # the turn has recorded what there is, marked interrupted
        finally:
            self._end_line(turn.text)
        self.note(stats_line(turn.stats))

    def _stream_text(self, turn: Turn) -> None:
        def show(piece: Piece) -> None:
            if piece.text:
                self.console.out(visible(piece.text), end="", highlight=False)

        turn.run(show)

    def _stream_markdown(self, turn: Turn) -> None:
        # Live redraws the Markdown as it grows (cropped to the screen while streaming) and
        # prints it in full when it stops. It parses the reply only when it redraws, 8 times
        # a second, not after every token: parsing grows with the reply's length.
        with Live(console=self.console, refresh_per_second=8, vertical_overflow="ellipsis",
                  get_renderable=lambda: Markdown(visible(turn.text))):
            turn.run()

    def _end_line(self, text: str) -> None:
        if not (self.markdown and self.styled) and not text.endswith("\n"):
            self.console.out("", highlight=False)
