"""The chat kept in the history: after every input, resumed by --resume and /history with
its cache (or read again without one), and nothing kept with --no-history."""

import json
import os
import sqlite3
from pathlib import Path

import torch

from llama_chat import SamplingSettings
from llama_chat.chat.history_db import HistoryDatabase
from llama_chat.chat.history_keeper import HistoryKeeper
from llama_chat.chat.session import Session
from llama_chat.cli import main
from llama_chat.paths import history_caches_path, history_database_path, kept_conversation_path

from .test_cli import typed_chats
from .test_gguf import tiny_hf_model, write_gguf
from .test_session import chat_model, say

GREEDY = ["--compile", "off", "--temperature", "0", "--max-tokens", "4", "--quantize", "none", "--dtype", "float32"]


def kept_document(state: Path | None = None) -> dict:
    """The newest conversation the history holds (in the state folder `state`: a chat's
    own), read with sqlite3 itself."""
    path = history_database_path() if state is None else state / "llama-chat" / "history.sqlite3"
    with sqlite3.connect(path) as database:
        (text,) = database.execute("SELECT document FROM conversations ORDER BY updated DESC LIMIT 1").fetchone()
    return json.loads(text)


def keeper(budget: int = 2 << 30) -> HistoryKeeper:
    return HistoryKeeper(HistoryDatabase.open(history_database_path()), history_caches_path(), budget)


def greedy_session(model) -> Session:
    return Session(model, SamplingSettings(temperature=0, max_tokens=6))


def test_a_resumed_conversation_continues_with_the_logits_of_the_one_kept():
    model = chat_model()
    first, kept = greedy_session(model), keeper()
    kept.keep(first)  # no exchange yet: nothing kept
    assert kept.conversation_id is None and not history_database_path().with_suffix(".none").exists()
    say(first, "hello there")
    say(first, "and then?")
    kept.keep(first)
    assert kept_document()["messages"][0]["content"] == "hello there"

    for cached in (True, False):  # a recent conversation, and an old one whose cache is gone
        if not cached:
            kept.cache_path(kept.conversation_id).unlink()
        resumed = greedy_session(model)
        line = keeper().open(resumed, kept.conversation_id)
        assert resumed.transcript.ids == first.transcript.ids
        assert len(resumed.cache) == (len(first.cache.tokens) if cached else 0)
        assert ("reads its" in line and "tokens again" in line) is not cached, line
        prompt = resumed.transcript.prompt_for("more").ids
        assert prompt == first.transcript.prompt_for("more").ids
        resumed.cache.keep_common_prefix(prompt, at_most=len(prompt) - 1)
        logits = resumed.model.runner(resumed.cache, prompt[len(resumed.cache):])  # the last position's
        assert torch.allclose(logits, model.logits(prompt)[-1], atol=1e-5)


def test_a_damaged_cache_is_read_again_in_one_line():
    model = chat_model()
    first, kept = greedy_session(model), keeper()
    say(first, "hello there")
    kept.keep(first)
    kept.cache_path(kept.conversation_id).write_bytes(b"not a cache")
    resumed = greedy_session(model)
    line = keeper().open(resumed, kept.conversation_id)
    assert "its saved cache was not used" in line and "\n" not in line and len(resumed.cache) == 0
    assert resumed.transcript.ids == first.transcript.ids


def test_the_caches_stay_within_their_budget_the_least_recently_used_dropped():
    model = chat_model()
    sizes = []
    for number in range(3):
        kept = keeper(budget=10**9)
        session = greedy_session(model)
        say(session, f"conversation {number}")
        kept.keep(session)
        sizes.append(kept.cache_path(kept.conversation_id).stat().st_size)
        os.utime(kept.cache_path(kept.conversation_id), (number, number))  # used in this order
    kept = keeper(budget=sizes[1] + sizes[2])
    session = greedy_session(model)
    say(session, "a fourth")
    kept.keep(session)
    left = sorted(path.name for path in history_caches_path().iterdir())
    assert left == ["3.kv.safetensors", "4.kv.safetensors"]  # the current one stays, then the newest


def test_resume_by_id_or_words_and_no_history_leaves_no_file(tmp_path, capsys):
    model = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5))
    chat = ["-m", str(model), *GREEDY, "--stats"]
    assert main([*chat, "--no-history", "-p", "nothing kept"]) == 0
    state = history_database_path().parent
    assert not state.exists() or list(state.iterdir()) == []
    assert main([*chat, "-p", "about zebras"]) == 0
    assert main([*chat, "-p", "about otters"]) == 0
    capsys.readouterr()
    assert main([*chat, "--resume", "zebras", "-p", "more"]) == 0
    err = capsys.readouterr().err
    assert "resumed conversation 1 of the history: 1 exchange" in err and " 0 cached tokens" not in err
    assert main([*chat, "--resume", "-p", "again"]) == 0  # the last one changed: the first, now
    assert "resumed conversation 1 of the history: 2 exchanges" in capsys.readouterr().err
    assert main([*chat, "--resume", "2", "-p", "again"]) == 0
    assert "resumed conversation 2 of the history: 1 exchange" in capsys.readouterr().err
    assert main([*chat, "--resume", "walruses", "-p", "x"]) == 2
    assert "no conversation in the history" in capsys.readouterr().err


def test_history_in_the_chat_lists_opens_and_forgets(tmp_path, monkeypatch, capsys):
    model = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5))
    chat = ["-m", str(model), *GREEDY]
    assert main([*chat, "-p", "about zebras"]) == 0
    sessions, shown = typed_chats(monkeypatch, ["hello otters", "/history", "/history find zebras",
                                                "/history open zebras", "/history off", "/quit"])
    assert main(chat) == 0
    text = shown.getvalue()
    assert "'hello otters'" not in text and "hello otters" in text and "about zebras" in text
    assert "opened conversation 1 of the history: 1 exchange" in text
    assert sessions[0].conversation.exchanges[0].user == "about zebras"
    with sqlite3.connect(history_database_path()) as database:  # /history off removed the opened one
        assert [row[0] for row in database.execute("SELECT title FROM conversations")] == ["hello otters"]
    assert not (history_caches_path() / "1.kv.safetensors").exists()
    assert Path(history_caches_path() / "2.kv.safetensors").exists()


def test_the_conversation_an_earlier_version_kept_moves_into_the_history(tmp_path, capsys):
    model = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5))
    chat = ["-m", str(model), *GREEDY, "--no-history"]
    kept_conversation_path().parent.mkdir(parents=True)
    assert main([*chat, "-p", "from before", "--save", str(kept_conversation_path())]) == 0
    assert main(["-m", str(model), *GREEDY, "--resume", "-p", "and now"]) == 0
    err = capsys.readouterr().err
    assert "kept for --resume is conversation 1 of the history" in err
    assert "resumed conversation 1 of the history: 1 exchange" in err
    assert not kept_conversation_path().exists()
    assert [m["content"] for m in kept_document()["messages"][::2]] == ["from before", "and now"]
