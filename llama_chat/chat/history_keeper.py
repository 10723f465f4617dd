"""The chat's conversation kept in the history (see history_db) after every input, and any
kept conversation opened again.

The conversation is written whole, in one transaction, from its first exchange on; a
chat with no message leaves nothing. Beside the database, `caches/ID.kv.safetensors`
holds the KV cache of each recent conversation (as /save writes one beside its file), so
that reopening it feeds nothing again; together they stay within a budget (2 GB by
default), the least recently used dropped first. A conversation whose cache is gone is
read again by the model on its next message.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from llama_chat.chat.cache_file import cache_path
from llama_chat.chat.conversation_file import (
    SavedConversation,
    conversation_document,
    parse_conversation,
    read_conversation,
)
from llama_chat.chat.display import literal
from llama_chat.chat.exchange import Exchange
from llama_chat.chat.history_db import ConversationRecord, HistoryDatabase, HistoryEntry, HistoryError, HistoryMatch
from llama_chat.chat.session import Session
from llama_chat.errors import LlamaChatError
from llama_chat.paths import history_caches_path

CACHE_BUDGET = 2 << 30  # the kept caches together, at most (bytes)
CONVERSATION_CACHE_LIMIT = 256 << 20  # one conversation's kept cache, at most (bytes)


class HistoryKeeper:
    """Keeps one chat's conversation under `conversation_id` (None until its first exchange)."""

    def __init__(self, database: HistoryDatabase, caches: Path, budget: int = CACHE_BUDGET) -> None:
        self.database = database
        self.caches = caches
        self.budget = budget
        self.conversation_id: int | None = None
        self.on = True  # /history off stops it, and removes what it kept of this conversation

    def cache_path(self, conversation_id: int) -> Path:
        return self.caches / f"{conversation_id}.kv.safetensors"

    def keep(self, session: Session) -> None:
        """Write the conversation and its cache; HistoryError in one line where it cannot."""
        if not self.on or not session.conversation.exchanges:
            return
        record = _record(session.saved(), session.model.name, len(session.transcript.ids or []))
        self.conversation_id = self.database.save(self.conversation_id, record)
        try:
            self.caches.mkdir(mode=0o700, parents=True, exist_ok=True)
            session.save_cache(self.cache_path(self.conversation_id), CONVERSATION_CACHE_LIMIT)
        except (LlamaChatError, OSError) as error:
            raise HistoryError(f"the conversation is kept, but not its cache: {error}") from None
        self._within_budget()

    def open(self, session: Session, conversation_id: int) -> str:
        """Continue kept conversation `conversation_id` in `session`; a line saying what it held."""
        stored = self.database.load(conversation_id)
        if stored is None:
            raise LlamaChatError(f"there is no conversation {conversation_id} in the history: "
                                 "`llama-chat history` lists them")
        where = f"conversation {conversation_id} of the history"
        cache = self.cache_path(conversation_id)
        had_cache = cache.exists()
        note = session.open_kept(parse_conversation(stored.document, where), where, cache)
        self.conversation_id, self.on = conversation_id, True
        self.database.mark_opened(conversation_id)
        if had_cache:
            cache.touch()  # recently used: the last the budget drops
        elif session.conversation.exchanges:
            note = note or (f"its cache is no longer kept: the model reads its {len(session.transcript.ids or [])} "
                            "tokens again on the next message")
        count = len(session.conversation.exchanges)
        return (f"{where}: {count} exchange{'s' * (count != 1)}, {len(session.cache)} tokens cached"
                + (f"; {note}" if note else ""))

    def forget(self) -> None:
        """Stop keeping this conversation, and remove what was kept of it."""
        self.on = False
        if self.conversation_id is not None:
            self.database.remove(self.conversation_id)
            self.cache_path(self.conversation_id).unlink(missing_ok=True)
            self.conversation_id = None

    def _within_budget(self) -> None:
        """Drop the least recently used caches until they fit the budget together."""
        files = []
        for path in self.caches.glob("*.kv.safetensors"):
            try:  # another chat may drop one meanwhile
                status = path.stat()
            except OSError:
                continue
            files.append((status.st_mtime, status.st_size, path))
        total = 0
        for _, size, path in sorted(files, reverse=True):
            total += size
            if total > self.budget and path != self.cache_path(self.conversation_id):
                path.unlink(missing_ok=True)


