"""/edit and /retry keep every version of the conversation; /branches follows another."""

import json
import sys

import pytest

from llama_chat import SamplingSettings
from llama_chat.chat.session import Session
from llama_chat.engine.cache import common_length
from llama_chat.errors import ContextOverflowError, LlamaChatError

from .test_history_chat import kept_document
from .test_repl import CTRL_C, chat
from .test_session import GREEDY, assert_consistent, chat_model, replay, say

CTRL_U = "\x15"  # clears the line before the cursor


def users(exchanges) -> list[str]:
    return [exchange.user for exchange in exchanges]


def ids_before(session: Session, number: int) -> int:
    """How many ids the conversation holds before user message `number` (from 1)."""
    spans = [session.transcript.spans.get(e) for e in session.conversation.exchanges[: number - 1]]
    return len(session.transcript.head) + sum(len(span.user) + len(span.reply) for span in spans)


def test_edit_of_the_last_message_replaces_its_reply_and_reuses_the_cache_before_it():
    model = chat_model()
    session = replay(model, ["one", "two"])
    before, old = ids_before(session, 2), session.transcript.spans.get(session.conversation.exchanges[1])
    turn = session.edit(2, "deux")
    turn.run()
    assert users(session.conversation.exchanges) == ["one", "deux"]
    new = session.transcript.spans.get(session.conversation.exchanges[1])
    # Every position before the message, and its start that did not change: <|im_start|> "user\n".
    assert common_length(old.user, new.user) == 1 + len("user\n")
    assert turn.stats.reused_tokens == before + common_length(old.user, new.user)
    assert turn.stats.prefilled_tokens == len(turn.prompt) - turn.stats.reused_tokens
    assert session.transcript.ids == replay(model, ["one", "deux"]).transcript.ids
    assert_consistent(session)


def test_edit_of_an_earlier_message_drops_the_exchanges_after_it():
    model = chat_model()
    session = replay(model, ["one", "two", "three"])
    before = ids_before(session, 2)
    turn = session.edit(2, "zwei")
    turn.run()
    assert users(session.conversation.exchanges) == ["one", "zwei"]
    assert turn.stats.reused_tokens >= before
    assert session.transcript.ids == replay(model, ["one", "zwei"]).transcript.ids
    # The dropped exchanges stay as the other version at message 2.
    assert [(v.number, v.position, users(v.exchanges), v.current) for v in session.conversation.versions()] == [
        (1, 1, ["two", "three"], False), (2, 1, ["zwei"], True)]
    assert_consistent(session)


def test_an_edit_that_is_refused_changes_nothing():
    session = Session(chat_model(max_seq_len=128), GREEDY, context_size=128)
    say(session, "one")
    say(session, "two")
    before = (list(session.transcript.ids), list(session.cache.tokens), users(session.conversation.exchanges))
    with pytest.raises(ContextOverflowError):
        session.edit(1, "x" * 200)
    with pytest.raises(LlamaChatError, match="no message 3: the user messages are numbered from 1 to 2"):
        session.edit(3, "three")
    assert (session.transcript.ids, session.cache.tokens, users(session.conversation.exchanges)) == before
    assert session.conversation.versions() == []


def test_retry_keeps_the_earlier_reply_as_another_version():
    model = chat_model()
    session = Session(model, SamplingSettings(temperature=1.0, seed=3, max_tokens=6))
    say(session, "one")
    first = session.conversation.exchanges[0]
    session.retry().run()
    session.retry().run()
    listed = session.conversation.versions()
    assert [(v.number, v.position, v.current) for v in listed] == [(1, 0, False), (2, 0, False), (3, 0, True)]
    assert listed[0].exchanges == [first] and listed[2].exchanges == session.conversation.exchanges
    assert users(session.conversation.exchanges) == ["one"]
    assert_consistent(session)


