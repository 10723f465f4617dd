"""One exchange of a conversation: a user message and the reply, the tools the reply called
on its way and the other versions of the conversation in its place (see branches), as text
and as the messages a chat format renders. Their token ids are the transcript's."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from llama_chat.text.chat_format import TOOL_ROLE
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
    """A user message and the reply to it."""

    user: str
    reply: str = ""
    interrupted: bool = False
    # The rounds of tool calls before the reply, in order.
    rounds: list[ToolRound] = field(default_factory=list)
    # Other versions of the conversation from here on (/retry, /edit made them), each a list
    # of exchanges starting in this one's place; this one is version `version` among them.
    others: list[list[Exchange]] = field(default_factory=list)
    version: int = 0  # from 0: the versions are others[:version], this one, others[version:]


def user_message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant_message(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def round_messages(tool_round: ToolRound) -> list[dict]:
    """A round of calls as chat templates take it: the assistant's message with its calls,
    then a tool message for each result (as far as there are results)."""
    calls = {"role": "assistant", "content": tool_round.text,
             "tool_calls": [call.as_message_part() for call in tool_round.calls]}
    return [calls] + [
        {"role": TOOL_ROLE, "content": result.text, "name": call.name, "tool_call_id": call.id}
        for call, result in zip(tool_round.calls, tool_round.results)
    ]


def exchange_messages(exchange: Exchange) -> list[dict]:
    """An exchange's messages: the user's, its rounds of calls, the reply."""
    messages = [user_message(exchange.user)]
    for tool_round in exchange.rounds:
        messages += round_messages(tool_round)
    return messages + [assistant_message(exchange.reply)]


def messages_of(exchanges: Sequence[Exchange]) -> list[dict]:
    return [message for exchange in exchanges for message in exchange_messages(exchange)]
