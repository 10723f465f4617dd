"""The prefix rule a conversation's token ids rest on (see text/chat_format): a chat format's
ids for some messages begin its ids for those messages and more, so the more add ids after
them and nothing before them changes. `added` is where the rule is applied: the ids kept
exactly are the ones the shorter render shares; where it fails, the longer render stands
whole (the model's cache keeps whatever prefix they still share).
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_chat.errors import LlamaChatError
from llama_chat.text.chat_format import ChatFormat, Message


def added(shorter: Sequence[int] | None, longer: Sequence[int] | None) -> list[int] | None:
    """The ids `longer` adds after `shorter` where it begins with them; None where it does not
    (or either is unknown): then nothing of `shorter` is kept as it is."""
    if shorter is None or longer is None or list(longer[: len(shorter)]) != list(shorter):
        return None
    return list(longer[len(shorter):])


def render(chat_format: ChatFormat, messages: Sequence[Message], generation_prompt: bool) -> list[int] | None:
    """The format's ids for these messages, or None if it cannot render them (yet)."""
    try:
        return chat_format.encode(messages, add_generation_prompt=generation_prompt)
    except LlamaChatError:
        return None


def closed_ids(chat_format: ChatFormat, messages: list[dict[str, str]]) -> list[int] | None:
    """Ids of a conversation without the generation prompt. A format that cannot render a
    system prompt on its own (llama2 folds it into the first user turn) gives []."""
    ids = render(chat_format, messages, generation_prompt=False)
    if ids is None and all(message["role"] == "system" for message in messages):
        return []
    return ids
