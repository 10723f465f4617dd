"""One exchange of a conversation: a user message and the reply, with the token ids each added."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Exchange:
    """A user message and the reply to it, with the token ids each added to the conversation."""

    user: str
    reply: str = ""
    interrupted: bool = False
    user_ids: list[int] | None = None  # the user turn and the assistant's cue; None: not known
    reply_ids: list[int] | None = None  # the reply as generated, then the end-of-turn ids
