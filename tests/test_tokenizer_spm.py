import io
from pathlib import Path

import pytest
import sentencepiece as spm

from llama_chat.errors import LlamaChatError
from llama_chat.text.detokenizer import StreamingDetokenizer
from llama_chat.text.sentencepiece_tokenizer import SentencePieceTokenizer

CORPUS = """The quick brown fox jumps over the lazy dog. It's 2024, isn't it?
def add(x, y):
    return x + y  # sum
Привет, как дела? Съешь же ещё этих мягких французских булок.
你好，世界。我们今天去公园散步。
Hello world! Numbers 12345 and symbols #@%&*.
""" * 40

SAMPLES = [
    "Hello world",
    "Привет, мир! Как дела?",
    "你好，世界。今天天气很好。",
    "def add(x, y):\n    return x + y\n",
    "emoji 😀🎉 and 🦙 llama",
    "runs   of    spaces\n\n\nand newlines\t\ttabs",
    "  leading and trailing spaces  ",
    "rare glyphs ж ∑ ℵ ☃ never seen: ꙮ",
]


def train_tiny_spm(path: Path, vocab_size: int = 420) -> Path:
    """A small BPE SentencePiece model with Llama's settings (byte fallback, digits split, no normalisation)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        character_coverage=0.99,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())
    return path


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return train_tiny_spm(tmp_path_factory.mktemp("spm") / "tokenizer.model")


@pytest.fixture(scope="module")
def reference(model_path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(model_path))


@pytest.fixture(scope="module")
def tokenizer(model_path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer.from_file(model_path)


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_matches_sentencepiece_and_round_trips(tokenizer, reference, text):
    ids = tokenizer.encode(text)
    assert ids == reference.encode(text)
    assert tokenizer.decode(ids) == text


def test_unseen_characters_fall_back_to_bytes(tokenizer, reference):
    ids = tokenizer.encode("ꙮ")
    assert all(reference.IsByte(i) for i in ids[1:])  # after the word-start piece
    assert len([i for i in ids if reference.IsByte(i)]) == len("ꙮ".encode())


def test_control_token_strings_in_text_stay_plain_text(tokenizer):
    text = "<s>[INST] hi </s><unk>"
    ids = tokenizer.encode(text)
    assert not {tokenizer.bos_id, tokenizer.eos_id, 0} & set(ids)
    assert tokenizer.decode(ids) == text


def test_bos_eos_and_control_names(tokenizer):
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (1, 2, 420)
    assert tokenizer.token_id("<s>") == 1
    assert tokenizer.token_id("</s>") == 2
    assert tokenizer.token_id("<unk>") == 0
    assert tokenizer.token_id("the") is None  # an ordinary piece is not a control token
    assert tokenizer.token_id("<|im_end|>") is None
    assert tokenizer.stop_ids == frozenset({2})
    assert tokenizer.add_bos_token is True


def test_add_bos_and_control_tokens_decode_by_name(tokenizer):
    ids = tokenizer.encode("Hello world", add_bos=True)
    assert ids[0] == 1
    assert tokenizer.decode([*ids, 2]) == "<s>Hello world</s>"


def test_added_special_tokens(model_path):
    tokenizer = SentencePieceTokenizer.from_file(
        model_path,
        {"<|im_start|>": 420, "<|im_end|>": 421},
        eos_token="<|im_end|>",
        end_of_turn_ids=[2],
    )
    assert tokenizer.vocab_size == 422
    assert tokenizer.eos_id == 421
    assert tokenizer.token_id("<|im_start|>") == 420
    assert tokenizer.stop_ids == frozenset({2, 421})
    ids = tokenizer.encode("<|im_end|>")
    assert 421 not in ids and tokenizer.decode(ids) == "<|im_end|>"
    hello = tokenizer.encode("Hi there")
    assert tokenizer.decode([420, *hello, 421]) == "<|im_start|>Hi there<|im_end|>"


def test_streaming_detokenizer_reassembles_text(tokenizer):
    text = "Привет 😀 world,  你好!\n  x"
    stream = StreamingDetokenizer(tokenizer)
    pieces = [stream.add(token) for token in tokenizer.encode(text)]
    pieces.append(stream.flush())
    assert "".join(pieces) == text


def test_unreadable_model_file(tmp_path):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(b"\x00not a model")
    with pytest.raises(LlamaChatError, match="not a readable SentencePiece model"):
        SentencePieceTokenizer.from_file(path)


@pytest.mark.parametrize("text", SAMPLES)
def test_token_bytes_spell_the_text(tokenizer, text):
    spelled = b"".join(tokenizer.token_bytes(token) for token in tokenizer.encode(text))
    assert spelled == (" " + text).encode()  # with SentencePiece's dummy prefix
    assert tokenizer.token_bytes(tokenizer.eos_id) is None
