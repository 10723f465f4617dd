"""A round of tool calls run with the user's consent.

Nothing runs without a yes. A call to a tool that is not offered, or one its tool refuses
before asking (a path outside the allowed folders), is refused without asking. Otherwise
the user is asked (yes once, always for this tool in this chat, or no), unless the tool was
allowed ahead (`--allow-tools`) or always earlier in the chat (chat/consent); where nobody
can be asked (a reply for a script), the call is declined. The model hears every outcome as
its result.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from llama_chat.chat.consent import Consent
from llama_chat.chat.exchange import CallResult, Outcome, ToolRound
from llama_chat.chat.turn import NOT_ASKED
from llama_chat.errors import first_line
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools.tool import Tool

DECLINED = "the user declined to run this tool call"
PAST_THE_LIMIT = "this tool call was not run: the turn made its {limit} calls; answer with what you have"


class Answer(enum.StrEnum):
    YES = "yes"  # this call
    ALWAYS = "always"  # this tool, for the rest of the chat
    NO = "no"


class CallView(Protocol):
    """How a front end shows calls, asks about them, and shows what they gave."""

    def show_call(self, call: ToolCall, tool: Tool, preview: str | None) -> None: ...

    def ask(self, call: ToolCall, tool: Tool) -> Answer | None:
        """The user's answer; None where nobody can be asked."""

    def show_result(self, call: ToolCall, result: CallResult) -> None: ...


class ToolRunner:
    """Runs rounds of calls against the tools offered now (`tools`, by name)."""

    def __init__(self, tools: Callable[[], Mapping[str, Tool]], consent: Consent, view: CallView) -> None:
        self.tools = tools
        self.consent = consent
        self.view = view

    def __call__(self, tool_round: ToolRound, allowed: int, limit: int) -> None:
        """A result for each call of the round, in order, put as it comes (so that Ctrl-C
        keeps those already given); calls past the first `allowed` are over the turn's `limit`."""
        for number, call in enumerate(tool_round.calls):
            if number >= allowed:
                result = CallResult(PAST_THE_LIMIT.format(limit=limit), Outcome.LIMIT)
            else:
                result = self.run_call(call)
            tool_round.results.append(result)
            self.view.show_result(call, result)

    def run_call(self, call: ToolCall) -> CallResult:
        tools = self.tools()
        tool = tools.get(call.name)
        if tool is None:
            offered = ", ".join(sorted(tools)) or "none"
            return CallResult(f"there is no tool named {call.name} (offered: {offered})", Outcome.REFUSED)
        try:  # a check that raises (a file changed under it) fails the call, never the chat
            refusal = tool.refusal(call.arguments)
            preview = tool.preview(call.arguments) if refusal is None else None
        except KeyboardInterrupt:
            raise
        except Exception as error:  # noqa: BLE001 (a tool's own failure is the model's to hear of)
            return CallResult(f"the tool failed: {first_line(error)}", Outcome.FAILED)
        if refusal is not None:
            return CallResult(refusal, Outcome.REFUSED)
        self.view.show_call(call, tool, preview)
        if not self.consent.allowed(tool.spec):
            answer = self.view.ask(call, tool)
            if answer is None:
                return CallResult(NOT_ASKED, Outcome.DECLINED)
            if answer == Answer.NO:
                return CallResult(DECLINED, Outcome.DECLINED)
            if answer == Answer.ALWAYS:
                self.consent.allow_always(tool.spec)
        started = time.perf_counter()
        try:
            result = tool.run(call.arguments)
        except KeyboardInterrupt:
            raise
        except Exception as error:  # noqa: BLE001 (a tool's own failure is the model's to hear of)
            return CallResult(f"the tool failed: {first_line(error)}", Outcome.FAILED, time.perf_counter() - started)
        outcome = Outcome.FAILED if result.is_error else Outcome.RAN
        return CallResult(result.text, outcome, time.perf_counter() - started)
