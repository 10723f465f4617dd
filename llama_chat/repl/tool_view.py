"""Tool calls in the chat: each shown, asked about (yes once, always for this tool, no) and
its result shown, through the renderer; answers come from a prompt of their own.

The call's line is the last thing above the question, folded to a few rows (see
Renderer.tool_call), and shown again before the question is asked again: whatever was said
in between, the start of what will run is on screen when the user answers. `s` shows a
folded call whole."""

from __future__ import annotations

from collections.abc import Callable

from llama_chat.repl.call_line import call_line
from llama_chat.chat.exchange import CallResult
from llama_chat.chat.tool_runner import Answer
from llama_chat.repl.render import Renderer
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools.tool import Tool

ANSWERS = {"y": Answer.YES, "yes": Answer.YES, "a": Answer.ALWAYS, "always": Answer.ALWAYS,
           "n": Answer.NO, "no": Answer.NO}
SHOW = ("s", "show")


class ChatCallView:
    """Shows calls and results through `renderer`; asks through `ask_line` (a prompt that
    returns the line typed; EOFError for Ctrl-D, which answers no)."""

    def __init__(self, renderer: Renderer, ask_line: Callable[[str], str] | None) -> None:
        self.renderer = renderer
        self.ask_line = ask_line

    def show_call(self, call: ToolCall, tool: Tool, preview: str | None) -> None:
        self.renderer.tool_call(call, tool.spec, preview)

    def ask(self, call: ToolCall, tool: Tool) -> Answer | None:
        if self.ask_line is None:
            return None
        folded = call_line(call, tool.spec, self.renderer.call_cells).folded
        choices = f"y = yes, a = always for {call.name} in this chat, n = no" + (", s = show it whole" if folded else "")
        while True:
            try:
                typed = self.ask_line(f"run {call.name}? {choices}: ")
            except EOFError:
                return Answer.NO
            word = typed.strip().lower()
            answer = ANSWERS.get(word)
            if answer is not None:
                return answer
            if folded and word in SHOW:
                self.renderer.tool_call(call, tool.spec, whole=True)
            else:
                self.renderer.note(f"answer {'y, a, n or s' if folded else 'y, a or n'} (Ctrl-C stops the reply)")
            self.renderer.tool_call(call, tool.spec)

    def show_result(self, call: ToolCall, result: CallResult) -> None:
        self.renderer.tool_result(call, result)
