"""How many of the oldest exchanges to drop so that a new message's prompt fits.

Where the chat format renders each message on its own (see transcript), the conversation
without its oldest exchanges is as long as the first one kept rendered after the system
prompt (which a format may fold into it), the ids each later one adds (kept per exchange
text) and the new message's; otherwise each candidate is rendered whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from llama_chat.chat.conversation import Conversation
from llama_chat.chat.exchange import Exchange, messages_of, user_message
from llama_chat.chat.prefix import added, closed_ids
from llama_chat.errors import ContextOverflowError
from llama_chat.text.chat_format import ChatFormat


class Overflow:
    """Counts the exchanges to drop for one chat format."""

    def __init__(self, chat_format: ChatFormat) -> None:
        self.chat_format = chat_format
        self._lengths: dict[tuple[str, str], int] = {}  # (user, reply): ids an exchange adds

    def oldest_to_drop(
        self, conversation: Conversation, text: str, remaining: int, capacity: int, local: bool | None
    ) -> int:
        """The fewest oldest exchanges whose removal leaves a prompt of at most `remaining`
        ids (all of them if none does); a message too long even alone raises
        ContextOverflowError (`capacity`: the context, for the message). `local`: whether
        messages render on their own."""
        system, exchanges = conversation.system_messages(), conversation.exchanges
        lengths = self._later_lengths(exchanges, text) if local else None
        for count in range(1, len(exchanges) + 1):
            if self._length_from(system, exchanges, count, text, lengths) <= remaining:
                return count
        alone = len(self.chat_format.encode(system + [user_message(text)]))
        if alone >= capacity:
            with_system = " with the system prompt" if system else ""
            raise ContextOverflowError(
                f"that message is {alone} tokens long{with_system}, more than the context of "
                f"{capacity} tokens: shorten it, or start llama-chat with a larger --ctx-size"
            )
        return len(exchanges)

    def _length_from(
        self, system: list, exchanges: Sequence[Exchange], count: int, text: str, lengths: list[int] | None
    ) -> int:
        """The prompt's length without the oldest `count` exchanges."""
        if lengths is not None and count < len(exchanges):
            first = closed_ids(self.chat_format, system + messages_of(exchanges[count:count + 1]))
            if first is not None:
                return len(first) + lengths[count]
        history = system + messages_of(exchanges[count:])
        return len(self.chat_format.encode(history + [user_message(text)]))

    def _later_lengths(self, exchanges: Sequence[Exchange], text: str) -> list[int] | None:
        """For each count, the ids of the exchanges after exchanges[count] and of the new
        message: [i] = sum of lengths[i + 1:] plus the message's. None where unknown."""
        lengths = [self._added_length(before, exchange) for before, exchange in pairwise(exchanges)]
        message = self._message_length(exchanges[-1], text) if exchanges else None
        if message is None or None in lengths:
            return None
        later = [message]
        for length in reversed(lengths):
            later.append(later[-1] + length)
        return later[::-1]

    def _added_length(self, before: Exchange, exchange: Exchange) -> int | None:
        """How many ids `exchange` adds after `before` (its render on its own, kept)."""
        key = (exchange.user, exchange.reply)
        if key not in self._lengths:
            shorter = closed_ids(self.chat_format, messages_of([before]))
            longer = closed_ids(self.chat_format, messages_of([before, exchange]))
            more = added(shorter, longer)
            if more is None:
                return None
            self._lengths[key] = len(more)
        return self._lengths[key]

    def _message_length(self, before: Exchange, text: str) -> int | None:
        """How many ids the new message and the generation prompt add after `before`."""
        closed = closed_ids(self.chat_format, messages_of([before]))
        more = added(closed, self.chat_format.encode(messages_of([before]) + [user_message(text)]))
        return None if more is None else len(more)
