"""What the chat shows, through rich: a reply's events (chat/events) as they come, notes,
errors, statistics. The turn streams and runs its calls; the renderer only shows.

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
from contextlib import closing
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from llama_chat.chat import events
from llama_chat.chat.display import literal, stats_line, visible
from llama_chat.chat.events import Done, Event
from llama_chat.chat.exchange import CallResult, Outcome
from llama_chat.chat.thinking import Thought
from llama_chat.repl.call_line import call_line
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools.tool import ToolSpec

if TYPE_CHECKING:
    from llama_chat.chat.turn import RunCalls, Turn

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

    def play(self, turn: Turn, tools: RunCalls | None = None) -> None:
        """Stream a reply, its rounds of calls run by `tools`; Ctrl-C stops it (the partial
        reply stays); then the notes and the stats line."""
        if turn.compacted:
            count, before, after = turn.compacted
            self.note(f"context full: compacted the {count} oldest exchange{'s' * (count != 1)} into a summary "
                      f"({before} → {after} tokens)")
        if turn.dropped:
            plural = "s" if turn.dropped > 1 else ""
            self.note(f"context full: dropped the {turn.dropped} oldest exchange{plural} to make room")
        reply = _MarkdownReply(self) if self.markdown and self.styled and turn.offer is None else _TextReply(self)
        done = None
        try:
            with closing(turn.events(tools)) as stream:
                for event in stream:
                    reply.show(event)
                    if isinstance(event, Done):
                        done = event
        except KeyboardInterrupt:
            pass  # the turn has recorded what there is, marked interrupted
        finally:
            reply.close()
        done = done or turn.done  # stopped while its calls ran, or while the reply was drawn
        for note in done.notes:
            self.note(note)
        self.note(stats_line(done.stats, done.calls_made, done.tool_seconds))

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

    def end_line(self, text: str) -> None:
        if not text.endswith("\n"):
            self.console.out("", highlight=False)


class _TextReply:
    """A reply's rounds on a plain stream: each round's text, its thinking drawn as
    _ThinkingLines says, the line ended when the round ends (before the chat asks about its
    calls; an empty one too where the round wrote nothing)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self._start()

    def _start(self) -> None:
        self.answer = ""
        self.thinking = _ThinkingLines(self.renderer)
        self.ended = False

    def show(self, event: Event) -> None:
        if self.ended:  # the next round
            self._start()
        if isinstance(event, events.Text):
            self.answer += event.text
            self.renderer.console.out(visible(event.text), end="", highlight=False)
        elif isinstance(event, events.Thinking):
            self.thinking.add(event.text)
        elif isinstance(event, events.ThoughtDone):
            self.thinking.fold(event.thought)
        else:  # ToolCalls, Done
            self.close()

    def close(self) -> None:
        """The round is over (once)."""
        if self.ended:
            return
        self.ended = True
        self.thinking.close()
        if self.answer or not self.thinking.folded:
            self.renderer.end_line(self.answer)


class _ThinkingLines:
    """A reply's thinking on a plain stream: kept on screen in dim text (show), or drawn
    dim while it streams and erased (fold, on a terminal; elsewhere it is not drawn); then
    one line saying how long it took."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.text = ""
        self.live: Live | None = None
        self.folded = False

    def add(self, text: str) -> None:
        renderer = self.renderer
        self.text += text
        if renderer.show_thinking:
            renderer.console.out(visible(text), end="", style="dim" if renderer.styled else None, highlight=False)
        elif renderer.styled and self.live is None:
            self.live = Live(console=renderer.console, refresh_per_second=8, transient=True,
                             get_renderable=lambda: thinking_tail(renderer.console, self.text))
            self.live.start()

    def fold(self, thought: Thought) -> None:
        """End the thinking: erase it unless shown, then the line it folds into."""
        self.folded = True
        if self.live is not None:
            self.close()
        elif self.renderer.show_thinking and not self.text.endswith("\n"):
            self.renderer.console.out("", highlight=False)
        self.renderer.note(thought.line())

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


class _MarkdownReply:
    """A reply drawn as Markdown while it streams: Live redraws it as it grows (cropped to the
    screen while streaming) and prints it in full when it stops. It parses the reply only when
    it redraws, 8 times a second, not after every token: parsing grows with the reply's length."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.thinking = ""
        self.answer = ""
        self.thought: Thought | None = None
        self.live = Live(console=renderer.console, refresh_per_second=8, vertical_overflow="ellipsis",
                         get_renderable=self._view)
        self.live.start()

    def show(self, event: Event) -> None:
        if isinstance(event, events.Text):
            self.answer += event.text
        elif isinstance(event, events.Thinking):
            self.thinking += event.text
        elif isinstance(event, events.ThoughtDone):
            self.thought = event.thought

    def close(self) -> None:
        self.live.stop()

    def _view(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.thinking or self.thought is not None:
            if self.renderer.show_thinking:
                parts.append(Text(visible(self.thinking), style="dim"))
            elif self.thought is None:
                parts.append(thinking_tail(self.renderer.console, self.thinking))
            if self.thought is not None:
                parts.append(Text(self.thought.line(), style="dim"))
        return Group(*parts, Markdown(visible(self.answer)))


def thinking_tail(console: Console, thinking: str) -> Text:
    """The end of the thinking, as many lines as the screen has room for, dim."""
    rows = max(console.height - 2, 1)
    text = Text(visible(thinking[-rows * console.width:]).strip(), style="dim")
    lines = text.wrap(console, console.width)
    return Text("\n").join(lines[-rows:])