def _record(saved: SavedConversation, model: str, tokens: int) -> ConversationRecord:
    """What the history keeps of a conversation: its document, and its messages to search."""
    exchanges = saved.earlier + saved.exchanges
    return ConversationRecord(
        model=model, title=exchanges[0].user, exchanges=len(exchanges), tokens=tokens,
        document=conversation_document(saved), messages=_messages(saved.system, exchanges),
    )


def _messages(system: str | None, exchanges: list[Exchange]) -> list[tuple[str, str]]:
    """What a search reads: the system prompt, and each exchange's message, calls' text and reply."""
    messages = [("system", system)] if system else []
    for exchange in exchanges:
        messages.append(("user", exchange.user))
        messages += [("assistant", tool_round.text) for tool_round in exchange.rounds if tool_round.text]
        messages.append(("assistant", exchange.reply))
    return messages


def import_kept_conversation(database: HistoryDatabase, path: Path) -> str | None:
    """Move the conversation an earlier llama-chat kept for --resume (a conversation file at
    `path`, its cache beside it) into the history; a note of what became of it."""
    if not path.is_file():
        return None
    try:
        saved = read_conversation(path)
    except LlamaChatError as error:
        return f"the conversation an earlier llama-chat kept for --resume stays where it is: {error}"
    if not saved.exchanges:
        path.unlink()
        return None
    model = str(saved.model.get("name") or saved.model.get("path") or "")
    conversation_id = database.save(None, _record(saved, model, tokens=0))
    path.unlink()
    cache_path(path).unlink(missing_ok=True)
    return f"the conversation an earlier llama-chat kept for --resume is conversation {conversation_id} of the history"


def remove_cache(conversation_id: int | None = None) -> None:
    """Remove a removed conversation's kept cache (None: every one)."""
    caches = history_caches_path()
    pattern = "*.kv.safetensors" if conversation_id is None else f"{conversation_id}.kv.safetensors"
    for path in caches.glob(pattern) if caches.is_dir() else ():
        path.unlink(missing_ok=True)


def listed(entries: Sequence[HistoryEntry]) -> list[str]:
    """Conversations as listed, a line each after a heading; found ones each with their
    snippet below, and no heading."""
    width = max(2, *(len(str(entry.id)) for entry in entries))
    found = any(isinstance(entry, HistoryMatch) for entry in entries)
    lines = [] if found else [f"{'id':>{width}}  {'when':16}  {'model':20}  {'exch.':>5}  first message"]
    columns = shutil.get_terminal_size().columns
    for entry in entries:
        lines.append(_row(entry, width))
        if isinstance(entry, HistoryMatch):
            lines.append(f"{'':{width}}  {one_line(entry.snippet, max(20, columns - width - 3))}")
    return lines


def _row(entry: HistoryEntry, width: int) -> str:
    """id, when it was last changed (local time), model, exchanges and the first message,
    on one line the terminal's width, every character shown as it is spelt."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.updated))
    start = f"{entry.id:>{width}}  {when:16}  {one_line(entry.model, 20):20}  {entry.exchanges:>5}  "
    return start + one_line(entry.title, max(20, shutil.get_terminal_size().columns - len(start) - 1))


def one_line(text: str, width: int) -> str:
    """Text on one line (its spaces and line breaks made single spaces), cut to `width`
    characters, those that do not print written as escapes."""
    text = " ".join(text.split())
    return literal(text if len(text) <= width else text[: width - 3] + "...")
