"""Which tools may run without asking: those allowed ahead (--allow-tools) and those the user
allowed always as the chat goes.

Consent is held by a tool's full name (ToolSpec.qualified_name: SERVER__NAME for an MCP
server's tool), which no other tool can come to have; never by a name that a server becoming
ready later could take. A name given ahead may also be a tool's own name: it stands for that
tool once every server has listed its tools (settle), and where two sources list it, it is
refused in one line naming the full names, and allows neither.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from llama_chat.tools.tool import ToolSpec

ALL = "all"  # in --allow-tools: every tool


@dataclass
class Consent:
    """The names allowed ahead (full names, own names until settled, or ALL) and the full
    names of the tools the user allowed always."""

    ahead: frozenset[str] = frozenset()
    always: set[str] = field(default_factory=set)
    settled: bool = False  # the own names given ahead are known to stand for one tool each

    def allowed(self, spec: ToolSpec) -> bool:
        name = spec.qualified_name
        return ALL in self.ahead or name in self.ahead or name in self.always

    def allow_always(self, spec: ToolSpec) -> None:
        self.always.add(spec.qualified_name)

    def settle(self, listed: Mapping[str, Sequence[str]]) -> list[str]:
        """Once every tool is known (`listed`: each own name, with the full names of the tools
        that have it), each own name given ahead stands for its one tool's full name; a name
        two tools have allows neither. One line for each such name."""
        if self.settled:
            return []
        full_names = {name for names in listed.values() for name in names}
        kept, refused = set(), []
        for name in sorted(self.ahead):
            shared = listed.get(name, ())
            if name == ALL or name in full_names or not shared:
                kept.add(name)  # a full name, or a name no tool has (it allows nothing)
            elif len(shared) == 1:
                kept.add(shared[0])
            else:
                refused.append(f"--allow-tools {name}: {len(shared)} tools are called that ({', '.join(shared)}); "
                               "none of them runs without asking: allow one by its full name")
        self.ahead, self.settled = frozenset(kept), True
        return refused


def allowed_ahead(names: Collection[str]) -> frozenset[str]:
    """--allow-tools' names as a set (ALL among them allows every tool)."""
    return frozenset(name.strip() for name in names if name.strip())
