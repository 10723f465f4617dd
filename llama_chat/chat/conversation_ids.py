"""The token ids of a conversation as they went through the model, and the prompt of a turn.

How a turn's prompt is built
----------------------------
Next to the messages, the session keeps the token ids of the conversation as they went
through the model: each user turn as the chat format rendered it, each reply as the model
generated it (never re-tokenised) followed by the format's end-of-turn ids. A new message
adds only what rendering it adds: the difference between the ids of the conversation
rendered with the new message (and the assistant's cue) and rendered closed. The prompt
is the kept ids plus that difference, so it begins with everything the cache holds, and
turn N prefills only its own message (and the end-of-turn ids of the previous reply).

That relies on the chat format's prefix property (see chat_format): the closed
conversation's ids are a prefix of its ids with one more message. It is checked on every
turn. Where the closed render does not continue the prompt as generated (a template that
drops the thinking of earlier replies, plain text whose words merge across messages), the
exchange's ids are the format's render of it, which the cache shares up to where they
part: the model sees what its template says. Where even that fails (a template that
rewrites earlier turns) the whole conversation is rendered again, and the generation
reuses whatever common prefix the cache holds. Ids that are not known (after /system,
/open of another model's file, /load, dropped turns) are rebuilt by rendering the
conversation message by message.

A reply that calls tools goes on in rounds (see round_plan): each round's prompt is the ids
kept so far, the ids the model generated for its calls, the end-of-turn ids the format
closes them with, and what rendering the results adds, as for a new message. The
exchange's reply ids are then everything after its user ids, calls and results included.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from llama_chat.chat.exchange import Exchange, ToolRound
from llama_chat.engine.cache import common_length
from llama_chat.errors import LlamaChatError
from llama_chat.text.chat_format import TOOL_ROLE, ChatFormat, Message


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


@dataclass
class TurnPlan:
    """How a new user message goes to the model."""

    prompt: list[int]
    history: list[dict]  # the messages rendered before the new one (see turn_encoder)
    rendered: list[int]  # the format's own ids for history + new message + cue
    user_ids: list[int] | None  # what the message adds to the kept ids; None: full re-render


def plan_turn(
    chat_format: ChatFormat, history: list[dict[str, str]], rendered: list[int], ids: list[int] | None
) -> TurnPlan:
    """The prompt for a new message after `history` (`rendered`: the format's ids for both,
    cued), whose kept ids are `ids` (None: not known): the kept ids and what the message
    adds, or the whole conversation rendered."""
    closed = closed_ids(chat_format, history)
    if ids is not None and closed is not None and _starts_with(rendered, closed):
        user_ids = rendered[len(closed):]
        return TurnPlan(ids + user_ids, history, rendered, user_ids)
    return TurnPlan(rendered, history, rendered, None)


def closed_ids(chat_format: ChatFormat, messages: list[dict[str, str]]) -> list[int] | None:
    """Ids of a conversation without the assistant's cue. A format that cannot render a
    system prompt on its own (llama2 folds it into the first user turn) gives []."""
    ids = _render(chat_format, messages, cue=False)
    if ids is None and all(message["role"] == "system" for message in messages):
        return []
    return ids


def exchange_ids(
    chat_format: ChatFormat, stop_ids: Collection[int], plans: Sequence[TurnPlan], messages: list[dict],
    generated: Sequence[int],
) -> tuple:
    """The ids a finished exchange adds to the kept ones: (user ids, reply ids), or
    (None, None) when they are not known (the next turn then renders everything).
    `plans` are the plans of the reply's rounds (one without tool calls), `messages` the
    exchange's (see exchange_messages), `generated` the last round's ids.

    Where the format's render of the closed conversation begins with the prompt it
    rendered, the reply's ids are the ones generated, then the end-of-turn ids the
    format closes it with (from the last end-of-turn id after the reply). Where it
    does not (a template that drops the thinking of earlier replies writes the reply
    otherwise than it was generated), or no end-of-turn id marks where the reply ends
    (plain text), the exchange's ids are the format's own render of it: what the
    model is to see of it from the next turn on. The cache keeps what it has in
    common with them. After rounds of calls, only the first way is taken."""
    first, last = plans[0], plans[-1]
    if first.user_ids is None or last.user_ids is None:
        return None, None
    closed = _render(chat_format, first.history + messages, cue=False)
    if closed is None:
        return None, None
    if _starts_with(closed, last.rendered):
        tail = closed[len(last.rendered):]
        ends = [index for index, token in enumerate(tail) if token in stop_ids]
        if ends:
            reply_start = len(first.prompt)
            return first.user_ids, last.prompt[reply_start:] + list(generated) + tail[ends[-1]:]
    if len(plans) > 1:
        return None, None
    history_length = len(first.rendered) - len(first.user_ids)
    if not _starts_with(closed, first.rendered[:history_length]):
        return None, None
    split = common_length(closed, first.rendered)
    return closed[history_length:split], closed[split:]


def round_plan(
    chat_format: ChatFormat, stop_ids: Collection[int], plan: TurnPlan, before: list[dict], generated: Sequence[int],
    tool_round: ToolRound,
) -> TurnPlan:
    """The plan of a reply's next round, after `tool_round`'s calls (which the last round,
    planned by `plan` after the messages `before`, generated as `generated`) and results.

    Where the format closes the calls after what the last round was prompted with, and
    renders the results after that, the prompt is the last prompt, the ids generated, the
    end-of-turn ids that close them, and what the results add; else the whole conversation
    rendered (user_ids None), of which the cache keeps the common prefix."""
    made, answered = round_messages(tool_round)[:1], round_messages(tool_round)
    rendered = chat_format.encode(before + answered)
    closed = _render(chat_format, before + made, cue=False)
    if plan.user_ids is not None and closed is not None and _starts_with(closed, plan.rendered):
        tail = closed[len(plan.rendered):]
        ends = [index for index, token in enumerate(tail) if token in stop_ids]
        if ends and _starts_with(rendered, closed):
            kept = plan.prompt + list(generated) + tail[ends[-1]:]
            return TurnPlan(kept + rendered[len(closed):], before + answered, rendered, plan.user_ids)
    return TurnPlan(rendered, before + answered, rendered, None)


def rendered_ids(
    chat_format: ChatFormat, system_messages: list[dict[str, str]], exchanges: Sequence[Exchange]
) -> tuple[list[int], list[tuple[list[int], list[int]]]] | None:
    """The head ids and each exchange's (user ids, reply ids) from renders of the growing
    conversation (replies re-tokenised); None if the format lacks the prefix property."""
    messages = system_messages
    head = closed_ids(chat_format, messages)
    done = head
    segments = []
    for exchange in exchanges:
        rendered = _render(chat_format, messages + [user_message(exchange.user)], cue=True)
        messages = messages + exchange_messages(exchange)
        closed = _render(chat_format, messages, cue=False)
        if rendered is None or closed is None or not (_starts_with(rendered, done) and _starts_with(closed, done)):
            return None
        # The user's ids end where the cue and the closed reply part (at the cue's end
        # unless the template writes earlier replies otherwise than they were cued).
        split = common_length(closed, rendered)
        segments.append((closed[len(done):split], closed[split:]))
        done = closed
    return head, segments


def _render(chat_format: ChatFormat, messages: Sequence[Message], cue: bool) -> list[int] | None:
    """The format's ids for these messages, or None if it cannot render them (yet)."""
    try:
        return chat_format.encode(messages, add_generation_prompt=cue)
    except LlamaChatError:
        return None


def _starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(prefix) <= len(ids) and list(ids[: len(prefix)]) == list(prefix)