def test_switching_versions_gives_their_messages_and_ids_and_keeps_the_common_cache():
    model = chat_model()
    session = replay(model, ["one", "two", "three"])
    kept_ids, kept_replies = list(session.transcript.ids), [e.reply for e in session.conversation.exchanges]
    session.edit(2, "zwei").run()
    zwei_ids = list(session.transcript.ids)
    session.switch_version(1)
    assert users(session.conversation.exchanges) == ["one", "two", "three"]
    assert [e.reply for e in session.conversation.exchanges] == kept_replies and session.transcript.ids == kept_ids
    assert session.cache.tokens == kept_ids[: len(session.cache.tokens)]
    assert len(session.cache.tokens) >= ids_before(session, 2)  # the positions before the fork stay
    # The numbers stay with the versions; the followed one is marked.
    assert [(v.number, users(v.exchanges), v.current) for v in session.conversation.versions()] == [
        (1, ["two", "three"], True), (2, ["zwei"], False)]
    session.switch_version(2)
    assert users(session.conversation.exchanges) == ["one", "zwei"] and session.transcript.ids == zwei_ids
    assert_consistent(session)
    # The next turn is what a conversation that only ever had this version gives.
    turn = say(session, "four")
    fresh = replay(model, ["one", "zwei", "four"])
    fresh_reply = fresh.transcript.spans.get(fresh.conversation.exchanges[-1]).reply
    assert turn.generation.tokens == fresh_reply[:len(turn.generation.tokens)]
    assert session.transcript.ids == fresh.transcript.ids
    with pytest.raises(LlamaChatError, match="no version 3: the versions are from 1 to 2"):
        session.switch_version(3)


def test_versions_fork_within_versions():
    session = replay(chat_model(), ["one", "two", "three"])
    session.edit(3, "drei").run()
    session.edit(1, "eins").run()
    assert [(v.number, v.position, users(v.exchanges)) for v in session.conversation.versions()] == [
        (1, 0, ["one", "two", "drei"]), (2, 0, ["eins"])]
    session.switch_version(1)
    assert [(v.number, v.position, users(v.exchanges), v.current) for v in session.conversation.versions()] == [
        (1, 0, ["one", "two", "drei"], True), (2, 0, ["eins"], False),
        (3, 2, ["three"], False), (4, 2, ["drei"], True)]
    session.switch_version(3)
    assert users(session.conversation.exchanges) == ["one", "two", "three"]
    assert_consistent(session)


def test_versions_take_new_ids_after_the_system_prompt_changes():
    model = chat_model("llama2")  # the system prompt is folded into the first user turn
    session = replay(model, ["one"], system="Be brief.")
    session.edit(1, "uno").run()
    session.set_system("Be kind.")
    session.switch_version(1)
    assert session.transcript.ids == model.chat_format.encode(session.conversation.messages(), False)
    assert_consistent(session)


def test_save_then_open_keeps_every_version(tmp_path):
    model = chat_model()
    session = Session(model, GREEDY, system="S", model_path=tmp_path / "m.gguf")
    for text in ["one", "two", "three"]:
        say(session, text)
    session.edit(3, "drei").run()
    session.edit(2, "zwei").run()
    path, _ = session.save(tmp_path / "chat.json")
    data = json.loads(path.read_text())
    assert [fork["exchange"] for fork in data["branches"]] == [2]

    opened = Session(model, GREEDY, model_path=tmp_path / "m.gguf")
    assert opened.open(path) is None
    assert opened.conversation.messages() == session.conversation.messages()
    assert opened.transcript.ids == session.transcript.ids
    assert opened.conversation.versions() == session.conversation.versions()
    opened.switch_version(1)
    session.switch_version(1)
    listed = opened.conversation.versions()
    assert listed == session.conversation.versions() and len(listed) == 4
    assert opened.transcript.ids == session.transcript.ids
    assert users(opened.conversation.exchanges) == ["one", "two", "drei"]


def test_a_file_without_branches_opens_with_one_version(tmp_path):
    session = replay(chat_model(), ["one", "two"])
    session.retry().run()
    path, _ = session.save(tmp_path / "chat.json")
    data = json.loads(path.read_text())
    del data["branches"]
    path.write_text(json.dumps(data))
    opened = Session(session.model, GREEDY)
    opened.open(path)
    assert opened.conversation.messages() == session.conversation.messages() and opened.conversation.versions() == []


