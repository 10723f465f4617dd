"""The conversations kept in one SQLite database, to list, search and reopen.

The chat saves its conversation after every exchange (`save`, the whole conversation each
time: /undo, /edit and /retry change earlier messages), and --resume finds one (`find` by
id or words, `last` for the newest), reads it back (`load`) and marks it opened
(`mark_opened`). `llama-chat history` lists (`recent`), searches (`search`) and removes
(`remove`, `clear`).

Plain SQL that people can query themselves: `conversations` (one row a conversation, its
JSON document as /save writes it in `document`), `messages` (one row a message) and
`message_text`, a full-text index (FTS5) over the messages' content that triggers keep.
WAL mode with a busy timeout, so two chats save to it at once. The schema's version is
`PRAGMA user_version`.

Every fault is one line (HistoryError) and the chat goes on: a file that is not a database,
or a damaged one, is moved aside and a new one started (`note` says so); one written by a
newer llama-chat is left alone (HistoryUnavailable).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from llama_chat.errors import LlamaChatError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 5000
MAX_SEARCH_WORDS, MAX_WORD_CHARACTERS = 32, 100  # what a search reads of what was typed
TITLE_SHOWN = 200  # the characters of the first message a listing carries
RANKED_AT_MOST = 10_000  # the matching messages a search ranks, the newest

_PRIVATE_FILE, _PRIVATE_FOLDER = 0o600, 0o700


class HistoryError(LlamaChatError):
    """The history could not be read or written; the chat goes on without it."""


class HistoryUnavailable(HistoryError):
    """The history cannot be opened at all this run."""


@dataclasses.dataclass(frozen=True)
class ConversationRecord:
    """What `save` writes of a conversation."""

    model: str
    title: str  # the first user message
    exchanges: int
    tokens: int
    document: str  # the conversation's JSON document, as /save writes it
    messages: list[tuple[str, str]]  # (role, content), in order


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """A conversation as a listing shows it (times in unix seconds)."""

    id: int
    created: float
    updated: float
    last_opened: float | None
    model: str
    title: str  # the first user message, its first TITLE_SHOWN characters in a listing
    exchanges: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class HistoryMatch(HistoryEntry):
    """A conversation a search found, with a short piece of its best matching message."""

    snippet: str = ""


@dataclasses.dataclass(frozen=True)
class StoredConversation(HistoryEntry):
    """A conversation read back whole."""

    document: str = ""


_VERSION_1 = [
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a chat's id stays its own
        created REAL NOT NULL,
        updated REAL NOT NULL,
        last_opened REAL,
        model TEXT NOT NULL,
        title TEXT NOT NULL,
        exchanges INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        document TEXT NOT NULL
    )""",
    "CREATE INDEX conversations_by_updated ON conversations (updated)",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        UNIQUE (conversation, position)
    )""",
    "CREATE VIRTUAL TABLE message_text USING fts5 (content, content='messages', content_rowid='id')",
    """CREATE TRIGGER message_added AFTER INSERT ON messages BEGIN
        INSERT INTO message_text (rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER message_removed AFTER DELETE ON messages BEGIN
        INSERT INTO message_text (message_text, rowid, content) VALUES ('delete', old.id, old.content);
    END""",
]

# Each step's statements take the schema from its place in the list to the next version.
_MIGRATIONS = [_VERSION_1]

_ENTRY_COLUMNS = ("conversations.id, created, updated, last_opened, model, substr(title, 1, ?), exchanges, "
                  "tokens")
_ADVICE = {
    sqlite3.SQLITE_FULL: "free some space on its disk",
    sqlite3.SQLITE_READONLY: "make it and its folder writable",
    sqlite3.SQLITE_CANTOPEN: "make its folder writable",
    sqlite3.SQLITE_PERM: "make it and its folder writable",
    sqlite3.SQLITE_BUSY: "another llama-chat held it too long; try again",
}


class HistoryDatabase:
    """The history at one path; `note` says what opening it found wrong, if anything."""

    def __init__(self, path: Path, connection: sqlite3.Connection, note: str | None) -> None:
        self.path, self.note = path, note
        self._connection = connection

    @classmethod
    def open(cls, path: Path) -> HistoryDatabase:
        """The history at `path`, made if there is none (its folder private, itself the
        user's alone); a damaged one moved aside, a new one started and `note` saying so.
        HistoryUnavailable when it cannot be opened: one from a newer llama-chat, a folder
        that cannot be written."""
        try:
            path.parent.mkdir(mode=_PRIVATE_FOLDER, parents=True, exist_ok=True)
        except OSError as error:
            raise HistoryUnavailable(f"cannot make the history's folder {path.parent} "
                                     f"({error.strerror or error}); history is off for this run") from None
        try:
            return cls(path, _opened(path), None)
        except sqlite3.DatabaseError as error:
            if not _damaged(error):
                raise _unavailable(path, error) from None
            reason = _reason(error)
        except OSError as error:
            raise _unavailable(path, error) from None
        aside = _move_aside(path)
        note = f"the history {path} could not be read ({reason}); it was moved to {aside.name} and a new one started"
        try:
            return cls(path, _opened(path), note)
        except (sqlite3.DatabaseError, OSError) as error:
            raise _unavailable(path, error) from None

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> HistoryDatabase:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def save(self, conversation_id: int | None, record: ConversationRecord) -> int:
        """Write the conversation and replace its messages, in one transaction; its id (a new
        one for None). A conversation removed meanwhile comes back under its id."""
        now = time.time()
        values = (now, now, record.model, record.title, record.exchanges, record.tokens, record.document)
        with self._failing("save the conversation to"), self._transaction() as connection:
            if conversation_id is None:
                conversation_id = connection.execute(
                    "INSERT INTO conversations (created, updated, model, title, exchanges, tokens, document) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", values).lastrowid
            else:
                connection.execute(
                    "INSERT INTO conversations (id, created, updated, model, title, exchanges, tokens, document) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET updated = excluded.updated, "
                    "model = excluded.model, title = excluded.title, exchanges = excluded.exchanges, "
                    "tokens = excluded.tokens, document = excluded.document", (conversation_id, *values))
            connection.execute("DELETE FROM messages WHERE conversation = ?", (conversation_id,))
            connection.executemany(
                "INSERT INTO messages (conversation, position, role, content) VALUES (?, ?, ?, ?)",
                [(conversation_id, place, role, content) for place, (role, content) in enumerate(record.messages)],
            )
        return conversation_id

    def recent(self, limit: int = 20) -> list[HistoryEntry]:
        """The `limit` most recently updated conversations, newest first."""
        with self._failing("read"):
            rows = self._connection.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM conversations ORDER BY updated DESC, id DESC LIMIT ?",
                (TITLE_SHOWN, limit),
            ).fetchall()
        return [HistoryEntry(*row) for row in rows]

    def search(self, words: str, limit: int = 20) -> list[HistoryMatch]:
        """The conversations whose messages hold every word typed, best first (bm25), each with
        a snippet of its best matching message. Any text is a search: FTS5's syntax is taken
        as words, and text with nothing to search for finds nothing. Of the messages that
        match, the newest RANKED_AT_MOST are ranked: a word in more is too common to rank by."""
        query = fts_query(words)
        if not query or limit < 1:
            return []
        with self._failing("search"):
            connection = self._connection
            oldest = connection.execute(  # the oldest message ranked (message ids only grow)
                "SELECT rowid FROM message_text WHERE message_text MATCH ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
                (query, RANKED_AT_MOST - 1)).fetchone()
            # Messages best first (FTS5 ranks them all, then makes a snippet of each one read).
            rows = connection.execute(
                f"SELECT {_ENTRY_COLUMNS}, snippet(message_text, 0, '', '', '...', 12) FROM message_text "
                "JOIN messages ON messages.id = message_text.rowid JOIN conversations ON conversations.id = "
                "messages.conversation WHERE message_text MATCH ? AND message_text.rowid >= ? "
                "ORDER BY message_text.rank",
                (TITLE_SHOWN, query, oldest[0] if oldest else 0))
            found: dict[int, HistoryMatch] = {}
            for *entry, snippet in rows:
                found.setdefault(entry[0], HistoryMatch(*entry, snippet=snippet))
                if len(found) == limit:
                    break
            rows.close()
        return list(found.values())

    def load(self, conversation_id: int) -> StoredConversation | None:
        """The conversation with its document, or None when there is none of that id."""
        with self._failing("read"):
            row = self._connection.execute(
                "SELECT id, created, updated, last_opened, model, title, exchanges, tokens, document "
                "FROM conversations WHERE id = ?", (conversation_id,),
            ).fetchone()
        return None if row is None else StoredConversation(*row)

    def last(self) -> int | None:
        """The id of the most recently updated conversation, if any."""
        with self._failing("read"):
            row = self._connection.execute(
                "SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return None if row is None else row[0]

    def find(self, text: str) -> int | None:
        """The conversation `text` names: its id when it is one's, else the best search match."""
        if text.strip().isdecimal() and text.strip().isascii() and len(text.strip()) < 19:
            with self._failing("read"):
                if self._connection.execute("SELECT 1 FROM conversations WHERE id = ?", (int(text),)).fetchone():
                    return int(text)
        found = self.search(text, limit=1)
        return found[0].id if found else None

    def remove(self, conversation_id: int) -> bool:
        """Remove a conversation and its messages; whether there was one."""
        with self._failing("remove a conversation from"), self._transaction() as connection:
            return connection.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0

    def clear(self) -> int:
        """Remove every conversation; how many there were."""
        with self._failing("clear"), self._transaction() as connection:
            connection.execute("DELETE FROM messages")
            return connection.execute("DELETE FROM conversations").rowcount

    def mark_opened(self, conversation_id: int) -> None:
        """Note that the conversation was opened again now."""
        with self._failing("write"), self._transaction() as connection:
            connection.execute("UPDATE conversations SET last_opened = ? WHERE id = ?", (time.time(), conversation_id))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock first (waiting up to the busy
        timeout for another writer); rolled back when anything fails."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            if connection.in_transaction:  # SQLite has already rolled back after some errors
                connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    @contextlib.contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        """SQLite's errors as one line naming the file and what to do."""
        try:
            yield
        except sqlite3.Error as error:
            raise HistoryError(f"cannot {action} the history {self.path}: {_reason(error)}") from None
        except UnicodeEncodeError:
            raise HistoryError(f"cannot {action} the history {self.path}: the text holds characters that are "
                               "not text (lone surrogates)") from None


def fts_query(text: str) -> str:
    """Typed text as an FTS5 query that matches messages holding every word: each of the
    first MAX_SEARCH_WORDS words (once each, at most MAX_WORD_CHARACTERS characters each, without
    characters that are not text) a quoted string; '' when there is no word."""
    words = (word[:MAX_WORD_CHARACTERS].encode("utf-8", "ignore").decode("utf-8").replace("\x00", "")
             for word in text.split()[:MAX_SEARCH_WORDS])
    once = {word.lower(): word for word in words if word}  # a word twice is searched once
    return " ".join('"' + word.replace('"', '""') + '"' for word in once.values())


def _opened(path: Path) -> sqlite3.Connection:
    """A connection to the database at `path`, checked and at SCHEMA_VERSION; the file made
    (with its -wal and -shm) for the user alone. sqlite3.DatabaseError for a damaged file,
    HistoryUnavailable for one from a newer llama-chat or not llama-chat's."""
    previous = os.umask(0o077)
    try:
        connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)  # busy_timeout
    finally:
        os.umask(previous)
    try:
        os.chmod(path, _PRIVATE_FILE)
        problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError(f"quick_check: {problems[0]}")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryUnavailable(
                f"the history {path} was written by a newer llama-chat (schema {version}); history is off for "
                f"this run: update llama-chat, or move the file away to start a new history")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute("PRAGMA foreign_keys = ON")
        _migrate(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _migrate(connection: sqlite3.Connection) -> None:
    """Bring the schema to SCHEMA_VERSION, in one transaction (another process may be at it
    too: the version is read again under the write lock). A version 0 database must be
    empty: a file of another program's tables is not taken for a history."""
    if connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        tables = connection.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
        if version == 0 and tables:
            raise sqlite3.DatabaseError("a database that is not a llama-chat history")
        for step in _MIGRATIONS[version:]:
            for statement in step:
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _damaged(error: sqlite3.DatabaseError) -> bool:
    """Whether the file is damaged or not a database (rather than locked, unreadable...)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is None or code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _move_aside(path: Path) -> Path:
    """Move the database (with its -wal and -shm) to PATH.corrupt-<UTC time>; the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    number = 1
    while aside.exists():
        number += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{number}")
    try:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    except OSError as error:
        raise HistoryUnavailable(f"the history {path} is damaged and cannot be moved aside "
                                 f"({error.strerror or error}); history is off for this run: move it away") from None
    return aside


def _unavailable(path: Path, error: sqlite3.Error | OSError) -> HistoryUnavailable:
    reason = _reason(error) if isinstance(error, sqlite3.Error) else error.strerror or str(error)
    return HistoryUnavailable(f"cannot open the history {path}: {reason}; history is off for this run")


def _reason(error: sqlite3.Error) -> str:
    """SQLite's message, with what to do where that is known."""
    advice = _ADVICE.get((getattr(error, "sqlite_errorcode", None) or 0) & 0xFF)
    return f"{error} ({advice})" if advice else str(error)
