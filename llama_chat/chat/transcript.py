"""The token ids of a conversation as they went through the model, and each round's prompt.

Beside the messages, the transcript keeps the conversation's ids as the model saw them:
the ids before the first exchange (the system prompt's), then for each exchange its user
turn as the chat format rendered it and its reply as the model generated it (never
re-tokenised) followed by the format's end-of-turn ids. A new message adds only what
rendering it adds to the closed conversation, so the prompt begins with everything the
cache holds and a turn prefills only its own message.

The prefix rule these ids rest on (see text/chat_format): a chat format's ids for some
messages begin its ids for those messages and more, so the more add ids after them and
nothing before them changes. `added` is where the rule is applied: the ids kept exactly
are the ones the shorter render shares; where it fails, the longer render stands whole
(the model's cache keeps whatever prefix they still share).

The prefix rule is checked on every turn. Where the closed render does not continue the
prompt as generated (a template that drops the thinking of earlier replies, plain text
whose words merge across messages), the exchange's ids are the format's own render of it,
which the cache shares up to where they part: the model sees what its template says.
Where even that fails (a template that rewrites earlier turns) the whole conversation is
rendered again, and the cache keeps whatever common prefix it holds. Ids not known (after
/system, /open of another model's file, /load, dropped exchanges) are rendered anew.

Rendering the whole conversation to learn what a message adds costs in proportion to its
length, every turn. Where the format renders each message on its own (every built-in
format but plain, and the usual templates), the message adds the same ids after the system
prompt and the last exchange as after the whole: that is checked against the whole
rendering the first time the two differ, and a format that fails is rendered whole from
then on. Plain text always is: its words merge across messages.

A reply that calls tools goes on in rounds: each round's prompt is the ids so far, the ids
the model generated for its calls, the end-of-turn ids that close them, and what rendering
the results adds. The exchange's reply ids are everything after its user ids.

When a message does not fit, `Overflow` counts the oldest exchanges to drop: where the
format renders each message on its own, from the first exchange kept rendered after the
system prompt (which a format may fold into it), the ids each later one adds (kept per
exchange text) and the new message's; otherwise each candidate is rendered whole.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from itertools import pairwise

from llama_chat.chat.conversation import Conversation
from llama_chat.chat.exchange import Exchange, ToolRound, exchange_messages, messages_of, round_messages, user_message
from llama_chat.chat.spans import Span, Spans, ids_hold_text
from llama_chat.engine.cache import common_length
from llama_chat.errors import ContextOverflowError, LlamaChatError
from llama_chat.text.chat_format import ChatFormat, Message


@dataclass(frozen=True)
class Prompt:
    """A round's prompt, and what the transcript needs to record what is generated after it."""

    ids: list[int]  # what the model is prompted with
    history: list[dict]  # the messages before the new one: the conversation, or its last exchange
    messages: list[dict]  # the history, the new message and the rounds of calls so far
    rendered: list[int]  # the format's own ids for `messages`, with the generation prompt
    user_ids: list[int] | None  # what the new message adds to the kept ids; None: all rendered anew
    reply_start: int  # where the reply's ids begin in `ids`
    rounds: int = 0  # the rounds of calls before this one


class Transcript:
    """The conversation's token ids: those before the first exchange, and each exchange's
    span (the other versions' too, until the conversation is rendered anew)."""

    def __init__(self, conversation: Conversation, chat_format: ChatFormat) -> None:
        self.conversation = conversation
        self.chat_format = chat_format
        self.head: list[int] | None = None  # the ids before the first exchange; None: not known
        self.spans = Spans()
        # Whether messages render on their own: None until checked against a whole render.
        self.local: bool | None = False if chat_format.name == "plain" else None
        self.overflow = Overflow(chat_format)

    @property
    def ids(self) -> list[int] | None:
        """The conversation's token ids as fed and generated, or None while not known."""
        if self.head is None:
            return None
        ids = list(self.head)
        for exchange in self.conversation.exchanges:
            span = self.spans.get(exchange)
            if span is None:
                return None
            ids += span.user + span.reply
        return ids

    def take(self, head: list[int] | None, spans: Spans) -> None:
        """Ids from elsewhere (a saved conversation), in place of these."""
        self.head, self.spans = head, spans

    def rerender(self) -> None:
        """Every exchange's ids from renders of the growing conversation (replies
        re-tokenised); left unknown if the format breaks the prefix rule. Other versions'
        ids followed what came before them: they are rendered anew when followed."""
        messages = self.conversation.system_messages()
        head = done = closed_ids(self.chat_format, messages)
        self.head, self.spans = None, Spans()
        spans = Spans()
        for exchange in self.conversation.exchanges:
            rendered = render(self.chat_format, messages + [user_message(exchange.user)], generation_prompt=True)
            messages = messages + exchange_messages(exchange)
            closed = closed_ids(self.chat_format, messages)
            if added(done, rendered) is None or added(done, closed) is None:
                return
            # The user's ids end where the generation prompt and the closed reply part (at
            # its end unless the template writes earlier replies otherwise than generated).
            split = common_length(closed, rendered)
            spans[exchange] = Span(closed[len(done):split], closed[split:])
            done = closed
        self.head, self.spans = head, spans

    def prompt_for(self, text: str) -> Prompt:
        """The prompt for a new message after the conversation (its ids rendered if not known)."""
        if self.ids is None:
            self.rerender()
        ids, whole = self.ids, self.conversation.messages()
        if len(self.conversation.exchanges) < 2 or self.local is False:  # the last exchange is all, or no use
            return prompt_after(self.chat_format, whole, text, ids)
        last = self.conversation.system_messages() + messages_of(self.conversation.exchanges[-1:])
        short = prompt_after(self.chat_format, last, text, ids)
        if self.local and short.user_ids is not None:
            return short
        prompt = prompt_after(self.chat_format, whole, text, ids)
        if self.local is None and prompt.user_ids is not None:
            self.local = short.user_ids == prompt.user_ids
        return prompt

    def append_round(self, prompt: Prompt, generated: Sequence[int], tool_round: ToolRound) -> Prompt:
        """The prompt of a reply's next round, after `tool_round`'s calls (generated as
        `generated` after `prompt`) and their results."""
        return next_round(self.chat_format, self.chat_format.stop_ids, prompt, generated, tool_round)

    def append_reply(self, prompt: Prompt, exchange: Exchange, generated: Sequence[int]) -> None:
        """Record the ids of a finished exchange, whose last round was `prompt`, then `generated`."""
        span = reply_span(self.chat_format, self.chat_format.stop_ids, prompt, exchange, generated)
        if span is not None:
            self.spans[exchange] = span

    def oldest_to_drop(self, text: str, remaining: int, capacity: int) -> int:
        """How many of the oldest exchanges to drop for `text` to fit (see Overflow)."""
        return self.overflow.oldest_to_drop(self.conversation, text, remaining, capacity, self.local)

    def drop_oldest(self, count: int) -> None:
        """Move the oldest `count` exchanges (with their other versions) out of the context, into
        the conversation's earlier ones; the rest rendered anew."""
        self.conversation.earlier += self.conversation.exchanges[:count]
        del self.conversation.exchanges[:count]
        self.rerender()

    def holds_the_text(self, vocab_size: int, decode: Callable[[list[int]], str]) -> bool:
        """Whether the ids are known, in the vocabulary and hold the conversation's text (with
        no exchange, the ids are only the system prompt's: rendered anew, as cheap as checked)."""
        ids, exchanges = self.ids, self.conversation.exchanges
        return (
            ids is not None and bool(exchanges)
            and all(0 <= token < vocab_size for token in ids)
            and ids_hold_text(self.conversation.system, [(e, self.spans.get(e)) for e in exchanges], self.head, decode)
        )


