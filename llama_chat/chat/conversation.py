"""The conversation itself: the system prompt, the exchanges of the version followed (the
others hang from them, see branches) and the token ids they went through the model as (see
conversation_ids). It knows nothing of the model it runs on but its chat format, which
writes the ids when they are to be rendered anew.
"""

from __future__ import annotations

from collections.abc import Callable

from llama_chat.chat.branches import Version, all_exchanges, switched, versions
from llama_chat.chat.conversation_file import ids_hold_text
from llama_chat.chat.conversation_ids import messages_of, rendered_ids
from llama_chat.chat.exchange import Exchange
from llama_chat.errors import LlamaChatError
from llama_chat.text.chat_format import ChatFormat


class Conversation:
    """The system prompt and exchanges, and the ids before the first exchange."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system or None
        self.exchanges: list[Exchange] = []
        self.head_ids: list[int] | None = None  # ids before the first exchange; None: not known

    def messages(self) -> list[dict[str, str]]:
        """System prompt (if any) and every exchange, as chat-format messages."""
        return self.system_messages() + messages_of(self.exchanges)

    def system_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    @property
    def ids(self) -> list[int] | None:
        """The conversation's token ids as fed and generated, or None while not known."""
        if self.head_ids is None:
            return None
        ids = list(self.head_ids)
        for exchange in self.exchanges:
            if exchange.user_ids is None or exchange.reply_ids is None:
                return None
            ids += exchange.user_ids + exchange.reply_ids
        return ids

    def no_message(self, number: int) -> str:
        """Why user message `number` cannot be edited, in one line."""
        if not self.exchanges:
            return "nothing to edit yet: send a message first"
        return f"there is no message {number}: the user messages are numbered from 1 to {len(self.exchanges)}"

    def versions(self) -> list[Version]:
        """The versions at each fork of the conversation, numbered (see branches)."""
        return versions(self.exchanges)

    def follow_version(self, number: int) -> None:
        """Follow version `number` instead (LlamaChatError for one there is not, nothing changed)."""
        self.exchanges = switched(self.exchanges, number)

    def undo(self) -> Exchange:
        """Remove the last exchange (with its other versions)."""
        if not self.exchanges:
            raise LlamaChatError("nothing to undo: the conversation is empty")
        return self.exchanges.pop()

    def rebuild_ids(self, chat_format: ChatFormat) -> None:
        """Ids for every message from renders of the conversation; left unknown if the
        format lacks the prefix property. Other versions' ids followed what came before
        them: they are rendered anew when followed."""
        for exchange in self.exchanges:
            forget_ids(exchange.others)
        rendered = rendered_ids(chat_format, self.system_messages(), self.exchanges)
        if rendered is None:
            self.head_ids = None
            return
        self.head_ids, segments = rendered
        for exchange, (user_ids, reply_ids) in zip(self.exchanges, segments):
            exchange.user_ids, exchange.reply_ids = user_ids, reply_ids

    def ids_hold_the_text(self, vocab_size: int, decode: Callable[[list[int]], str]) -> bool:
        """Whether the ids are known, in the vocabulary and hold the conversation's text (with
        no exchange, the ids are only the system prompt's: rendered anew, as cheap as checked)."""
        ids = self.ids
        return (
            ids is not None and bool(self.exchanges)
            and all(0 <= token < vocab_size for token in ids)
            and ids_hold_text(self.system, self.exchanges, self.head_ids, decode)
        )


def forget_ids(versions: list[list[Exchange]]) -> None:
    """Mark the ids of every exchange of these versions (and of theirs) unknown."""
    for version in versions:
        for exchange in all_exchanges(version):
            exchange.user_ids = exchange.reply_ids = None
