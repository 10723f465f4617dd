"""A turn encodes only its new message where the chat format renders messages on their own,
and sends the model exactly the ids rendering the whole conversation gives."""

import pytest

from llama_chat import Llama, ModelArgs, SamplingSettings
from llama_chat.chat.exchange import Exchange, user_message
from llama_chat.chat.session import Session
from llama_chat.chat.spans import Span, Spans
from llama_chat.chat.transcript import Transcript, added, prompt_after, reply_span
from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.text.format_choice import get_chat_format

from .test_session import chat_model

SETTINGS = SamplingSettings(temperature=0, max_tokens=5)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Numbers the user turns: a message's ids depend on how many came before it.
NUMBERING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{% if m['role'] == 'user' %} {{ loop.index }}{% endif %}"
    "\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class WholeRenderCheck:
    """Wraps Transcript.prompt_for: every prompt must send what rendering the whole
    conversation sends (today's prompt), and the exchange it ends in must get the same ids."""

    def __init__(self, monkeypatch):
        self.prompts, self.shortened = [], 0
        original = Transcript.prompt_for

        def prompt_for(transcript, text):
            got = original(transcript, text)
            history = transcript.conversation.messages()
            whole = prompt_after(transcript.chat_format, history, text, transcript.ids)
            assert got.ids == whole.ids and got.user_ids == whole.user_ids
            self.shortened += len(got.history) < len(history)
            self.prompts.append((got, whole, transcript))
            return got

        monkeypatch.setattr(Transcript, "prompt_for", prompt_for)

    def check_exchange(self, turn):
        whole, transcript = self.prompts[-1][1:]
        chat_format = transcript.chat_format
        expected = reply_span(chat_format, chat_format.stop_ids, whole, turn.exchange, turn.generation.tokens)
        assert transcript.spans.get(turn.exchange) == expected


def converse(session: Session, check: WholeRenderCheck) -> None:
    """Several turns, then /retry and /edit, each checked against the whole rendering."""
    for text in ["Hello there", "What is a tide?", "And in lakes?", "Thanks!", "One more: why is the sky blue?"]:
        turn = session.send(text)
        turn.run()
        check.check_exchange(turn)
    for start in (session.retry, lambda: session.edit(2, "What is a wave?"), lambda: session.send("Go on")):
        turn = start()
        turn.run()
        check.check_exchange(turn)


@pytest.mark.parametrize("format_name", ["chatml", "llama3", "llama2", "template"])
@pytest.mark.parametrize("system", [None, "You are terse."])
def test_turns_send_what_the_whole_rendering_sends(monkeypatch, format_name, system):
    template = CHATML_TEMPLATE if format_name == "template" else None
    session = Session(chat_model(format_name, template=template, max_seq_len=2048), SETTINGS, system=system)
    check = WholeRenderCheck(monkeypatch)
    converse(session, check)
    assert session.transcript.local is True
    assert check.shortened >= 4  # from the third turn on, only the new message was rendered


@pytest.fixture(scope="module")
def default_model_format():
    checkpoint = load_gguf(download_model(DEFAULT_MODEL))
    return get_chat_format(None, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token,
                           checkpoint.eos_token, context_length=checkpoint.args.max_seq_len), checkpoint.tokenizer


@pytest.mark.parametrize("system", [None, "You are a helpful assistant named Tide."])
def test_the_default_models_template_sends_what_the_whole_rendering_sends(monkeypatch, default_model_format, system):
    chat_format, tokenizer = default_model_format
    args = ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=tokenizer.vocab_size,
                     hidden_dim=64, max_seq_len=2048)
    random = Llama.random(args, tokenizer, seed=0)
    model = Llama(random.transformer, tokenizer, name="smollm2-template", chat_format=chat_format)
    check = WholeRenderCheck(monkeypatch)
    converse(Session(model, SETTINGS, system=system), check)
    assert check.shortened >= 4


def test_a_template_that_numbers_turns_is_found_out_and_rendered_whole(monkeypatch):
    session = Session(chat_model("template", template=NUMBERING_TEMPLATE, max_seq_len=2048), SETTINGS)
    check = WholeRenderCheck(monkeypatch)
    converse(session, check)
    assert session.transcript.local is False and check.shortened == 0


def test_plain_text_is_always_rendered_whole(monkeypatch):
    session = Session(chat_model("plain", max_seq_len=2048), SETTINGS)
    check = WholeRenderCheck(monkeypatch)
    for text in ["Once upon", " a time", " there was", " a tide"]:
        session.send(text).run()
    assert session.transcript.local is False and check.shortened == 0


def reference_drop_count(session: Session, text: str) -> int:
    """The fewest oldest exchanges to drop, each candidate rendered whole (as before)."""
    chat_format, system = session.model.chat_format, session.conversation.system_messages()
    room = session.capacity - session.reserve()
    for count in range(1, len(session.conversation.exchanges) + 1):
        history = system + session.conversation.messages()[len(system) + 2 * count:]
        if len(chat_format.encode(history + [user_message(text)])) <= room:
            return count
    return len(session.conversation.exchanges)


@pytest.mark.parametrize("format_name", ["chatml", "llama2", "template"])
def test_overflow_drops_as_many_exchanges_as_whole_renders_say_without_rendering_them(monkeypatch, format_name):
    template = CHATML_TEMPLATE if format_name == "template" else None
    model = chat_model(format_name, template=template, max_seq_len=400)
    session = Session(model, SETTINGS, system="Be brief.")
    for number in range(6):
        session.send(f"message number {number} " * 3).run()
    assert session.transcript.local is True
    encoded, recording = [], [False]
    original = type(model.chat_format).encode

    def encode(chat_format, messages, *rest, **named):
        if recording[0]:
            encoded.append(len(messages))
        return original(chat_format, messages, *rest, **named)

    monkeypatch.setattr(type(model.chat_format), "encode", encode)
    for length in (60, 120, 180, 240):
        text = "x" * length
        room = session.capacity - session.reserve()
        encoded.clear()
        recording[0] = True
        dropped = session.transcript.oldest_to_drop(text, room, session.capacity)
        recording[0] = False
        assert max(encoded) <= 4  # the system prompt, one exchange and the new message at most
        assert dropped == reference_drop_count(session, text)


def test_the_prefix_rule_keeps_the_shorter_ids_only_where_the_longer_begin_with_them():
    assert added([1, 2], [1, 2, 3, 4]) == [3, 4] and added([1, 2], [1, 2]) == []
    assert added([1, 2], [1, 3, 4]) is None and added([1, 2], [1]) is None
    assert added(None, [1]) is None and added([1], None) is None


def test_two_exchanges_of_the_same_text_keep_their_own_ids():
    first, retried = Exchange("hi", "hello"), Exchange("hi", "hello")
    spans = Spans()
    spans[first], spans[retried] = Span([1], [2]), Span([3], [4])
    assert first == retried and spans.get(first) == Span([1], [2]) and spans.get(retried) == Span([3], [4])
    assert spans.get(Exchange("hi", "hello")) is None
