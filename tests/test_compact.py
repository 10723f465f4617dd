"""/compact and --when-full compact: the model's summary stands for the older exchanges in
the context; the exchanges themselves stay in the conversation's earlier ones, the file and
the history."""

import pytest

from llama_chat import SamplingSettings
from llama_chat.chat.conversation import SUMMARY_HEADING
from llama_chat.chat.exchange import user_message
from llama_chat.chat.session import Session
from llama_chat.cli import main
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.errors import LlamaChatError

from .test_cli import typed_chats
from .test_history_chat import kept_document
from .test_session import chat_model, say


def conversation_of(*messages: str) -> Session:
    session = Session(chat_model(max_seq_len=2048), SamplingSettings(temperature=0, max_tokens=6), system="Be brief.")
    for message in messages:  # long enough for a summary to be shorter (a byte tokenizer's tokens)
        say(session, " ".join([message] * 12))
    return session


def test_compact_puts_the_summary_in_the_older_exchanges_place():
    session = conversation_of("my name is Ada", "I live in Paris", "what is 2+2?")
    older = session.conversation.exchanges[:2]
    count, before, after = session.compact()
    conversation = session.conversation
    assert count == 2 and conversation.earlier == older and len(conversation.exchanges) == 1
    assert conversation.summary and after < before and session.compaction_freed == before - after
    system = conversation.messages()[0]["content"]
    assert system == f"Be brief.\n\n{SUMMARY_HEADING}{conversation.summary}"
    prompt = session.transcript.prompt_for("and now?").ids
    assert prompt == session.model.chat_format.encode(conversation.messages() + [user_message("and now?")])
    with pytest.raises(LlamaChatError, match="nothing to compact"):
        session.compact()


def test_an_interrupted_summary_changes_nothing(monkeypatch):
    session = conversation_of("one", "two")
    ids, exchanges, cached = list(session.transcript.ids), list(session.conversation.exchanges), len(session.cache)

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(session.model, "generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.compact()
    assert session.transcript.ids == ids and session.conversation.exchanges == exchanges
    assert session.conversation.earlier == [] and session.conversation.summary is None and len(session.cache) == cached


def test_earlier_exchanges_and_the_summary_are_saved_and_opened(tmp_path):
    session = conversation_of("one", "two", "three")
    session.compact()
    session.save(tmp_path / "c.json")
    opened = Session(session.model, SamplingSettings(temperature=0, max_tokens=6))
    opened.open(tmp_path / "c.json")
    assert [e.user.split()[0] for e in opened.conversation.earlier] == ["one", "two"]
    assert opened.conversation.summary == session.conversation.summary
    assert opened.transcript.ids == session.transcript.ids
    opened.clear()
    assert opened.conversation.earlier == [] and opened.conversation.summary is None


@pytest.mark.parametrize("when_full", ["drop", "compact"])
def test_a_full_context_drops_or_compacts_and_keeps_the_exchanges(when_full):
    session = Session(chat_model(max_seq_len=2048), SamplingSettings(temperature=0, max_tokens=6), context_size=400)
    session.when_full = when_full
    for number in range(4):
        turn = session.send(f"message number {number} " * 8)
        turn.run()
    conversation = session.conversation
    assert [e.user.split()[2] for e in conversation.earlier + conversation.exchanges] == ["0", "1", "2", "3"]
    assert conversation.earlier  # something had to go
    assert (conversation.summary is not None) is (when_full == "compact")


def test_compact_on_the_default_model_through_the_cli(monkeypatch):
    model = str(download_model(DEFAULT_MODEL))
    sessions, shown = typed_chats(monkeypatch, ["My name is Ada and I live in Paris.", "What is 2 + 2?",
                                                "/compact", "/quit"])
    assert main(["-m", model, "--compile", "off", "--temperature", "0", "--max-tokens", "24"]) == 0
    conversation = sessions[0].conversation
    assert [e.user for e in conversation.earlier] == ["My name is Ada and I live in Paris."]
    assert [e.user for e in conversation.exchanges] == ["What is 2 + 2?"]
    text = sessions[0].model.tokenizer.decode(sessions[0].transcript.ids)
    assert conversation.summary in text and "My name is Ada" not in text
    assert "compacted 1 exchange into a summary" in shown.getvalue()
    kept = kept_document()
    assert [m["content"] for m in kept["earlier"][::2]] == ["My name is Ada and I live in Paris."]
    assert kept["summary"] == conversation.summary
