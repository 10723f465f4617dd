"""`llama-chat history`: listing, searching and removing the conversations kept, every
stranger's character shown as it is spelt, every fault one line."""

import json
import sqlite3
import subprocess
import sys

import pytest

from llama_chat.chat.history_db import ConversationRecord, HistoryDatabase
from llama_chat.cli.history import main
from llama_chat.paths import history_database_path


def save(*texts: str, model: str = "tiny-model") -> int:
    messages = [("user" if number % 2 == 0 else "assistant", text) for number, text in enumerate(texts)]
    document = json.dumps({"messages": [{"role": role, "content": content} for role, content in messages]})
    with HistoryDatabase.open(history_database_path()) as database:
        return database.save(None, ConversationRecord(model, texts[0], len(texts) // 2, 5, document, messages))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Terminal:
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    def answering(answer: str) -> None:
        monkeypatch.setattr(sys, "stdin", Terminal(answer))
        monkeypatch.setattr("builtins.input", lambda prompt: print(prompt, end="") or answer)
    return answering


@pytest.mark.parametrize("argv", [[], ["search", "anything"], ["clear", "--yes"]])
def test_no_history_yet_is_a_friendly_line_and_makes_no_database(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == ""
    assert out.startswith("no conversations kept yet") and str(history_database_path()) in out
    assert not history_database_path().exists()


def test_removing_from_no_history_says_so(capsys):
    assert run(capsys, "rm", "3") == (1, "", "llama-chat: no conversation 3 in the history\n")
    assert not history_database_path().exists()


def test_an_empty_history(capsys):
    save("gone", "soon")
    assert run(capsys, "clear", "--yes")[:2] == (0, "removed 1 conversation\n")
    assert run(capsys, "--limit", "5") == (0, "no conversations kept yet\n", "")


def test_the_list_is_newest_first_one_line_each_shown_literally(capsys):
    first = save("what is\na lighthouse?", "a tower")
    second = save("tell me \x1b[2J\u202eabout\ttabs", "ok", "and more", "sure", model="evil\x1b]0;title\x07")
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    header, newest, oldest = out.splitlines()
    assert header.split() == ["id", "when", "model", "exch.", "first", "message"]
    assert newest.split()[0] == str(second) and oldest.split()[0] == str(first)
    assert "evil\\x1b]0;title\\x07" in newest and " 2 " in newest
    assert "tell me \\x1b[2J\\u202eabout tabs" in newest
    assert "what is a lighthouse?" in oldest
    assert "\x1b" not in out and "\u202e" not in out
    assert run(capsys, "--limit", "1")[1].splitlines()[1:] == [newest]


def test_a_long_first_message_is_shortened_to_the_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    save("word " * 500, "ok")
    lines = run(capsys)[1].splitlines()
    assert len(lines[1]) <= 80 and lines[1].endswith("...")


def test_search_shows_each_match_with_a_snippet(capsys):
    save("the harbour at night", "boats \x1b[31mrock\x1b[0m gently in the harbour")
    save("nothing related", "at all")
    code, out, err = run(capsys, "search", "gently", "harbour")
    assert code == 0 and err == ""
    row, snippet = out.splitlines()
    assert "the harbour at night" in row
    assert "\\x1b[31mrock" in snippet and "gently" in snippet
    assert run(capsys, "search", "NEAR(", '"', "*") == (0, 'no conversation holds all of: NEAR( " *\n', "")
    found = run(capsys, "search", "--", "-harbour")[1].splitlines()  # after --, a word that starts with -
    assert len(found) == 2 and "the harbour at night" in found[0]


def test_search_limit(capsys):
    for number in range(4):
        save(f"sailing trip {number}", "lovely")
    assert len(run(capsys, "search", "--limit", "2", "sailing")[1].splitlines()) == 4


def test_rm_removes_and_names_the_ids_it_did_not_find(capsys):
    kept, removed = save("keep me", "ok"), save("remove me", "ok")
    code, out, err = run(capsys, "rm", str(removed), "999")
    assert (code, out, err) == (1, f"removed conversation {removed}\n",
                                "llama-chat: no conversation 999 in the history\n")
    assert [line.split()[0] for line in run(capsys)[1].splitlines()[1:]] == [str(kept)]


def test_clear_without_a_terminal_needs_yes(capsys, monkeypatch):
    save("still here", "yes")
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))
    code, out, err = run(capsys, "clear")
    assert code == 1 and out == "" and err.count("\n") == 1 and "--yes" in err
    assert run(capsys, "clear", "--yes")[:2] == (0, "removed 1 conversation\n")


def test_clear_on_a_terminal_asks(capsys, terminal):
    save("one", "a")
    save("two", "b")
    terminal("n")
    assert run(capsys, "clear")[1].endswith("[y/N] nothing removed\n")
    terminal("y")
    assert run(capsys, "clear")[1].endswith("[y/N] removed 2 conversations\n")


def test_a_history_from_a_newer_llama_chat_is_one_line_and_exit_1(capsys):
    save("kept", "safe")
    with sqlite3.connect(history_database_path()) as connection:
        connection.execute("PRAGMA user_version = 2")
    connection.close()
    code, out, err = run(capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("llama-chat: the history ") and "newer llama-chat (schema 2)" in err


def test_a_damaged_history_is_moved_aside_with_a_note(capsys):
    path = history_database_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00garbage" * 1000)
    code, out, err = run(capsys)
    assert code == 0 and out == "no conversations kept yet\n"
    assert err.startswith("llama-chat: the history ") and "moved to history.sqlite3.corrupt-" in err


def test_a_count_must_be_one_or_more(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--limit", "0"])
    assert raised.value.code == 2 and "not a count from 1 up" in capsys.readouterr().err


def test_the_command_runs_as_llama_chat_history():
    save("from another process", "indeed")
    finished = subprocess.run([sys.executable, "-m", "llama_chat", "history"], capture_output=True, text=True,
                              timeout=120)
    assert finished.returncode == 0 and finished.stderr == ""
    assert "from another process" in finished.stdout and "tiny-model" in finished.stdout
