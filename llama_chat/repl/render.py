"""What the chat shows, through rich: streamed replies, notes, errors, statistics.

Model output is literal: pieces are written with markup and emoji codes off and control
characters escaped by `chat.display.visible`, so "[bold]" or an escape sequence in a reply is shown as
those characters. Styles (dim notes, red errors, Markdown) are used only when the console
is a terminal and NO_COLOR is not set; otherwise everything is plain text.

A reasoning model's thinking (chat.thinking) is drawn dim while it streams and folded to
one line ("thought for 212 tokens, 9.8 s") when the answer starts; /think show keeps it.
Where the output cannot be redrawn (not a terminal) folded thinking is not drawn at all.

With tools offered, the calls a reply writes are left out of its text as it streams (see
chat/call_text); each call is shown on a line of its own, asked about, and its result
folded to a few lines (/tools show keeps results whole). Such replies stream as text, not
Markdown, as the chat stops mid-reply to ask. A call's line (repl/call_line) escapes what
does not print and keeps to a few rows, so its start is on screen when the question is asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from llama_chat.repl.call_line import call_line
from llama_chat.chat.call_text import CallText
from llama_chat.chat.display import literal, stats_line, visible
from llama_chat.chat.exchange import CallResult, Outcome, ToolRound
from llama_chat.chat.thinking import THINKING, ThinkingSplitter
from llama_chat.engine.generation import Piece
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools.tool import ToolSpec

if TYPE_CHECKING:
    from llama_chat.chat.turn import Turn

OnCalls = Callable[[ToolRound, int, int], None]
FOLDED_LINES = 3  # the lines of a tool's result shown unless /tools show
CALL_ROWS = 6  # a call's line at most, with room below for the question on a screen of 24


class Renderer:
    """Writes the chat to a rich Console (stdout by default)."""

    def __init__(self, console: Console | None = None, *, markdown: bool = False,
                 show_thinking: bool = False, show_results: bool = False) -> None:
        self.console = console or Console(highlight=False)
        self.markdown = markdown  # render finished replies as Markdown
        self.show_thinking = show_thinking  # a reasoning model's thinking kept on screen, or folded
        self.show_results = show_results  # tools' results shown whole, or folded to a few lines

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

    def send_to_terminal(self, sequence: str) -> bool:
        """Write an escape sequence for the terminal itself; False where the output is no terminal."""
        if not self.console.is_terminal:
            return False
        self.console.file.write(sequence)
        self.console.file.flush()
        return True

    def play(self, turn: Turn, on_calls: OnCalls | None = None) -> None:
        """Stream a reply (its rounds of tool calls through `on_calls`); Ctrl-C stops it (the
        partial reply stays); then the notes and the stats line."""
        if turn.dropped:
            plural = "s" if turn.dropped > 1 else ""
            self.note(f"context full: dropped the {turn.dropped} oldest exchange{plural} to make room")
        reply = ThinkingSplitter(opened=bool(turn.thinking_cue))
        try:
            if self.markdown and self.styled and turn.offer is None:
                self._stream_markdown(turn, reply)
            else:
                self._stream_text(turn, reply, on_calls)
        except KeyboardInterrupt:
            pass  # the turn has recorded what there is, marked interrupted
        for note in turn.notes:
            self.note(note)
        self.note(stats_line(turn.stats, turn.calls_made, turn.tool_seconds))

    def _stream_text(self, turn: Turn, reply: ThinkingSplitter, on_calls: OnCalls | None) -> None:
        stream = _TextStream(self, reply, CallText(turn.offer.syntax) if turn.offer is not None else None)

        def calls(tool_round: ToolRound, allowed: int, limit: int) -> None:
            stream.end(before_calls=True)
            if on_calls is not None:
                on_calls(tool_round, allowed, limit)
            stream.next_round()

        try:
            turn.run(stream.feed, calls)
        finally:
            stream.end()

    def tool_call(self, call: ToolCall, spec: ToolSpec, preview: str | None = None, whole: bool = False) -> None:
        """A call about to be asked about or run: what it would change (`preview`), then its
        tool, where the tool is from and its arguments, folded to CALL_ROWS rows unless
        `whole`, so that a question asked below it has the call's start on screen."""
        if preview:
            self.line(literal(preview, keep="\n\t"))
        self.line(f"⚙ {call_line(call, spec, None if whole else self.call_cells).text}", "bold")

    @property
    def call_cells(self) -> int:
        """The room a call's line has on the screen (see tool_call)."""
        return max(self.console.width * CALL_ROWS - 2, 1)

    def tool_result(self, call: ToolCall, result: CallResult) -> None:
        """What a call gave, folded to a few lines unless results are shown whole."""
        took = f" in {result.seconds:.1f} s" if result.outcome in (Outcome.RAN, Outcome.FAILED) else ""
        lines = result.text.splitlines() or [""]
        shown = lines if self.show_results else lines[:FOLDED_LINES]
        folded = len(lines) - len(shown)
        self.note(f"→ {call.name}: {result.outcome}{took}")
        for line in shown:
            self.line(f"  {line}", "dim")
        if folded:
            self.note(f"  … {folded} more line{'s' * (folded != 1)} (/tools show keeps results whole)")

    def _stream_markdown(self, turn: Turn, reply: ThinkingSplitter) -> None:
        # Live redraws the Markdown as it grows (cropped to the screen while streaming) and
        # prints it in full when it stops. It parses the reply only when it redraws, 8 times
        # a second, not after every token: parsing grows with the reply's length.
        def view() -> RenderableType:
            parts: list[RenderableType] = []
            thought = reply.thought
            if thought is not None:
                folded = thought.finished or reply.ended
                if self.show_thinking:
                    parts.append(Text(visible(reply.thinking), style="dim"))
                elif not folded:
                    parts.append(thinking_tail(self.console, reply.thinking))
                if folded:
                    parts.append(Text(thought.line(), style="dim"))
            return Group(*parts, Markdown(visible(reply.answer)))

        with Live(console=self.console, refresh_per_second=8, vertical_overflow="ellipsis", get_renderable=view):
            try:
                turn.run(reply.feed)
            finally:
                reply.finish()

    def end_line(self, text: str) -> None:
        if not text.endswith("\n"):
            self.console.out("", highlight=False)


