"""Saving a session and opening a saved one: the conversation file (see conversation_file)
and, beside it, the cache of the positions it holds (see cache_file)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llama_chat.chat.cache_file import CacheNotUsed, cache_path, restore_cache, save_cache
from llama_chat.chat.conversation_file import SavedConversation, read_conversation, write_conversation
from llama_chat.chat.running_model import RunningModel
from llama_chat.chat.spans import Spans
from llama_chat.chat.transcript import Transcript
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError, first_line
from llama_chat.paths import expanded


def save_session(
    transcript: Transcript, running: RunningModel, settings: SamplingSettings, path: str | Path,
    cache_limit_bytes: int | None = None, tools: Sequence[str] = (),
) -> tuple[Path, int]:
    """Write the conversation, its token ids, the settings, the model path and the names of
    the tools offered, and beside it the cache unless that would take more than
    cache_limit_bytes. Returns the path and how many positions the cache file holds."""
    path = expanded(path)
    write_conversation(path, saved_session(transcript, running, settings, tools))
    try:
        cached = save_session_cache(transcript, running, cache_path(path), cache_limit_bytes, tools)
    except LlamaChatError as error:
        raise LlamaChatError(f"saved {path}, but not its cache: {error}") from None
    return path, cached


def saved_session(
    transcript: Transcript, running: RunningModel, settings: SamplingSettings, tools: Sequence[str] = ()
) -> SavedConversation:
    """The conversation as a file or the history holds it."""
    conversation = transcript.conversation
    return SavedConversation(
        conversation.system, conversation.exchanges, transcript.head, transcript.spans, settings,
        running.described(), tools=list(tools), earlier=conversation.earlier, summary=conversation.summary,
    )


def save_session_cache(
    transcript: Transcript, running: RunningModel, path: Path, limit_bytes: int | None, tools: Sequence[str] = ()
) -> int:
    """Write the cache of the conversation's positions to `path` (see cache_file.save_cache)."""
    depends_on = running.cache_depends_on(transcript.conversation.system, tools)
    try:
        return save_cache(path, running.cache, transcript.ids or [], depends_on, limit_bytes)
    except Exception as error:  # noqa: BLE001 (a full disk, a folder in the way: the text is saved)
        reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
        raise LlamaChatError(f"{path}: {reason}") from None


def open_session(
    transcript: Transcript, running: RunningModel, path: str | Path, tools: Sequence[str] = ()
) -> tuple[SamplingSettings, str | None]:
    """Replace the conversation with a saved one, and the cache with the one saved beside
    it when it stands for this conversation on this model with the same tools offered.
    Returns the saved settings, and a note when something could not be kept: token ids
    rebuilt for another model, or the cache not used (the conversation is then read again
    on the next turn). The transcript renders ids anew with the tools now offered."""
    path = expanded(path)
    return open_saved(transcript, running, read_conversation(path), path, cache_path(path), tools)


def open_saved(
    transcript: Transcript, running: RunningModel, saved: SavedConversation, path: Path | str, saved_cache: Path,
    tools: Sequence[str] = (),
) -> tuple[SamplingSettings, str | None]:
    """Open a conversation read from `path` (a file, or the history's name for it), with
    the cache kept at `saved_cache` where it stands for it (see open_session)."""
    same_model = running.is_same_model(saved.model)
    conversation = transcript.conversation
    conversation.system, conversation.exchanges = saved.system, saved.exchanges
    conversation.earlier, conversation.summary = saved.earlier, saved.summary
    # Another tokenizer's ids mean nothing here; other tools offered begin the ids otherwise.
    kept = same_model and saved.tools == list(tools)
    transcript.take(saved.head_ids if kept else None, saved.spans if kept else Spans())
    notes = [saved.note] if saved.note else []
    tokenizer = running.model.tokenizer
    # ids by hand, or for other text: the model is to read what is shown
    if not transcript.holds_the_text(tokenizer.vocab_size, tokenizer.decode):
        if same_model and transcript.ids is not None and conversation.exchanges:
            notes.append(f"{path}: its token ids do not hold its text; they were rebuilt from the text")
        transcript.rerender()
    if transcript.ids is not None:  # cached positions past what the conversation holds go
        running.cache.keep_common_prefix(transcript.ids)
    if not same_model:
        saved_name = saved.model.get("path") or saved.model.get("name") or "an unknown model"
        notes.append(f"{path} was saved with {saved_name}; its token ids were rebuilt for {running.model.name}")
    notes += _restored_cache_notes(transcript, running, saved_cache, same_model, tools)
    return saved.settings, "; ".join(notes) or None


def _restored_cache_notes(
    transcript: Transcript, running: RunningModel, saved_cache: Path, same_model: bool, tools: Sequence[str]
) -> list[str]:
    """Restore the cache saved with the conversation where it can be; notes where not."""
    ids, system = transcript.ids, transcript.conversation.system
    if saved_cache.exists() and not same_model:
        return ["its saved cache was not used (it was made with another model)"]
    if saved_cache.exists() and ids is not None:
        try:
            restore_cache(saved_cache, running.cache, ids, running.cache_depends_on(system, tools))
        except CacheNotUsed as reason:
            return [f"its saved cache was not used ({reason}): the conversation is read again"]
    return []