@pytest.mark.parametrize("branches, reason", [
    ({"exchange": 1}, "'branches' must be a list of forks"),
    ([{"exchange": 3, "version": 0, "others": [{"messages": []}]}],
     "a fork's 'exchange' must be one of its messages' exchanges (1 to 2), once"),
    ([{"exchange": 1, "version": 2, "others": [{"messages": [{"role": "user", "content": "x"},
                                                             {"role": "assistant", "content": "y"}]}]}],
     "a fork's 'version' must be from 0 to 1"),
    ([{"exchange": 1, "version": 0, "others": [{"messages": [{"role": "user", "content": 5}]}]}],
     "every message needs a text 'content'"),
    ([{"exchange": 1, "version": 0, "others": [{"messages": []}]}], "a version in 'branches' needs messages"),
])
def test_a_malformed_branches_field_is_one_line_and_the_text_kept(tmp_path, branches, reason):
    session = replay(chat_model(), ["one", "two"])
    path, _ = session.save(tmp_path / "chat.json")
    data = json.loads(path.read_text())
    data["branches"] = branches
    path.write_text(json.dumps(data))
    opened = Session(session.model, GREEDY)
    note = opened.open(path)
    assert note == f"{path}: its other versions were not opened ('branches': {reason})"
    assert opened.conversation.messages() == session.conversation.messages()
    assert opened.transcript.ids == session.transcript.ids
    assert opened.conversation.versions() == []


def test_edit_in_the_chat_resends_the_changed_message_and_shows_the_cache_reused():
    session = Session(chat_model(), GREEDY)
    chat(session, "one", "two", "three", "/quit")
    before = ids_before(session, 3)
    code, output = chat(session, "/edit", " more", "/quit")
    assert code == 0 and users(session.conversation.exchanges) == ["one", "two", "three more"]
    stats = session.last_stats
    assert stats.reused_tokens == before + 1 + len("user\nthree")
    assert f"prompt {stats.prefilled_tokens} new + {stats.reused_tokens} cached tokens" in output

    before = ids_before(session, 2)
    code, output = chat(session, "/edit 2", CTRL_U + "zwei", "/branches", "/quit")
    assert users(session.conversation.exchanges) == ["one", "zwei"]
    stats = session.last_stats
    assert stats.reused_tokens == before + 1 + len("user\n")
    assert f"prompt {stats.prefilled_tokens} new + {stats.reused_tokens} cached tokens" in output
    assert "at message 2:\n   1  'two' -> " in output and "(then 1 exchange)" in output
    assert "\n*  2  'zwei' -> " in output and "at message 3:" not in output

    code, output = chat(session, "/branches 1", "/branches", "/quit")
    assert users(session.conversation.exchanges) == ["one", "two", "three more"]
    assert "following version 1: 3 exchanges, the last 'three more' -> " in output
    assert "at message 3:\n   3  'three' -> " in output and "\n*  4  'three more' -> " in output
    assert_consistent(session)


def test_ctrl_c_or_an_empty_line_at_the_edit_prompt_changes_nothing():
    session = Session(chat_model(), GREEDY)
    chat(session, "one", "/quit")
    kept = (list(session.transcript.ids), list(session.cache.tokens))
    code, output = chat(session, "/edit", keys=CTRL_C + "/edit 1" + "\r" + CTRL_U + "\r/edit 2\r/edit x\r/quit\r")
    assert code == 0 and output.count("edit cancelled") == 2
    assert "there is no message 2: the user messages are numbered from 1 to 1" in output
    assert "/edit needs a whole number, got 'x'" in output
    assert users(session.conversation.exchanges) == ["one"] and session.conversation.versions() == []
    assert (session.transcript.ids, session.cache.tokens) == kept


