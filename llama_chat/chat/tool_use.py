"""Tools in a chat: the toolbox, the consent given so far (its names given ahead settled
once every server has listed its tools), and the session's offer kept in step with the
tools that are on (a server that becomes ready mid-chat, /tools on NAME).

A tool whose arguments' schema the grammar engine cannot hold calls to is not offered, and
a line says why: every call the model writes must parse and fit its schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llama_chat.chat.consent import Consent
from llama_chat.chat.session import Session
from llama_chat.chat.tool_offer import MAX_CALLS
from llama_chat.chat.tool_runner import CallView, ToolRunner
from llama_chat.engine.constraint import AnswerFormat, FormatError
from llama_chat.text.tool_calls import call_grammar
from llama_chat.text.tools_format import call_syntax_of
from llama_chat.tools.tool import BUILT_IN, Tool, ToolSpec
from llama_chat.tools.toolbox import ToolBox

if TYPE_CHECKING:
    from llama_chat.tools.folders import Folders


class ToolUse:
    """The tools of one chat (`folders`: where its file tools may go, if it has them)."""

    def __init__(self, toolbox: ToolBox, consent: Consent | None = None, max_calls: int = MAX_CALLS,
                 folders: Folders | None = None, required: bool = False) -> None:
        self.toolbox = toolbox
        self.consent = consent or Consent()
        self.max_calls = max_calls
        self.folders = folders
        self.required = required  # each turn opens with a call
        self._usable: dict[tuple[str, str], bool] = {}  # (tool name, its schema's text): can be held

    def sync(self, session: Session) -> list[str]:
        """Offer the session the tools on now; lines worth showing (servers' events, tools
        left out) are returned."""
        notes = self.toolbox.notices()
        starting = self._starting()
        if not starting:
            notes += self.consent.settle(self.toolbox.listed())
        missing = self.toolbox.missing()
        if missing and not starting:
            notes.append(f"there is no tool named {', '.join(missing)} (/tools lists the tools)")
            self.toolbox.on.difference_update(missing)
        specs = []
        for tool in self.toolbox.offered():
            refusal = self._refusal(tool.spec, session)
            if refusal is None:
                specs.append(tool.spec)
            elif refusal:
                notes.append(refusal)
        offer = session.offer
        wanted = (specs, self.max_calls, self.required)
        offered = (list(offer.tools), offer.max_calls, offer.required) if offer is not None else None
        if offered != wanted and (specs or offer is not None):
            session.set_tools(*wanted)
        return notes

    def _starting(self) -> bool:
        servers = self.toolbox.servers
        return servers is not None and any(status.state == "starting" for status in servers.status())

    def _refusal(self, spec: ToolSpec, session: Session) -> str | None:
        """Why the tool cannot be offered ("" where that was said before); None where it can."""
        key = (spec.name, repr(spec.parameters))
        if key in self._usable:
            return None if self._usable[key] else ""
        tokenizer = session.model.tokenizer
        grammar = call_grammar(call_syntax_of(session.model.chat_format), [spec], tokenizer)
        try:
            AnswerFormat("grammar", grammar).check(tokenizer)
        except FormatError as error:
            self._usable[key] = False
            reason = str(error).partition("(")[2].rpartition(")")[0] or str(error)
            source = "" if spec.source == BUILT_IN else f" of MCP server {spec.source}"
            return f"tool {spec.name}{source} is not offered: its arguments' schema cannot be held ({reason})"
        self._usable[key] = True
        return None

    def runner(self, session: Session, view: CallView) -> ToolRunner:
        """Runs a round of calls against the tools the model was offered."""
        def offered() -> Mapping[str, Tool]:
            names = set(session.offered_names())
            return {name: tool for name, tool in self.toolbox.by_name().items() if name in names}

        return ToolRunner(offered, self.consent, view)

    def close(self) -> None:
        self.toolbox.close()
