"""Conversation files from strangers (chat/conversation_file.py, read by --open and /open):
every part checked, one line naming the file, and token ids the model reads only where
they hold the text the conversation shows."""

import json
import os
import threading

import pytest

from llama_chat.chat.exchange import Exchange
from llama_chat.chat.session import Session
from llama_chat.chat.spans import Span, ids_hold_text
from llama_chat.errors import LlamaChatError
from llama_chat.text.tokenizer import ByteTokenizer

from .test_session import GREEDY, chat_model, replay, say


@pytest.fixture
def saved(tmp_path):
    """A conversation of two exchanges with a system prompt, saved as chat.json."""
    session = Session(chat_model(), GREEDY, system="Be brief.", model_path=tmp_path / "model.gguf")
    say(session, "one")
    say(session, "two")
    session.save(tmp_path / "chat.json")
    return json.loads((tmp_path / "chat.json").read_text())


def opened(tmp_path, contents) -> tuple[Session, str | None]:
    path = tmp_path / "chat.json"
    path.write_text(contents if isinstance(contents, str) else json.dumps(contents))
    session = Session(chat_model(), GREEDY, model_path=tmp_path / "model.gguf")
    return session, session.open(path)


def refusal(tmp_path, contents) -> str:
    with pytest.raises(LlamaChatError) as refused:
        opened(tmp_path, contents)
    return str(refused.value)


def test_200000_nested_arrays_are_one_line_naming_the_file(tmp_path):
    assert refusal(tmp_path, "[" * 200_000 + "]" * 200_000) == (
        f"{tmp_path / 'chat.json'} is not a llama-chat conversation (JSON nested more than 64 levels deep)"
    )


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    path = tmp_path / "chat.json"
    os.mkfifo(path)
    outcome = []

    def open_it():
        try:
            Session(chat_model(), GREEDY).open(path)
        except LlamaChatError as error:
            outcome.append(str(error))

    reader = threading.Thread(target=open_it, daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert outcome == [f"{path}: cannot read it (not a regular file)"]


def with_message(number, **changes):
    def edit(data):
        messages = [dict(message) for message in data["messages"]]
        messages[number].update(changes)
        return {**data, "messages": messages}

    return edit


@pytest.mark.parametrize("edit, message", [
    (lambda data: {**data, "version": "1"}, "has conversation format version '1'; this llama-chat reads 1"),
    (lambda data: {**data, "messages": {"role": "user"}}, ": 'messages' must be a list of messages"),
    (with_message(1, role=["user"]), ": after an optional system message, messages must alternate user, assistant"),
    (with_message(2, content=None), ": every message needs a text 'content'"),
    (with_message(2, interrupted="no"), ": a message's 'interrupted' must be true or false"),
    (with_message(1, token_ids="1 2 3"), ": token_ids must be a list of whole numbers from 0 up"),
    (with_message(1, token_ids=[True, False]), ": token_ids must be a list of whole numbers from 0 up"),
    (with_message(2, token_ids=[5, -1]), ": token_ids must be a list of whole numbers from 0 up"),
    (lambda data: {**data, "head_ids": [1.5]}, ": token_ids must be a list of whole numbers from 0 up"),
    (lambda data: {**data, "settings": "hot"}, ": 'settings' must be an object"),
    (lambda data: {**data, "settings": {"temperature": "hot"}}, ": temperature must be a number, not 'hot'"),
    (lambda data: {**data, "settings": {"top_k": float("inf")}},
     ": top_k must be a finite number below 2**63, not inf"),
    (lambda data: {**data, "settings": {"seed": 2**64}},
     ": seed must be a finite number below 2**63, not 18446744073709551616"),
    (lambda data: {**data, "model": ["tiny"]},
     ": 'model' must be an object of the text path, name, chat_format and vocab_size"),
    (lambda data: {**data, "model": {**data["model"], "path": ["model.gguf"]}},
     ": 'model' must be an object of the text path, name, chat_format and vocab_size"),
    (lambda data: {**data, "model": {**data["model"], "name": "two\nlines"}},
     ": 'model' must be an object of the text path, name, chat_format and vocab_size"),
    (lambda data: {**data, "model": {**data["model"], "vocab_size": "260"}},
     ": 'model' must be an object of the text path, name, chat_format and vocab_size"),
])
def test_a_part_of_the_wrong_type_is_one_line_naming_the_file(tmp_path, saved, edit, message):
    text = refusal(tmp_path, edit(saved))
    assert text.startswith(str(tmp_path / "chat.json")) and text.endswith(message) and "\n" not in text


def test_ids_for_other_text_are_rebuilt_from_the_text_with_one_line(tmp_path, saved):
    """The text of a message edited by hand, its ids left: the model reads the new text."""
    edited = with_message(3, content="three")(saved)
    session, note = opened(tmp_path, edited)
    assert note == (f"{tmp_path / 'chat.json'}: its token ids do not hold its text; they were rebuilt from the text; "
                    "its saved cache was not used (chat.kv.safetensors holds other tokens than the conversation): "
                    "the conversation is read again")
    assert [exchange.user for exchange in session.conversation.exchanges] == ["one", "three"]
    assert session.transcript.ids == session.model.chat_format.encode(session.conversation.messages(), False)


def test_ids_past_the_vocabulary_are_rebuilt_with_one_line(tmp_path, saved):
    edited = with_message(2, token_ids=[10**6, 5])(saved)
    session, note = opened(tmp_path, edited)
    assert "chat.json: its token ids do not hold its text; they were rebuilt from the text; " in note
    assert session.transcript.ids == session.model.chat_format.encode(session.conversation.messages(), False)
    assert len(session.cache) == 0 and "\n" not in note  # the saved cache held the ids that were not kept


@pytest.mark.parametrize("format_name", ["chatml", "llama3", "llama2", "plain"])
def test_ids_a_chat_saved_are_kept_on_open(tmp_path, format_name):
    model = chat_model(format_name)
    session = Session(model, GREEDY, system="Be brief.", model_path=tmp_path / "model.gguf")
    say(session, "one")
    say(session, "two")
    session.save(tmp_path / "chat.json")
    reopened = Session(model, GREEDY, model_path=tmp_path / "model.gguf")
    assert reopened.open(tmp_path / "chat.json") is None
    assert reopened.transcript.ids == session.transcript.ids
    assert reopened.transcript.ids == replay(model, ["one", "two"], system="Be brief.").transcript.ids


def test_ids_hold_the_answer_after_thinking_a_template_left_out():
    tokenizer = ByteTokenizer()
    exchange = Exchange(user="hi", reply="<think>\nplan\n</think>\n\nHello!")
    span = Span(tokenizer.encode("User: hi\n"), tokenizer.encode("Assistant: Hello!\n"))
    assert ids_hold_text("Be brief.", [(exchange, span)], tokenizer.encode("System: Be brief.\n"), tokenizer.decode)
    assert not ids_hold_text("Be long.", [(exchange, span)], tokenizer.encode("System: Be brief.\n"), tokenizer.decode)
    span = Span(span.user, tokenizer.encode("Assistant: Goodbye!\n"))
    assert not ids_hold_text("Be brief.", [(exchange, span)], tokenizer.encode("System: Be brief.\n"), tokenizer.decode)
