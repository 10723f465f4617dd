"""Compaction: the model itself summarises the older exchanges, and the summary stands for
them in the context (the exchanges themselves stay in the conversation's earlier ones, for
the file and the history).

The summary is generated greedily on a cache of its own, from the conversation's messages
followed by a request for it, so that the chat's cache stays as it was until the summary
is there: Ctrl-C while it is written changes nothing.
"""

from __future__ import annotations

from llama_chat.chat.exchange import user_message
from llama_chat.chat.thinking import answer_of
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.text.chat_format import ChatFormat

SUMMARY_TOKENS = 200  # a summary's length, at most
REQUEST = (
    "Summarise our conversation so far in a few sentences, for yourself to continue it from: keep every fact, "
    "name, number, decision and open question, and leave out greetings. Write only the summary."
)


def summary_of(model: Llama, chat_format: ChatFormat, messages: list[dict], max_tokens: int = SUMMARY_TOKENS) -> str:
    """The model's summary of `messages` (a system message first, where there is one), in
    at most `max_tokens` tokens."""
    ids = chat_format.encode(messages + [user_message(REQUEST)])
    context = model.args.max_seq_len
    if len(ids) + 1 >= context:
        raise LlamaChatError(f"the conversation to summarise is {len(ids)} tokens long, more than the model's "
                             f"context of {context}: /compact earlier, or the oldest exchanges are dropped")
    cache = model.new_cache(min(context, len(ids) + max_tokens + 1))
    generation = model.generate(ids, SamplingSettings(temperature=0, max_tokens=max_tokens), cache=cache)
    summary = answer_of("".join(piece.text for piece in generation)).strip()
    if not summary:
        raise LlamaChatError("the model wrote no summary: nothing was compacted")
    return summary