def prompt_after(chat_format: ChatFormat, history: list[dict], text: str, ids: list[int] | None) -> Prompt:
    """The prompt for `text` after `history`, whose kept ids are `ids` (None: not known): the
    kept ids and what the message adds, or the whole conversation rendered."""
    messages = history + [user_message(text)]
    rendered = chat_format.encode(messages)
    closed = closed_ids(chat_format, history)
    user_ids = added(closed, rendered) if ids is not None else None
    prompt = rendered if user_ids is None else ids + user_ids
    return Prompt(prompt, history, messages, rendered, user_ids, len(prompt))


def next_round(
    chat_format: ChatFormat, stop_ids: Collection[int], prompt: Prompt, generated: Sequence[int], tool_round: ToolRound
) -> Prompt:
    """The prompt after `tool_round`: the last prompt, the ids generated, the end-of-turn ids
    that close them and what the results add; else the whole conversation rendered."""
    answered = round_messages(tool_round)
    messages = prompt.messages + answered
    rendered = chat_format.encode(messages)
    closed = closed_ids(chat_format, prompt.messages + answered[:1])
    closing = closing_ids(prompt, closed, stop_ids)
    results = added(closed, rendered) if closing is not None else None
    if results is None:
        return Prompt(rendered, prompt.history, messages, rendered, None, len(rendered), prompt.rounds + 1)
    ids = prompt.ids + list(generated) + closing + results
    return Prompt(ids, prompt.history, messages, rendered, prompt.user_ids, prompt.reply_start, prompt.rounds + 1)


def reply_span(
    chat_format: ChatFormat, stop_ids: Collection[int], prompt: Prompt, exchange: Exchange, generated: Sequence[int]
) -> Span | None:
    """The ids `exchange` adds to the kept ones, its last round prompted by `prompt` and
    generated as `generated`; None where they are not known (the next turn renders all).

    The reply's ids are the ones generated, then the end-of-turn ids that close them. Where
    the format writes the reply otherwise (a template that drops the thinking of earlier
    replies) or no end-of-turn id marks its end (plain text), they are the format's own render
    of the exchange, which the cache keeps as far as it agrees; not after rounds of calls."""
    closed = closed_ids(chat_format, prompt.history + exchange_messages(exchange))
    closing = closing_ids(prompt, closed, stop_ids)
    if closing is not None:
        return Span(prompt.user_ids, prompt.ids[prompt.reply_start:] + list(generated) + closing)
    if prompt.user_ids is None or closed is None or prompt.rounds:
        return None
    history_length = len(prompt.rendered) - len(prompt.user_ids)
    if added(prompt.rendered[:history_length], closed) is None:
        return None
    split = common_length(closed, prompt.rendered)
    return Span(closed[history_length:split], closed[split:])


def closing_ids(prompt: Prompt, closed: list[int] | None, stop_ids: Collection[int]) -> list[int] | None:
    """The end-of-turn ids the format closes what was generated after `prompt` with: the
    render of the closed messages after the prompt's, from its last end-of-turn id on. None
    where the prompt's ids were rendered anew, or the render does not continue the prompt's."""
    tail = added(prompt.rendered, closed) if prompt.user_ids is not None else None
    ends = [index for index, token in enumerate(tail or []) if token in stop_ids]
    return tail[ends[-1]:] if ends else None


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
