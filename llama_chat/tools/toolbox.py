"""The tools a chat can offer: llama-chat's own, each off until the user turns it on, and the
tools of the MCP servers the user configured, on once their server is ready (the user can
turn each off). A list of names given up front (`only`) turns those on and every other off,
servers' tools that are not ready yet included. A tool is named by the name it is offered
by or by its full name (ToolSpec.qualified_name)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from llama_chat.errors import LlamaChatError
from llama_chat.tools.tool import BUILT_IN, Tool

if TYPE_CHECKING:  # the MCP SDK loads only where servers are configured
    from llama_chat.tools.mcp_servers import McpServers

ALL = "all"


class ToolBox:
    """Built-in tools and MCP servers, and which of their tools are on."""

    def __init__(self, built_in: Sequence[Tool] = (), servers: McpServers | None = None) -> None:
        self.built_in = {tool.spec.name: tool for tool in built_in}
        self.servers = servers
        self.on: set[str] = set()  # tools turned on (built-in ones are off until then)
        self.off: set[str] = set()  # tools turned off (servers' are on until then)
        self.servers_on = True  # a server's tool neither turned on nor off is on

    def only(self, names: Iterable[str]) -> None:
        """Offer these tools alone (they may belong to servers not ready yet)."""
        self.on, self.off, self.servers_on = set(names), set(), False

    def server_tools(self) -> list[Tool]:
        return self.servers.tools() if self.servers is not None else []

    def known(self) -> list[Tool]:
        """Every tool there is now, on or off."""
        return [*self.built_in.values(), *self.server_tools()]

    def offered(self) -> list[Tool]:
        """The tools the model is offered now."""
        return [tool for tool in self.known() if self.is_on(tool)]

    def by_name(self) -> dict[str, Tool]:
        return {tool.spec.name: tool for tool in self.offered()}

    def listed(self) -> dict[str, list[str]]:
        """Each tool's own name, with the full names of the tools that have it (every server's
        that has listed its tools, ready now or not)."""
        servers = self.servers.status() if self.servers is not None else []
        listed: dict[str, list[str]] = {}
        for tool in [*self.built_in.values(), *(tool for status in servers for tool in status.tools)]:
            listed.setdefault(tool.spec.listed_name or tool.spec.name, []).append(tool.spec.qualified_name)
        return listed

    def is_on(self, tool: Tool) -> bool:
        for name in (tool.spec.qualified_name, tool.spec.name):
            if name in self.on or name in self.off:
                return name in self.on
        return tool.spec.source != BUILT_IN and self.servers_on

    def missing(self) -> list[str]:
        """Names turned on that no tool has (a server that has not started, a misspelling)."""
        return sorted(name for name in self.on if name not in self._by_any_name())

    def switch(self, names: Iterable[str], on: bool) -> list[str]:
        """Turn these tools on or off (`all`: every tool there is); the names switched. A
        tool stays switched by its full name, whatever it is offered by later. A name that
        is no tool is refused (LlamaChatError, nothing changed)."""
        known = self._by_any_name()
        names = list(names)
        chosen = [tool.spec.name for tool in self.known()] if ALL in names else names
        unknown = [name for name in chosen if name not in known]
        if unknown:
            listed = ", ".join(tool.spec.name for tool in self.known()) or "none yet"
            raise LlamaChatError(f"there is no tool named {', '.join(unknown)}: the tools are {listed}")
        for name in chosen:
            switched = {name, known[name].spec.qualified_name}
            (self.on if on else self.off).add(known[name].spec.qualified_name)
            (self.off if on else self.on).difference_update(switched)
        return chosen

    def _by_any_name(self) -> dict[str, Tool]:
        """The tools there are now by the names they are offered by and by their full names."""
        return {name: tool for tool in self.known() for name in (tool.spec.name, tool.spec.qualified_name)}

    def notices(self) -> list[str]:
        """What the servers had to say since last asked (one line each)."""
        return self.servers.take_notices() if self.servers is not None else []

    def close(self) -> None:
        if self.servers is not None:
            self.servers.close()
