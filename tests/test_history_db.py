"""The conversation history in SQLite: saving, listing, searching whatever is typed, and
every fault one line with the history still usable (or left alone when it is not ours)."""

import hashlib
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llama_chat.chat import history_db
from llama_chat.chat.history_db import (
    ConversationRecord,
    HistoryDatabase,
    HistoryError,
    HistoryUnavailable,
    fts_query,
)
from llama_chat.paths import history_database_path

CHECKOUT = Path(__file__).resolve().parent.parent


def record(*texts: str, model: str = "tiny") -> ConversationRecord:
    """A conversation of these messages, user and assistant in turn."""
    messages = [("user" if number % 2 == 0 else "assistant", text) for number, text in enumerate(texts)]
    document = json.dumps({"messages": [{"role": role, "content": content} for role, content in messages]})
    return ConversationRecord(model, texts[0], len(texts) // 2, 10 * len(texts), document, messages)


def checked(path: Path) -> None:
    """The database and its full-text index are whole."""
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        connection.execute("INSERT INTO message_text (message_text) VALUES ('integrity-check')")


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "state" / "llama-chat" / "history.sqlite3"


@pytest.fixture
def database(path):
    with HistoryDatabase.open(path) as database:
        yield database


def test_the_history_lives_in_the_state_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert history_database_path() == tmp_path / "llama-chat" / "history.sqlite3"


def test_a_new_history_is_private_in_wal_mode_at_schema_1(path):
    with HistoryDatabase.open(path) as database:
        assert database.note is None
        database.save(None, record("hello", "hi"))
        files = {file.name: stat.S_IMODE(file.stat().st_mode) for file in path.parent.iterdir()}
        assert files == {"history.sqlite3": 0o600, "history.sqlite3-wal": 0o600, "history.sqlite3-shm": 0o600}
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA user_version").fetchone() == (1,)
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
        assert {"conversations", "messages", "message_text"} <= tables


def test_a_save_writes_the_conversation_and_replaces_its_messages(database, path):
    first = database.save(None, record("how do lighthouses work", "with a lamp and a lens"))
    other = database.save(None, record("a second chat", "indeed"))
    assert first != other
    # /edit changed the first message: the whole conversation is written again
    edited = record("how do windmills work", "the wind turns the sails", "and pumps?", "they lift water")
    assert database.save(first, edited) == first
    stored = database.load(first)
    assert (stored.document, stored.title, stored.exchanges, stored.model) == (
        edited.document, "how do windmills work", 2, "tiny")
    assert stored.updated >= stored.created
    assert database.search("lighthouses") == []
    assert [match.id for match in database.search("windmills")] == [first]
    assert database.load(12345) is None
    checked(path)


def test_listing_is_newest_first_and_carries_the_start_of_the_first_message(database):
    ids = [database.save(None, record(f"chat number {number} " + "long " * 100, "ok")) for number in range(5)]
    database.save(ids[1], record("chat number 1 again", "ok", "more", "fine"))
    listed = database.recent(3)
    assert [entry.id for entry in listed] == [ids[1], ids[4], ids[3]]
    assert database.last() == ids[1]
    assert len(database.recent()[1].title) == history_db.TITLE_SHOWN
    assert database.load(ids[4]).title.endswith("long ")  # all of it, read back whole


def test_an_empty_history(database):
    assert database.recent() == [] and database.last() is None and database.search("anything") == []
    assert database.find("1") is None and database.find("words") is None
    assert database.clear() == 0 and database.remove(1) is False


def test_search_finds_conversations_holding_every_word_best_first_with_a_snippet(database):
    once = database.save(None, record("tell me about the weather in " + "many words " * 40 + "Lisbon", "sunny"))
    often = database.save(None, record("Lisbon Lisbon Lisbon", "Lisbon is lovely"))
    database.save(None, record("nothing here", "at all"))
    found = database.search("lisbon")
    assert [match.id for match in found] == [often, once]
    assert "Lisbon" in found[0].snippet and len(found[1].snippet) < 200
    assert [match.id for match in database.search("weather LISBON")] == [once]
    assert database.search("weather lovely") == []  # every word, in one message
    assert [match.id for match in database.search("lisbon", limit=1)] == [often]


HOSTILE = ['"', '""', '"unbalanced', 'NEAR(', 'NEAR(a b', '*', 'a*', '-', '-lisbon', ':', 'content:x', 'AND',
           'OR', 'NOT', 'a AND', 'OR b', 'NOT NOT', '^', '^start', '(', ')', '(()', '{col}', '+', '\\', "'",
           '\x00', 'nul\x00in', '\ud800', '\x1b[2J', '   ', '', '...', 'NEAR("a" "b", 2)']


@pytest.mark.parametrize("text", HOSTILE)
def test_whatever_is_typed_is_a_search_and_never_an_error(database, text):
    database.save(None, record('say "hello" AND goodbye', "NEAR(x y) or NOT: a-b * ^c"))
    assert isinstance(database.search(text), list)
    assert isinstance(database.find(text), (int, type(None)))


def test_fts_syntax_is_searched_as_words(database):
    quoted = database.save(None, record('say "hello" AND goodbye', "fine"))
    near = database.save(None, record("NEAR(x y) or NOT: a-b", "ok"))
    assert [match.id for match in database.search('"hello"')] == [quoted]
    assert [match.id for match in database.search("AND")] == [quoted]
    assert [match.id for match in database.search("NOT: NEAR(")] == [near]
    assert [match.id for match in database.search("a-b")] == [near]  # the phrase "a b"
    assert database.search("*") == [] and database.search("- ^ ( ) :") == []  # nothing to search for


def test_non_ascii_text_is_found(database):
    conversation = database.save(None, record("café in der Straße", "日本語 のテキスト", "Ελληνικά", "ok"))
    for words in ("café", "CAFÉ", "straße", "Ελληνικά", "のテキスト"):
        assert [match.id for match in database.search(words)] == [conversation], words


def test_a_huge_search_reads_a_bounded_query(database):
    wanted = database.save(None, record("alpha beta", "gamma"))
    assert [match.id for match in database.search("alpha " * 25_000 + "missing")] == [wanted]  # past the cap
    assert database.search("missing " + "alpha " * 25_000) == []
    assert database.search("alpha" + "x" * 100_000) == []
    assert [match.id for match in database.search("Alpha alpha ALPHA " * 30_000)] == [wanted]
    query = fts_query(" ".join(f"w{number}" for number in range(1000)) + " " + "y" * 100_000)
    assert query.count('"') == 2 * history_db.MAX_SEARCH_WORDS
    assert fts_query('a"b ' + "z" * 500) == '"a""b" "' + "z" * history_db.MAX_WORD_CHARACTERS + '"'
    assert fts_query("x\ud800y \x00") == '"xy"' and fts_query(" \t\n") == ""


def test_find_takes_an_id_then_words(database):
    first = database.save(None, record("the 1984 novel", "by Orwell"))
    second = database.save(None, record("orwell again", "yes"))
    assert database.find(str(first)) == first and database.find(f" {second} ") == second
    assert database.find("1984") == first  # no conversation 1984: the words
    assert database.find("orwell") in (first, second)
    assert database.find("99999999999999999999999") is None and database.find("missing") is None


def test_remove_clear_and_mark_opened(database, path):
    ids = [database.save(None, record(f"topic{number} shared", "reply")) for number in range(4)]
    assert database.remove(ids[0]) is True and database.remove(ids[0]) is False
    assert database.search("topic0") == [] and len(database.search("shared")) == 3
    assert database.load(ids[1]).last_opened is None
    database.mark_opened(ids[1])
    assert database.load(ids[1]).last_opened >= database.load(ids[1]).updated
    assert database.clear() == 3
    assert database.recent() == [] and database.search("shared") == []
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM messages").fetchone() == (0,)
    checked(path)


def test_a_conversation_removed_while_its_chat_goes_on_comes_back_under_its_id(database):
    kept = database.save(None, record("still talking", "yes"))
    database.clear()
    newer = database.save(None, record("another chat", "fine"))
    assert newer != kept  # ids are never reused
    assert database.save(kept, record("still talking", "yes", "more", "ok")) == kept
    assert database.load(kept).exchanges == 2


def test_correct_at_scale(database, monkeypatch):
    ids = []
    for number in range(1500):
        rare = " zanzibar" if number % 500 == 7 else ""
        ids.append(database.save(None, record(f"question {number} about the sea", f"the answer{rare}", "and?", "so")))
    assert [entry.id for entry in database.recent(20)] == ids[::-1][:20]
    assert sorted(match.id for match in database.search("zanzibar")) == [ids[7], ids[507], ids[1007]]
    common = database.search("the sea")
    assert len(common) == 20 and len({match.id for match in common}) == 20
    monkeypatch.setattr(history_db, "RANKED_AT_MOST", 100)  # a word too common: the newest are ranked
    assert min(match.id for match in database.search("the")) > ids[-100]


def test_a_file_that_is_not_a_database_is_moved_aside_and_a_new_one_started(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all " * 500)
    (path.parent / "history.sqlite3-wal").write_bytes(b"stale")
    with HistoryDatabase.open(path) as database:
        assert "moved to history.sqlite3.corrupt-" in database.note and str(path) in database.note
        assert "\n" not in database.note
        database.save(None, record("fresh", "start"))
        assert [entry.title for entry in database.recent()] == ["fresh"]
    aside = [file for file in path.parent.iterdir() if ".corrupt-" in file.name]
    assert len(aside) == 1 and re.fullmatch(r"history\.sqlite3\.corrupt-\d{8}T\d{6}Z", aside[0].name)
    assert aside[0].read_bytes().startswith(b"not a database")  # SQLite dropped the stale -wal on reading it
    checked(path)


def test_a_truncated_database_is_moved_aside(path):
    with HistoryDatabase.open(path) as database:
        for number in range(300):
            database.save(None, record(f"message {number} " + "words " * 50, "reply " * 50))
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size // 2)
    with HistoryDatabase.open(path) as database:
        assert database.note and "moved to" in database.note
        assert database.recent() == []
    checked(path)


def test_another_programs_database_is_not_taken_for_a_history(path):
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    connection.close()
    with HistoryDatabase.open(path) as database:
        assert "not a llama-chat history" in database.note
        assert database.recent() == []


def test_a_history_from_a_newer_llama_chat_is_left_alone(path):
    with HistoryDatabase.open(path) as database:
        database.save(None, record("kept", "safe"))
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA user_version = 7")
    connection.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(HistoryUnavailable) as raised:
        HistoryDatabase.open(path)
    message = str(raised.value)
    assert "written by a newer llama-chat (schema 7); history is off for this run" in message
    assert str(path) in message and "\n" not in message
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert [file.name for file in path.parent.iterdir()] == ["history.sqlite3"]


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(HistoryUnavailable, match="history is off for this run"):
        HistoryDatabase.open(tmp_path / "file" / "llama-chat" / "history.sqlite3")


def test_a_full_disk_fails_the_save_in_one_line_and_the_history_stays_usable(database, path):
    kept = database.save(None, record("before the disk filled", "fine"))
    pages = database._connection.execute("PRAGMA page_count").fetchone()[0]
    database._connection.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(HistoryError) as raised:
        database.save(kept, record("before the disk filled", "fine", "a long one " * 5000, "x"))
    assert "database or disk is full" in str(raised.value) and "free some space" in str(raised.value)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    assert database.load(kept).exchanges == 1 and [m.id for m in database.search("filled")] == [kept]
    database._connection.execute("PRAGMA max_page_count = 1000000")
    assert database.save(kept, record("before the disk filled", "fine", "a long one " * 5000, "x")) == kept
    assert database.load(kept).exchanges == 2
    checked(path)


def test_a_database_that_cannot_be_written_fails_the_save_in_one_line(database, path):
    kept = database.save(None, record("read only", "now"))
    database._connection.execute("PRAGMA query_only = ON")  # what a read-only file or folder gives
    with pytest.raises(HistoryError, match="readonly database.*writable"):
        database.save(kept, record("read only", "now", "more", "ok"))
    with pytest.raises(HistoryError):
        database.clear()
    assert [entry.id for entry in database.recent()] == [kept] and database.load(kept).exchanges == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder and file regardless")
def test_a_read_only_folder(path):
    with HistoryDatabase.open(path) as database:
        kept = database.save(None, record("kept", "here"))
    path.chmod(0o400)
    path.parent.chmod(0o500)
    try:
        with pytest.raises(HistoryError, match="history"):
            with HistoryDatabase.open(path) as database:
                database.save(kept, record("kept", "here", "more", "ok"))
    finally:
        path.parent.chmod(0o700)
        path.chmod(0o600)


SAVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from llama_chat.chat.history_db import ConversationRecord, HistoryDatabase
    path, name, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    sys.stdin.readline()  # wait for the word to start, so both write at once
    with HistoryDatabase.open(path) as database:
        growing = None
        for number in range(count):
            messages = [("user", f"{name} question {number}"), ("assistant", "answer " * 200)]
            grown = [(role, f"{name} long {turn}") for turn in range(number + 1) for role in ("user", "assistant")]
            made = database.save(None, ConversationRecord(name, messages[0][1], 1, 1, "{}", messages))
            growing = database.save(growing, ConversationRecord(name, grown[0][1], number + 1, 1, "{}", grown))
            print(made, growing, number + 1, flush=True)
""")


def savers(path: Path, names: list[str], count: int) -> list[subprocess.Popen]:
    environment = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    return [subprocess.Popen([sys.executable, "-c", SAVER, str(path), name, str(count)], env=environment,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for name in names]


def test_two_chats_save_at_once(path):
    HistoryDatabase.open(path).close()
    children = savers(path, ["first", "second"], 50)
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        output, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        assert len(output.splitlines()) == 50
    checked(path)
    with HistoryDatabase.open(path) as database:
        for name in ("first", "second"):
            assert len(database.search(f"{name} question", limit=100)) == 50
            grown = database.search(f"{name} long", limit=100)
            assert len(grown) == 1 and grown[0].exchanges == 50
        assert len(database.recent(1000)) == 102


def test_a_chat_killed_while_saving_leaves_every_committed_save_whole(path):
    HistoryDatabase.open(path).close()
    child, = savers(path, ["killed"], 100_000)
    child.stdin.write("go\n")
    child.stdin.flush()
    committed = [child.stdout.readline().split() for _ in range(60)]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    checked(path)
    with HistoryDatabase.open(path) as database:
        for made, growing, exchanges in committed:
            assert database.load(int(made)).exchanges == 1
            stored = database.load(int(growing))
            assert stored.exchanges >= int(exchanges)
        with sqlite3.connect(path) as connection:  # each conversation's messages are its last save's
            counts = connection.execute(
                "SELECT conversations.exchanges * 2, count(messages.id) FROM conversations "
                "JOIN messages ON messages.conversation = conversations.id GROUP BY conversations.id").fetchall()
        assert counts and all(expected == found for expected, found in counts)
