"""What every tool is, wherever it comes from (llama-chat's own file and shell tools, or an
MCP server's): a spec the model is shown, checks made before the user is asked, and a run.

A run blocks until the tool is done. Ctrl-C arrives in the calling thread as
KeyboardInterrupt while `run` blocks; a tool then stops its work (a process killed, a
request cancelled) before letting it through, so that nothing it started goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

BUILT_IN = "built-in"  # the source of llama-chat's own tools; an MCP tool's is its server's name


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is shown it: its name, what it does and its arguments' JSON Schema
    (an object schema), with where it comes from. An MCP server's tool may be shown by its
    full name (see qualified_name) where another has its own name; `listed_name` keeps that."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    source: str = BUILT_IN
    listed_name: str = ""  # the tool's own name, where `name` is another ("": `name`)

    @property
    def qualified_name(self) -> str:
        """The name no other tool can have, whatever else is offered: llama-chat's own tools'
        names, SERVER__NAME for an MCP server's (server names hold no "__" and end in no "_")."""
        own = self.listed_name or self.name
        return own if self.source == BUILT_IN else f"{self.source}__{own}"


@dataclass(frozen=True)
class ToolResult:
    """What a run gave, as text for the model; `is_error` when the tool failed or refused."""

    text: str
    is_error: bool = False


@runtime_checkable
class Tool(Protocol):
    spec: ToolSpec

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        """Why this call is refused before anyone is asked (a path outside the folders the
        tools may use, say), in one line; None where it may be asked for."""

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        """What the user should see before saying yes, beyond the arguments (the diff a
        write would make); None where the arguments say it all."""

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Do it (see the module docstring for Ctrl-C). Failures the model should hear of
        are results with is_error set, not exceptions."""