def test_edit_and_edit_n_on_a_terminal_show_the_cache_reused(tmp_path):
    """In a pseudo-terminal: the edit prompt holds the message; the statistics line counts
    the positions before it (and its unchanged start) as cached, as the kept file's ids say."""
    from gguf import GGMLQuantizationType as QType

    from .terminal import Terminal
    from .test_gguf import tiny_hf_model, write_gguf

    model_file = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5), qtype=QType.F32)
    command = [sys.executable, "-m", "llama_chat", "-m", str(model_file), "--compile", "off", "--temperature", "0",
               "--max-tokens", "8"]
    chat = Terminal(command, {"XDG_STATE_HOME": str(tmp_path / "state")})

    def send(keys: bytes) -> str:
        """Type the keys; return what the chat wrote until its next prompt."""
        sent = len(chat.output)
        chat.type(keys)
        assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
        assert chat.read_prompt(30, after=chat.output.index(b"tok/s", sent)), chat.text()
        return chat.output[sent:].decode(errors="replace")

    def edit(command: bytes, shown: bytes, keys: bytes) -> str:
        sent = len(chat.output)
        chat.type(command)
        assert chat.read_until(b"edit> ", 30, after=sent) and chat.read_until(shown, 30, after=sent), chat.text()
        return send(keys)

    def expected_cached(number: int) -> int:
        """The ids before user message `number` and the start it shares with the version it replaced."""
        data = kept_document(tmp_path / "state")
        ids = [message["token_ids"] for message in data["messages"]]
        replaced = next(fork for fork in data["branches"] if fork["exchange"] == number)["others"][-1]
        before = len(data["head_ids"]) + sum(len(part) for part in ids[: 2 * (number - 1)])
        return before + common_length(ids[2 * (number - 1)], replaced["messages"][0]["token_ids"])

    try:
        assert chat.read_until(b"Ctrl-D leaves", 60), chat.text()
        send(b"hello\r")
        send(b"world\r")
        output = edit(b"/edit\r", b"world", CTRL_U.encode() + b"earth\r")
        assert f"+ {expected_cached(2)} cached tokens" in output
        assert [m["content"] for m in kept_document(tmp_path / "state")["messages"][::2]] == ["hello", "earth"]
        output = edit(b"/edit 1\r", b"hello", b" there\r")
        assert f"+ {expected_cached(1)} cached tokens" in output and expected_cached(1) > len("hello")
        assert [m["content"] for m in kept_document(tmp_path / "state")["messages"][::2]] == ["hello there"]
    finally:
        chat.kill()


def test_a_version_followed_after_open_in_the_chat_answers_as_a_fresh_run(tmp_path):
    """/open of a conversation saved with two versions, then /branches to list them and follow
    the other one: the next reply is what a conversation that only ever had that version
    gives, from the opened cache up to where the versions part."""
    model = chat_model()
    path = tmp_path / "talk.json"
    session = Session(model, GREEDY, model_path=tmp_path / "m.gguf")
    chat(session, "one", "two", "three", "/edit 2", CTRL_U + "zwei", f"/save {path}", "/quit")
    assert users(session.conversation.exchanges) == ["one", "zwei"]

    reopened = Session(model, SamplingSettings(temperature=0.7), model_path=tmp_path / "m.gguf")
    code, output = chat(reopened, f"/open {path}", "/branches", "/branches 1", "/quit")
    assert code == 0 and f"opened {path}: 2 exchanges" in output
    assert "at message 2:\n   1  'two' -> " in output and "(then 1 exchange)\n*  2  'zwei' -> " in output
    assert "following version 1: 3 exchanges, the last 'three' -> " in output
    assert_consistent(reopened)  # the opened cache kept up to where the versions part
    assert len(reopened.cache) >= ids_before(reopened, 2)
    code, output = chat(reopened, "four", "/branches", "/quit")
    assert "at message 2:\n*  1  'two' -> " in output and "(then 2 exchanges)\n   2  'zwei' -> " in output
    assert users(reopened.conversation.exchanges) == ["one", "two", "three", "four"]
    fresh = replay(model, ["one", "two", "three", "four"])  # the saved settings (greedy) came back with /open
    assert reopened.conversation.exchanges[-1].reply == fresh.conversation.exchanges[-1].reply
    assert reopened.transcript.ids == fresh.transcript.ids
    assert reopened.last_stats.reused_tokens >= ids_before(reopened, 2)
    assert_consistent(reopened)
