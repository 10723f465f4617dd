"""One exchange of a conversation: a user message and the reply, with the token ids each added,
and the other versions of the conversation in its place (see branches)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Exchange:
    """A user message and the reply to it, with the token ids each added to the conversation."""

    user: str
    reply: str = ""
    interrupted: bool = False
    user_ids: list[int] | None = None  # the user turn and the assistant's cue; None: not known
    reply_ids: list[int] | None = None  # the reply as generated, then the end-of-turn ids
    # Other versions of the conversation from here on (/retry, /edit made them), each a list
    # of exchanges starting in this one's place; this one is version `version` among them.
    others: list[list[Exchange]] = field(default_factory=list)
    version: int = 0  # from 0: the versions are others[:version], this one, others[version:]
