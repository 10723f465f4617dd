"""One exchange of a conversation: a user message and the reply, with the token ids each added,
the tools the reply called on its way (see tool_rounds) and the other versions of the
conversation in its place (see branches)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llama_chat.text.tool_calls import ToolCall


class Outcome(enum.StrEnum):
    """What became of a tool call; the words people are shown."""

    RAN = "ran"
    FAILED = "failed"  # it ran and reported an error
    REFUSED = "refused"  # refused before anyone was asked (a path outside the folders, an unknown tool)
    DECLINED = "declined"  # the user said no (or nobody could be asked)
    CANCELLED = "cancelled"  # Ctrl-C while it ran
    LIMIT = "limit"  # past the calls a turn may make


@dataclass(frozen=True)
class CallResult:
    """What a call gave the model, as text, and how it went."""

    text: str
    outcome: Outcome = Outcome.RAN
    seconds: float = field(default=0.0, compare=False)  # how long it ran (not saved)


@dataclass
class ToolRound:
    """A part of a reply that called tools: what the model wrote before its calls, the calls,
    and a result each."""

    text: str
    calls: list[ToolCall]
    results: list[CallResult] = field(default_factory=list)


@dataclass
class Exchange:
    """A user message and the reply to it, with the token ids each added to the conversation."""

    user: str
    reply: str = ""
    interrupted: bool = False
    user_ids: list[int] | None = None  # the user turn and the assistant's cue; None: not known
    reply_ids: list[int] | None = None  # the reply as generated (calls and results too), then the end-of-turn ids
    # The rounds of tool calls before the reply, in order.
    rounds: list[ToolRound] = field(default_factory=list)
    # Other versions of the conversation from here on (/retry, /edit made them), each a list
    # of exchanges starting in this one's place; this one is version `version` among them.
    others: list[list[Exchange]] = field(default_factory=list)
    version: int = 0  # from 0: the versions are others[:version], this one, others[version:]
