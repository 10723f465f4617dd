"""A chat session: the conversation (see conversation) and its token ids (see transcript),
the model it runs on (see running_model), the sampling settings, and what holds them
together: turns, context overflow, versions, switching models, saving and opening (see
session_file).

Context
-------
A turn needs its prompt plus space for the reply: a reserve of min(max_tokens, capacity // 4)
tokens. When the prompt and the reserve do not fit, the oldest exchanges are dropped (the
system prompt stays) until they do, and the ids are rendered anew. A message
that does not fit even with every earlier exchange dropped is refused; a message that
fits but leaves less than the reserve gets what remains.

Tools
-----
With tools offered (set_tools), the conversation is rendered with them (see
text/tools_format) and each turn's replies may call them (see turn); a format set by
/format leaves no place for calls, so while one is set the tools are not offered.

Versions
--------
/retry and /edit start a new version of the conversation from an exchange on, and keep
the one it replaces beside it (see branches). Switching to another version keeps the
cache's positions that the two have in common: those before the fork, at least.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from llama_chat.chat.conversation import Conversation
from llama_chat.chat.compaction import SUMMARY_TOKENS, summary_of
from llama_chat.chat.exchange import Exchange, messages_of
from llama_chat.chat.running_model import RunningModel
from llama_chat.chat.conversation_file import SavedConversation
from llama_chat.chat.session_file import open_saved, open_session, save_session, save_session_cache, saved_session
from llama_chat.chat.tool_offer import MAX_CALLS, ToolOffer
from llama_chat.chat.transcript import Transcript
from llama_chat.chat.turn import Turn
from llama_chat.engine.generation import GenerationStats
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.options import DraftLength
from llama_chat.text.chat_format import ChatFormat
from llama_chat.text.tools_format import call_syntax_of
from llama_chat.tools.tool import ToolSpec

if TYPE_CHECKING:  # the grammar engine loads only when a format is chosen
    from llama_chat.engine.constraint import AnswerFormat


class Session(RunningModel):
    """The conversation and its transcript, the settings, and the model it runs on with its
    KV cache (a session is a running model with a conversation: the model's attributes are
    its own, not forwarded)."""

    def __init__(
        self,
        model: Llama,
        settings: SamplingSettings | None = None,
        *,
        system: str | None = None,
        context_size: int | None = None,
        model_path: str | Path | None = None,
    ) -> None:
        super().__init__(model, model_path, context_size)
        self.conversation = Conversation(system)
        self.offer: ToolOffer | None = None  # the tools replies may call
        self.transcript = Transcript(self.conversation, model.chat_format)
        self.when_full = "drop"  # or "compact": what a message that does not fit does (--when-full)
        self.compaction_freed = 0  # context tokens compaction has freed in this conversation
        self.settings = settings or SamplingSettings()
        # Where each setting that is not llama-chat's default came from, for /settings.
        self.setting_sources: dict[str, str] = {}
        self.recommended: dict[str, str] = {}  # the settings taken from the model's recommendations, by source
        self.last_stats: GenerationStats | None = None
        self.transcript.rerender()

    def context_used(self) -> int:
        """Tokens the conversation takes in the context."""
        ids = self.transcript.ids
        return len(ids) if ids is not None else len(self.cache)

    def reserve(self) -> int:
        """Tokens kept for a reply when deciding whether a prompt fits."""
        return min(self.settings.max_tokens, self.capacity // 4)

    # Turns

    def send(self, text: str) -> Turn:
        """Start the reply to a new user message; `run()` the returned Turn to stream it."""
        return self._start(text)

    def retry(self) -> Turn:
        """Start a new reply to the last user message, in place of the last reply (kept as
        another version)."""
        if not self.conversation.exchanges:
            raise LlamaChatError("nothing to retry yet: send a message first")
        return self.edit(len(self.conversation.exchanges), self.conversation.exchanges[-1].user)

    def edit(self, number: int, text: str) -> Turn:
        """Start the reply to `text` in place of user message `number` (from 1): a new
        version of the conversation from there; the exchanges it replaces stay another."""
        if not 1 <= number <= len(self.conversation.exchanges):
            raise LlamaChatError(self.conversation.no_message(number))
        replaced = self.conversation.exchanges[number - 1:]
        del self.conversation.exchanges[number - 1:]
        try:
            return self._start(text, replaced)
        except BaseException:
            self.conversation.exchanges.extend(replaced)
            raise

    def _start(self, text: str, replaced: list[Exchange] | None = None) -> Turn:
        prompt = self.transcript.prompt_for(text)
        remaining = self.capacity - self.reserve()
        dropped, compacted = 0, None
        if len(prompt.ids) > remaining and self.when_full == "compact" and len(self.conversation.exchanges) > 1:
            try:
                compacted = self.compact()  # all but the last exchange, summarised
            except LlamaChatError:  # no summary: the oldest are dropped instead
                compacted = None
            prompt = self.transcript.prompt_for(text)
        if len(prompt.ids) > remaining:
            dropped = self.transcript.oldest_to_drop(text, remaining, self.capacity)
            if dropped:
                self.transcript.drop_oldest(dropped)
                prompt = self.transcript.prompt_for(text)
        exchanges = self.conversation.exchanges
        calls_before = sum(len(tool_round.calls) for exchange in exchanges for tool_round in exchange.rounds)
        return Turn(
            self, self.settings, self._record, text, prompt, dropped, replaced,
            transcript=self.transcript, offer=self.offer, first_call=calls_before + 1, compacted=compacted,
        )

    def compact(self, keep: int = 1) -> tuple[int, int, int]:
        """Put the model's summary of every exchange but the last `keep` (and of an earlier
        summary) in their place in the context; they stay in the conversation's earlier ones.
        Returns how many were compacted, and the context's tokens before and after."""
        exchanges = self.conversation.exchanges
        count = len(exchanges) - keep
        if count <= 0:
            raise LlamaChatError(f"nothing to compact: the context holds {len(exchanges)} exchange"
                                 f"{'s' * (len(exchanges) != 1)}, and the last {keep} stay{'s' * (keep == 1)} whole")
        before = self.context_used()
        messages = self.conversation.system_messages() + messages_of(exchanges[:count])
        limit = min(SUMMARY_TOKENS, self.settings.max_tokens)  # no longer than a reply may be
        summary = summary_of(self.model, self.transcript.chat_format, messages, limit)
        earlier, summarised = list(self.conversation.earlier), self.conversation.summary
        self.conversation.earlier += exchanges[:count]
        del exchanges[:count]
        self.conversation.summary = summary
        self.transcript.rerender()
        if self.context_used() >= before:  # the summary is no shorter than what it stands for
            exchanges[:0] = self.conversation.earlier[len(earlier):]
            self.conversation.earlier, self.conversation.summary = earlier, summarised
            self.transcript.rerender()
            raise LlamaChatError(f"the model's summary takes no fewer tokens than the {count} exchange"
                                 f"{'s' * (count != 1)} it would stand for: nothing was compacted")
        self.trim_cache()
        self.compaction_freed += before - self.context_used()
        return count, before, self.context_used()

    def _record(self, exchange: Exchange, stats: GenerationStats) -> None:
        """A finished turn joins the conversation."""
        self.conversation.exchanges.append(exchange)
        self.last_stats = stats

    # The conversation

    def switch_version(self, number: int) -> None:
        """Follow version `number` instead (LlamaChatError for one there is not, nothing
        changed); the cache keeps what the two versions have in common."""
        self.conversation.follow_version(number)
        tokenizer = self.model.tokenizer
        if not self.transcript.holds_the_text(tokenizer.vocab_size, tokenizer.decode):  # unknown, or by hand
            self.transcript.rerender()
        self.trim_cache()

    def undo(self) -> Exchange:
        """Remove the last exchange (with its other versions)."""
        exchange = self.conversation.undo()
        self.trim_cache()
        return exchange

    def clear(self) -> None:
        """Start over; the system prompt stays."""
        self.conversation.clear()
        self.transcript.rerender()
        self.trim_cache()

    def set_system(self, text: str | None) -> None:
        self.conversation.system = text or None
        self.transcript.rerender()
        self.trim_cache()

    @property
    def chat_format(self) -> ChatFormat:
        """What the conversation is rendered with: the model's format, with the tools offered."""
        return self.transcript.chat_format

    def trim_cache(self) -> None:
        """Forget cached positions past what the conversation still holds."""
        ids = self.transcript.ids
        if ids is not None:
            self.cache.keep_common_prefix(ids)

    # Settings and what the conversation runs on

    def apply_settings(self, values: dict, source: str) -> None:
        """Replace the settings named in `values` (SettingError for a bad one, nothing
        changed), remembering that they came from `source`."""
        self.settings = dataclasses.replace(self.settings, **values)
        self.setting_sources.update(dict.fromkeys(values, source))

    def take_recommended_settings(self) -> None:
        """The settings recommended for the model now running (its card, its file, its store),
        in place of those the model before it recommended; the user's own choices stay."""
        defaults = SamplingSettings()
        earlier = {name for name in self.recommended if self.setting_sources.get(name) == self.recommended[name]}
        self.settings = dataclasses.replace(self.settings, **{name: getattr(defaults, name) for name in earlier})
        for name in earlier:
            del self.setting_sources[name]
        self.recommended = {}
        for source, values in self.model.recommended:
            chosen = {name: value for name, value in values.items()
                      if self.setting_sources.get(name) in (None, self.recommended.get(name))}
            self.apply_settings(chosen, source)
            self.recommended.update(dict.fromkeys(chosen, source))

    def set_model(self, model: Llama, model_path: str | Path | None) -> str | None:
        """Continue the conversation with other weights (a new cache; ids rebuilt). Returns a
        note when the draft model had to be let go (another vocabulary)."""
        note = self.replace(model, model_path)
        if self.offer is not None:  # the new model's family writes the calls
            self.offer = dataclasses.replace(self.offer, syntax=call_syntax_of(model.chat_format))
        self._render_with_the_tools()
        return note

    def set_lookup(self, lookup: DraftLength) -> None:
        """Draft by prompt lookup as `lookup` says: off, up to N tokens, or where it pays."""
        self.speculation.lookup = lookup

    def set_format(self, chosen: AnswerFormat | None) -> None:
        """Replies must follow this format (None: free text); while one is set, no tools are offered."""
        self.format = chosen
        self._render_with_the_tools()

    def set_tools(self, tools: list[ToolSpec], max_calls: int = MAX_CALLS, required: bool = False) -> None:
        """Offer these tools to the model (none: no tools), calls written in its family's
        format, at most `max_calls` a turn, a call `required` first; the conversation is
        rendered anew with them (the cache keeps what it shares)."""
        syntax = call_syntax_of(self.model.chat_format)
        self.offer = ToolOffer(tuple(tools), syntax, max_calls, required) if tools else None
        self._render_with_the_tools()

    def offered_names(self) -> list[str]:
        """The names of the tools the model is offered now (none while a format is set)."""
        return self.offer.names() if self.offer is not None and self.format is None else []

    def _render_with_the_tools(self) -> None:
        """The transcript in the format the conversation is now rendered with."""
        base = self.model.chat_format
        chosen = self.offer.chat_format(base) if self.offer is not None and self.format is None else base
        self.transcript = Transcript(self.conversation, chosen)
        self.transcript.rerender()
        self.trim_cache()

    # Saving and opening

    def save(self, path: str | Path, cache_limit_bytes: int | None = None) -> tuple[Path, int]:
        """Write the conversation and beside it its cache (see session_file)."""
        return save_session(
            self.transcript, self, self.settings, path, cache_limit_bytes, self.offered_names()
        )

    def open(self, path: str | Path) -> str | None:
        """Replace the conversation, settings and cache with saved ones (see session_file)."""
        return self._opened(open_session(self.transcript, self, path, self.offered_names()))

    def open_kept(self, saved: SavedConversation, where: str, cache: Path) -> str | None:
        """Replace the conversation, settings and cache with ones the history kept."""
        return self._opened(open_saved(self.transcript, self, saved, where, cache, self.offered_names()))

    def saved(self) -> SavedConversation:
        """The conversation, its ids, settings and model, as a file or the history keeps them."""
        return saved_session(self.transcript, self, self.settings, self.offered_names())

    def save_cache(self, path: Path, limit_bytes: int | None) -> int:
        """Write the cache of the conversation's positions alone (see session_file)."""
        return save_session_cache(self.transcript, self, path, limit_bytes, self.offered_names())

    def _opened(self, opened: tuple[SamplingSettings, str | None]) -> str | None:
        self.settings, note = opened
        self.setting_sources = {field.name: "saved conversation" for field in dataclasses.fields(SamplingSettings)}
        return note