class _TextStream:
    """A reply's rounds on a plain stream: each round's text without its calls, its thinking
    drawn as _ThinkingLines says, a line ended before the chat asks about calls."""

    def __init__(self, renderer: Renderer, reply: ThinkingSplitter, calls: CallText | None) -> None:
        self.renderer = renderer
        self.calls = calls
        self._start(reply)

    def _start(self, reply: ThinkingSplitter) -> None:
        self.reply = reply
        self.thinking = _ThinkingLines(self.renderer, reply)
        self.ended = False

    def feed(self, piece: Piece) -> None:
        if self.calls is not None:
            piece = Piece(piece.token_id, self.calls.feed(piece.text))
        self._show(self.reply.feed(piece))

    def end(self, before_calls: bool = False) -> None:
        """The round's text is over: what was held back, the thinking folded, the line ended
        (an empty one too, unless the calls' lines follow)."""
        if self.ended:
            return
        self.ended = True
        if self.calls is not None:
            self._show(self.reply.feed(Piece(None, self.calls.flush())))
        reply = self.reply
        self._show(reply.finish())
        self.thinking.fold()
        if reply.answer or reply.thought is None:
            self.renderer.end_line(reply.answer)

    def next_round(self) -> None:
        if self.calls is not None:
            self.calls.reset()
        self._start(ThinkingSplitter(opened=False))

    def _show(self, parts: list[tuple[str, str]]) -> None:
        for part, text in parts:
            if part == THINKING:
                self.thinking.add(text)
            else:
                self.thinking.fold()
                self.renderer.console.out(visible(text), end="", highlight=False)


class _ThinkingLines:
    """A reply's thinking on a plain stream: kept on screen in dim text (show), or drawn
    dim while it streams and erased (fold, on a terminal; elsewhere it is not drawn); then
    one line saying how long it took."""

    def __init__(self, renderer: Renderer, reply: ThinkingSplitter) -> None:
        self.renderer = renderer
        self.reply = reply
        self.live: Live | None = None
        self.folded = False

    def add(self, text: str) -> None:
        renderer = self.renderer
        if renderer.show_thinking:
            renderer.console.out(visible(text), end="", style="dim" if renderer.styled else None, highlight=False)
        elif renderer.styled and self.live is None:
            self.live = Live(console=renderer.console, refresh_per_second=8, transient=True,
                             get_renderable=lambda: thinking_tail(renderer.console, self.reply.thinking))
            self.live.start()

    def fold(self) -> None:
        """End the thinking (once): erase it unless shown, then the line it folds into."""
        thought = self.reply.thought
        if thought is None or self.folded:
            return
        self.folded = True
        if self.live is not None:
            self.live.stop()
        elif self.renderer.show_thinking and not self.reply.thinking.endswith("\n"):
            self.renderer.console.out("", highlight=False)
        self.renderer.note(thought.line())


def thinking_tail(console: Console, thinking: str) -> Text:
    """The end of the thinking, as many lines as the screen has room for, dim."""
    rows = max(console.height - 2, 1)
    text = Text(visible(thinking[-rows * console.width:]).strip(), style="dim")
    lines = text.wrap(console, console.width)
    return Text("\n").join(lines[-rows:])
