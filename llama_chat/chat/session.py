"""A conversation with a model: its messages, the token ids in the KV cache (see
conversation_ids), context overflow, and saving and opening conversations (the file itself
is conversation_file's).

Context
-------
A turn needs its prompt plus room for the reply: a reserve of min(max_tokens, capacity // 4)
tokens. When the prompt and the reserve do not fit, the oldest exchanges are dropped (the
system prompt stays) until they do, and the kept ids are rebuilt by rendering. A message
that leaves no room even with every earlier exchange dropped is refused; a message that
fits but leaves less than the reserve gets the room there is.

Versions
--------
/retry and /edit start a new version of the conversation from an exchange on, and keep
the one it replaces beside it (see branches). Switching to another version keeps the
cache's positions that the two have in common: those before the fork, at least.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llama_chat.chat.branches import Version, all_exchanges, fork, switched, versions
from llama_chat.chat.cache_file import CacheNotUsed, cache_path, restore_cache, save_cache
from llama_chat.chat.cache_file import identity as cache_identity
from llama_chat.chat.cache_file import model_source as cache_model_source
from llama_chat.chat.conversation_file import SavedConversation, ids_hold_text, read_conversation, write_conversation
from llama_chat.chat.conversation_ids import TurnPlan, exchange_ids, messages_of, plan_turn, rendered_ids, user_message
from llama_chat.chat.exchange import Exchange
from llama_chat.chat.thinking import cue_opening
from llama_chat.engine.generation import Generation, GenerationStats, Piece, StopReason
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.engine.speculation import DraftModel, Speculation, check_same_vocabulary
from llama_chat.errors import ContextOverflowError, LlamaChatError, UsageError, first_line
from llama_chat.llama import Llama
from llama_chat.paths import expanded

if TYPE_CHECKING:  # the grammar engine loads only when a format is chosen
    from llama_chat.engine.constraint import Format


class Turn:
    """One reply being generated. `run()` streams it; however it ends (done, Ctrl-C, an
    error) it is then recorded in the session as an exchange."""

    def __init__(
        self, session: Session, text: str, plan: TurnPlan, dropped: int, replaced: list[Exchange] | None = None
    ) -> None:
        self.session = session
        self.user = text
        self.plan = plan
        self.dropped = dropped  # oldest exchanges dropped to make room for this turn
        self.replaced = replaced  # the exchanges this turn starts a new version of (/retry, /edit)
        processors = [session.format.start(session.model.tokenizer)] if session.format is not None else []
        self.generation: Generation = session.model.generate(
            plan.prompt, session.settings, cache=session.cache, speculation=session.speculation, processors=processors
        )
        # The opening thinking marker when the template's cue wrote it: the reply starts
        # inside the thinking, and is kept with the marker, whole.
        self.thinking_cue = cue_opening(session.model.tokenizer, plan.prompt)
        self.exchange: Exchange | None = None

    @property
    def prompt(self) -> list[int]:
        return self.plan.prompt

    @property
    def text(self) -> str:
        return self.generation.text

    @property
    def stats(self) -> GenerationStats:
        return self.generation.stats

    def run(self, on_piece: Callable[[Piece], None] | None = None) -> Exchange:
        """Generate the reply, passing each piece to on_piece; exceptions (KeyboardInterrupt)
        pass through after the partial reply is recorded."""
        try:
            for piece in self.generation:
                if on_piece is not None:
                    on_piece(piece)
        finally:
            self.finish()
        return self.exchange

    def finish(self) -> Exchange:
        """Record the reply as it stands (interrupted if generation did not reach its end)."""
        if self.exchange is None:
            generation = self.generation
            reply = self.thinking_cue + generation.text
            model = self.session.model
            user_ids, reply_ids = exchange_ids(
                model.chat_format, model.stop_ids, self.plan, self.user, reply, generation.tokens
            )
            self.exchange = Exchange(
                user=self.user,
                reply=reply,
                interrupted=generation.stats.stop_reason == StopReason.INTERRUPTED,
                user_ids=user_ids,
                reply_ids=reply_ids,
            )
            if self.replaced:
                fork(self.replaced, self.exchange)
            self.session.exchanges.append(self.exchange)
            self.session.last_stats = generation.stats
        return self.exchange


class Session:
    """The conversation (system prompt and exchanges), its token ids and the KV cache."""

    def __init__(
        self,
        model: Llama,
        settings: SamplingSettings | None = None,
        *,
        system: str | None = None,
        context_size: int | None = None,
        model_path: str | Path | None = None,
    ) -> None:
        self.model = model
        self.settings = settings or SamplingSettings()
        # Where each setting that is not llama-chat's default came from, for /settings.
        self.setting_sources: dict[str, str] = {}
        self.system = system or None
        self.context_size = context_size  # as asked for; None: the model's, at most 4096
        self.model_path = _absolute(model_path)
        self.exchanges: list[Exchange] = []
        self.head_ids: list[int] | None = None  # ids before the first exchange; None: not known
        self.last_stats: GenerationStats | None = None
        self.speculation = Speculation()  # prompt lookup, auto; or a draft model
        self.format: Format | None = None  # what replies must look like (engine/constraint)
        self._model_source: list | None = None  # the model file's identity, for saved caches
        self.cache = model.new_cache(context_size)
        self._rebuild_ids()

    # The conversation

    def messages(self) -> list[dict[str, str]]:
        """System prompt (if any) and every exchange, as chat-format messages."""
        return self._system_messages() + messages_of(self.exchanges)

    def _system_messages(self) -> list[dict[str, str]]:
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

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def context_used(self) -> int:
        """Tokens the conversation takes in the context."""
        ids = self.ids
        return len(ids) if ids is not None else len(self.cache)

    def reserve(self) -> int:
        """Room kept for a reply when deciding whether a prompt fits."""
        return min(self.settings.max_tokens, self.capacity // 4)

    # Turns

    def send(self, text: str) -> Turn:
        """Start the reply to a new user message; `run()` the returned Turn to stream it."""
        return self._start(text)

    def retry(self) -> Turn:
        """Start a new reply to the last user message, in place of the last reply (kept as
        another version)."""
        if not self.exchanges:
            raise LlamaChatError("nothing to retry yet: send a message first")
        return self.edit(len(self.exchanges), self.exchanges[-1].user)

    def edit(self, number: int, text: str) -> Turn:
        """Start the reply to `text` in place of user message `number` (from 1): a new
        version of the conversation from there; the exchanges it replaces stay another."""
        if not 1 <= number <= len(self.exchanges):
            raise LlamaChatError(self.no_message(number))
        replaced = self.exchanges[number - 1:]
        del self.exchanges[number - 1:]
        try:
            return self._start(text, replaced)
        except BaseException:
            self.exchanges += replaced
            raise

    def no_message(self, number: int) -> str:
        """Why user message `number` cannot be edited, in one line."""
        if not self.exchanges:
            return "nothing to edit yet: send a message first"
        return f"there is no message {number}: the user messages are numbered from 1 to {len(self.exchanges)}"

    def versions(self) -> list[Version]:
        """The versions at each fork of the conversation, numbered (see branches)."""
        return versions(self.exchanges)

    def switch_version(self, number: int) -> None:
        """Follow version `number` instead (LlamaChatError for one there is not, nothing
        changed); the cache keeps what the two versions have in common."""
        self.exchanges = switched(self.exchanges, number)
        if not self._ids_hold_the_text():  # unknown, or saved by hand: rendered anew
            self._rebuild_ids()
        self._trim_cache()

    def undo(self) -> Exchange:
        """Remove the last exchange (with its other versions)."""
        if not self.exchanges:
            raise LlamaChatError("nothing to undo: the conversation is empty")
        exchange = self.exchanges.pop()
        self._trim_cache()
        return exchange

    def clear(self) -> None:
        """Start over; the system prompt stays."""
        self.exchanges.clear()
        self._rebuild_ids()
        self._trim_cache()

    def apply_settings(self, values: dict, source: str) -> None:
        """Replace the settings named in `values` (SettingError for a bad one, nothing
        changed), remembering that they came from `source`."""
        self.settings = dataclasses.replace(self.settings, **values)
        self.setting_sources.update(dict.fromkeys(values, source))

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        self._rebuild_ids()
        self._trim_cache()

    def set_model(self, model: Llama, model_path: str | Path | None) -> str | None:
        """Continue the conversation with other weights (a new cache; ids rebuilt). Returns a
        note when the draft model had to be let go (another vocabulary)."""
        capacity = min(self.context_size, model.args.max_seq_len) if self.context_size else None
        cache = model.new_cache(capacity)  # before anything changes: it may not fit in memory
        self.model, self.cache, self.model_path = model, cache, _absolute(model_path)
        self._model_source = None
        self._rebuild_ids()
        draft = self.speculation.draft
        if draft is not None:
            try:
                check_same_vocabulary(model, draft.model)
            except UsageError as error:
                self.speculation.draft = None
                return f"draft model off: {error}"
        return None

    def set_draft(self, draft: Llama | None, path: str | Path | None = None) -> None:
        """Draft with this model (None: by prompt lookup again); one that does not share the
        model's vocabulary is refused (UsageError) and nothing changes."""
        if draft is not None:
            check_same_vocabulary(self.model, draft)
        self.speculation.draft = None if draft is None else DraftModel(draft, _absolute(path) or "")

    def _start(self, text: str, replaced: list[Exchange] | None = None) -> Turn:
        plan = self._plan(text)
        if self._fits(plan.prompt):
            return Turn(self, text, plan, dropped=0, replaced=replaced)
        dropped = self._exchanges_to_drop(text)
        if dropped:
            del self.exchanges[:dropped]
            self._rebuild_ids()
            plan = self._plan(text)
        return Turn(self, text, plan, dropped, replaced)

    def _fits(self, prompt: Sequence[int]) -> bool:
        return len(prompt) + self.reserve() <= self.capacity

    def _exchanges_to_drop(self, text: str) -> int:
        """The fewest oldest exchanges whose removal makes room (all of them if none does);
        a message too long even alone raises ContextOverflowError."""
        system = self._system_messages()
        for count in range(1, len(self.exchanges) + 1):
            history = system + messages_of(self.exchanges[count:])
            if self._fits(self.model.chat_format.encode(history + [user_message(text)])):
                return count
        alone = len(self.model.chat_format.encode(system + [user_message(text)]))
        if alone >= self.capacity:
            with_system = " with the system prompt" if system else ""
            raise ContextOverflowError(
                f"that message is {alone} tokens long{with_system}, more than the context of "
                f"{self.capacity} tokens: shorten it, or start llama-chat with a larger --ctx-size"
            )
        return len(self.exchanges)

    def _plan(self, text: str) -> TurnPlan:
        history = self.messages()
        rendered = self.model.chat_format.encode(history + [user_message(text)])
        if self.ids is None:
            self._rebuild_ids()
        return plan_turn(self.model.chat_format, history, rendered, self.ids)

    def _rebuild_ids(self) -> None:
        """Ids for every message from renders of the conversation; left unknown if the
        format lacks the prefix property. Other versions' ids followed what came before
        them: they are rendered anew when followed."""
        for exchange in self.exchanges:
            _forget_ids(exchange.others)
        rendered = rendered_ids(self.model.chat_format, self._system_messages(), self.exchanges)
        if rendered is None:
            self.head_ids = None
            return
        self.head_ids, segments = rendered
        for exchange, (user_ids, reply_ids) in zip(self.exchanges, segments):
            exchange.user_ids, exchange.reply_ids = user_ids, reply_ids

    def _trim_cache(self) -> None:
        """Forget cached positions past what the conversation still holds."""
        ids = self.ids
        if ids is not None:
            self.cache.keep_common_prefix(ids)

    # Saving and opening

    def save(self, path: str | Path, cache_limit_bytes: int | None = None) -> tuple[Path, int]:
        """Write the conversation, its token ids, the settings and the model path (see
        conversation_file), and beside it the cache of the positions it holds (see
        cache_file) unless that would take more than cache_limit_bytes. Returns the path
        and how many positions the cache file holds."""
        path = expanded(path)
        model = {"path": self.model_path, "name": self.model.name, "chat_format": self.model.chat_format.name,
                 "vocab_size": self.model.tokenizer.vocab_size}
        write_conversation(path, SavedConversation(self.system, self.exchanges, self.head_ids, self.settings, model))
        ids = self.ids
        try:
            cached = save_cache(cache_path(path), self.cache, ids or [], self._cache_depends_on(), cache_limit_bytes)
        except Exception as error:  # noqa: BLE001 (a full disk, a folder in the way: the text is saved)
            reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
            raise LlamaChatError(f"saved {path}, but not its cache: {cache_path(path)}: {reason}") from None
        return path, cached

    def open(self, path: str | Path) -> str | None:
        """Replace the conversation and settings with a saved one, and the cache with the one
        saved beside it when it stands for this conversation on this model. Returns a note
        when something could not be kept: token ids rebuilt for another model, or the
        cache not used (the conversation is then read again on the next turn)."""
        path = expanded(path)
        saved = read_conversation(path)
        exchanges, head_ids = saved.exchanges, saved.head_ids
        same_model = self._is_same_model(saved.model)
        if not same_model:  # another tokenizer's ids mean nothing here
            head_ids = None
            _forget_ids([exchanges])
        self.system, self.exchanges, self.settings, self.head_ids = saved.system, exchanges, saved.settings, head_ids
        self.setting_sources = {field.name: "saved conversation" for field in dataclasses.fields(SamplingSettings)}
        notes = [saved.note] if saved.note else []
        if not self._ids_hold_the_text():  # ids by hand, or for other text: the model is to read what is shown
            if same_model and self.ids is not None and exchanges:
                notes.append(f"{path}: its token ids do not hold its text; they were rebuilt from the text")
            self._rebuild_ids()
        self._trim_cache()
        if not same_model:
            saved_name = saved.model.get("path") or saved.model.get("name") or "an unknown model"
            notes.append(f"{path} was saved with {saved_name}; its token ids were rebuilt for {self.model.name}")
        saved_cache = cache_path(path)
        if saved_cache.exists() and not same_model:
            notes.append("its saved cache was not used (it was made with another model)")
        elif saved_cache.exists() and self.ids is not None:
            try:
                restore_cache(saved_cache, self.cache, self.ids, self._cache_depends_on())
            except CacheNotUsed as reason:
                notes.append(f"its saved cache was not used ({reason}): the conversation is read again")
        return "; ".join(notes) or None

    def _cache_depends_on(self) -> dict:
        if self._model_source is None:  # once per model: saves happen after every input
            self._model_source = cache_model_source(self.model, self.model_path)
        return cache_identity(self.model, self._model_source, self.system)

    def _is_same_model(self, saved: dict) -> bool:
        return (
            saved.get("path") == self.model_path
            and saved.get("chat_format") == self.model.chat_format.name
            and saved.get("vocab_size") == self.model.tokenizer.vocab_size
        )

    def _ids_hold_the_text(self) -> bool:
        """Whether the ids are known, in the vocabulary and hold the conversation's text (with
        no exchange, the ids are only the system prompt's: rendered anew, as cheap as checked)."""
        ids = self.ids
        return (
            ids is not None and bool(self.exchanges)
            and all(0 <= token < self.model.tokenizer.vocab_size for token in ids)
            and ids_hold_text(self.system, self.exchanges, self.head_ids, self.model.tokenizer.decode)
        )


def _forget_ids(versions: list[list[Exchange]]) -> None:
    """Mark the ids of every exchange of these versions (and of theirs) unknown."""
    for version in versions:
        for exchange in all_exchanges(version):
            exchange.user_ids = exchange.reply_ids = None


def _absolute(path: str | Path | None) -> str | None:
    return str(expanded(path).absolute()) if path is not None else None
