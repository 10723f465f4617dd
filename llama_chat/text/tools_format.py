"""A chat format with tools offered: the conversation, its calls and their results rendered as
the model's family expects them (see tool_calls).

The conversation's messages carry calls and results the way chat templates take them: an
assistant message with "tool_calls", then a "tool" message per result. A template that
takes tools gets them so, and the tools through its `tools` variable (Phi-4-mini's reads them
as JSON text in the system message). Any other format gets the tools described at the end of
the system prompt, each call written into its assistant message as the model wrote it, and
the results of a round in one user message of `<tool_response>` blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llama_chat.text.chat_format import TOOL_ROLE, ChatFormat, Message
from llama_chat.text.template_format import TemplateFormat
from llama_chat.text.tool_calls import (
    DESCRIBED,
    CallSyntax,
    ToolCall,
    call_syntax_for,
    described_tools,
    tool_declarations,
)
from llama_chat.tools.tool import ToolSpec


def call_syntax_of(chat_format: ChatFormat) -> CallSyntax:
    """The family a chat format's model writes calls in: its template's, else described."""
    if isinstance(chat_format, TemplateFormat):
        return call_syntax_for(chat_format.runner.source, chat_format.tokenizer)
    return DESCRIBED


def response_text(results: Sequence[str]) -> str:
    """Results as a described model reads them: a <tool_response> block each."""
    return "\n".join(f"<tool_response>\n{text}\n</tool_response>" for text in results)


class ToolsFormat(ChatFormat):
    """`base` with `tools` offered, calls written as `syntax` says."""

    def __init__(self, base: ChatFormat, tools: Sequence[ToolSpec], syntax: CallSyntax | None = None) -> None:
        self.base = base
        self.tools = tuple(tools)
        self.syntax = syntax or call_syntax_of(base)
        self.name = base.name
        self.tokenizer = base.tokenizer
        self.turn_end_ids = base.turn_end_ids

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        if not self.syntax.native:
            return self.base.encode(self._described(messages), add_generation_prompt)
        assert isinstance(self.base, TemplateFormat), "only a template takes tools"
        if self.syntax.tools_in_system:
            return self.base.encode(self._tools_in_system(messages), add_generation_prompt)
        return self.base.encode(messages, add_generation_prompt, tools=tool_declarations(self.tools))

    def _tools_in_system(self, messages: Sequence[Message]) -> list[Message]:
        listed = json.dumps([{"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}
                             for tool in self.tools], ensure_ascii=False)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "tools": listed}, *messages[1:]]
        return [{"role": "system", "content": "", "tools": listed}, *messages]

    def _described(self, messages: Sequence[Message]) -> list[Message]:
        """The messages as a format without tools takes them (see the module docstring)."""
        description = described_tools(self.tools)
        shown: list[Message] = []
        if messages and messages[0]["role"] == "system":
            shown.append({"role": "system", "content": f"{messages[0]['content']}\n\n{description}"})
            messages = messages[1:]
        else:
            shown.append({"role": "system", "content": description})
        results: list[str] = []
        for message in messages:
            if message["role"] == TOOL_ROLE:
                results.append(message["content"])
                continue
            if results:
                shown.append({"role": "user", "content": response_text(results)})
                results = []
            shown.append(self._plain(message))
        if results:
            shown.append({"role": "user", "content": response_text(results)})
        return shown

    def _plain(self, message: Message) -> dict[str, Any]:
        """A message with its calls written into its text, as the model wrote them."""
        calls = message.get("tool_calls")
        if not calls:
            return {"role": message["role"], "content": message["content"]}
        written = self.syntax.call_text([
            ToolCall(call["function"]["name"], call["function"]["arguments"], call["id"]) for call in calls
        ])
        return {"role": message["role"], "content": message["content"] + written}
