"""Slash commands for tools: /tools (what the model is offered, turning tools on and off,
results shown whole or folded, folders the file tools may use) and /mcp (the servers)."""

from __future__ import annotations

from llama_chat.chat.tool_use import ToolUse
from llama_chat.errors import LlamaChatError
from llama_chat.repl.chat_state import ChatState, CommandError
from llama_chat.text.tools_format import call_syntax_of

TOOLS_USAGE = "/tools takes on NAME...|all, off NAME...|all, choice auto|required, show, fold or folder PATH"


def run_tools(state: ChatState, text: str) -> None:
    tools = _tools_of(state)
    word, _, rest = text.partition(" ")
    names = rest.split()
    if word in ("on", "off") and names:
        try:
            switched = tools.toolbox.switch(names, on=word == "on")
        except LlamaChatError as error:
            raise CommandError(str(error)) from None
        state.renderer.note(f"{word}: {', '.join(switched) or 'no tools'}")
    elif word == "choice" and names in (["auto"], ["required"]):
        tools.required = names == ["required"]
        state.renderer.note("tool choice: " + ("each reply starts with a call" if tools.required else "auto"))
    elif word in ("show", "fold") and not names:
        state.renderer.show_results = word == "show"
        state.renderer.note("tool results: " + ("shown whole" if word == "show" else "folded to a few lines"))
    elif word == "folder" and rest.strip():
        if tools.folders is None:
            raise CommandError("the file tools are not available in this chat")
        try:
            added = tools.folders.add(rest.strip())
        except LlamaChatError as error:
            raise CommandError(str(error)) from None
        state.renderer.note(f"the file tools may use {added} too")
    elif word:
        raise CommandError(TOOLS_USAGE)
    else:
        for line in tools_listing(state):
            state.renderer.line(line)


def tools_listing(state: ChatState) -> list[str]:
    """Each tool, on or off, then how calls are written and what may run without asking."""
    tools = _tools_of(state)
    for note in tools.sync(state.session):
        state.renderer.note(note)
    offered = set(state.session.offered_names())
    lines = []
    for tool in tools.toolbox.known():
        mark = "on " if tool.spec.name in offered else "off"
        first = (tool.spec.description.strip().splitlines() or [""])[0]
        lines.append(f"{mark} {tool.spec.name} ({tool.spec.source}): {first}")
    if not lines:
        lines.append("no tools: start llama-chat with --tools, or configure MCP servers (--mcp-config)")
    syntax = call_syntax_of(state.session.model.chat_format)
    how = "the model's template" if syntax.native else "described in the system prompt"
    choice = "each reply starts with a call" if tools.required else "the model calls when it chooses"
    lines.append(f"calls written as {syntax.name} ({how}); at most {tools.max_calls} a turn; {choice}")
    if state.session.format is not None:
        lines.append("no tools are offered while /format holds replies (/format off)")
    allowed = sorted(tools.consent.ahead | tools.consent.always)
    lines.append("run without asking: " + (", ".join(allowed) if allowed else "none (each call is asked about)"))
    if tools.folders is not None:
        lines.append("file tools may use: " + ", ".join(str(folder) for folder in tools.folders.all))
    return lines


def run_mcp(state: ChatState, text: str) -> None:
    tools = _tools_of(state)
    servers = tools.toolbox.servers
    if servers is None:
        state.renderer.line("no MCP servers: configure them in a JSON file (--mcp-config FILE, or the default file)")
        return
    for note in tools.toolbox.notices():
        state.renderer.note(note)
    for status in servers.status():
        state.renderer.line(f"{status.name}: {status.state} ({status.detail})")
        for tool in status.tools:
            state.renderer.line(f"  {tool.spec.name}: {(tool.spec.description.strip().splitlines() or [''])[0]}")


def _tools_of(state: ChatState) -> ToolUse:
    if state.tools is None:
        raise CommandError("this chat has no tools")
    return state.tools
