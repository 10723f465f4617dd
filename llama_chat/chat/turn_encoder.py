"""A new message to token ids: only what it adds to the conversation, where the chat format
allows, and how much of the conversation to drop when it does not fit.

A turn's prompt is the kept ids plus what rendering the new message adds to the closed
conversation (see conversation_ids). Rendering the whole conversation to learn that costs
in proportion to its length, every turn. Where the format renders each message on its own
(its ids do not depend on how many messages came before: every built-in format but plain,
and the usual templates), the new message adds the same ids after a stand-in of the
conversation, the system prompt and the last exchange, as after the whole of it. That is
checked against the whole rendering the first time the two differ (two exchanges or
more); a format that fails the check is rendered whole from then on, as is a turn whose
stand-in does not continue its closed render. Plain text is always rendered whole: its
words merge across messages.

Overflow: with a format that renders each message on its own, the conversation without
its oldest exchanges is as long as the first one kept rendered after the system prompt
(which a format may fold into it), the render length of each later one (kept per exchange
text) and the new message's; otherwise each candidate is rendered whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from llama_chat.chat.conversation import Conversation
from llama_chat.chat.conversation_ids import TurnPlan, closed_ids, messages_of, plan_turn, user_message
from llama_chat.chat.exchange import Exchange
from llama_chat.errors import ContextOverflowError
from llama_chat.text.chat_format import ChatFormat


class TurnEncoder:
    """Plans turns and overflow for one chat format."""

    def __init__(self, chat_format: ChatFormat) -> None:
        self.chat_format = chat_format
        # Whether messages render on their own: None until checked against a whole render.
        self.local: bool | None = False if chat_format.name == "plain" else None
        self._lengths: dict[tuple[str, str], int] = {}  # (user, reply): ids an exchange adds

    def plan(self, conversation: Conversation, text: str) -> TurnPlan:
        """The prompt for `text` after the conversation (its ids rebuilt if not known)."""
        if conversation.ids is None:
            conversation.rebuild_ids(self.chat_format)
        ids = conversation.ids
        if len(conversation.exchanges) < 2 or self.local is False:  # the stand-in is the whole, or no use
            return self._plan_after(conversation.messages(), text, ids)
        short = self._plan_after(stand_in(conversation), text, ids)
        if self.local and short.user_ids is not None:
            return short
        whole = self._plan_after(conversation.messages(), text, ids)
        if self.local is None and whole.user_ids is not None:
            self.local = short.user_ids == whole.user_ids
        return whole

    def _plan_after(self, history: list[dict[str, str]], text: str, ids: list[int] | None) -> TurnPlan:
        rendered = self.chat_format.encode(history + [user_message(text)])
        return plan_turn(self.chat_format, history, rendered, ids)

    def exchanges_to_drop(self, conversation: Conversation, text: str, room: int, capacity: int) -> int:
        """The fewest oldest exchanges whose removal leaves a prompt of at most `room` ids
        (all of them if none does); a message too long even alone raises
        ContextOverflowError (`capacity`: the context, for the message)."""
        system, exchanges = conversation.system_messages(), conversation.exchanges
        lengths = self._later_lengths(exchanges, text) if self.local else None
        for count in range(1, len(exchanges) + 1):
            if self._length_from(system, exchanges, count, text, lengths) <= room:
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
        added = [self._added_length(before, exchange) for before, exchange in pairwise(exchanges)]
        message = self._message_length(exchanges[-1], text) if exchanges else None
        if message is None or None in added:
            return None
        later = [message]
        for length in reversed(added):
            later.append(later[-1] + length)
        return later[::-1]

    def _added_length(self, before: Exchange, exchange: Exchange) -> int | None:
        """How many ids `exchange` adds after `before` (its render on its own, kept)."""
        key = (exchange.user, exchange.reply)
        if key not in self._lengths:
            shorter = closed_ids(self.chat_format, messages_of([before]))
            longer = closed_ids(self.chat_format, messages_of([before, exchange]))
            if shorter is None or longer is None or longer[: len(shorter)] != shorter:
                return None
            self._lengths[key] = len(longer) - len(shorter)
        return self._lengths[key]

    def _message_length(self, before: Exchange, text: str) -> int | None:
        """How many ids the new message and the cue add after `before`."""
        closed = closed_ids(self.chat_format, messages_of([before]))
        cued = self.chat_format.encode(messages_of([before]) + [user_message(text)])
        if closed is None or cued[: len(closed)] != closed:
            return None
        return len(cued) - len(closed)


def stand_in(conversation: Conversation) -> list[dict[str, str]]:
    """The messages a new one is rendered after where messages render on their own: the
    system prompt and the last exchange (which keep a template's alternation and folding)."""
    return conversation.system_messages() + messages_of(conversation.exchanges[-1:])
