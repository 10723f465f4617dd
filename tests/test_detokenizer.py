import pytest
import sentencepiece as spm

from llama_chat.text.detokenizer import REPLACEMENT, StreamingDetokenizer
from llama_chat.text.tokenizer import ByteTokenizer

TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog.  Twice!\n\nDone.",
    "russian": "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "chinese": "我能吞下玻璃而不伤身体。天气很好。",
    "emoji": "Rockets 🚀🚀 and families 👨‍👩‍👧 with flags 🇫🇷!",
}


def stream(tokenizer, ids):
    detokenizer = StreamingDetokenizer(tokenizer)
    pieces = [detokenizer.add(token) for token in ids]
    pieces.append(detokenizer.flush())
    return pieces


@pytest.mark.parametrize("name", TEXTS)
def test_byte_tokens_stream_whole_characters(name):
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(TEXTS[name])
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == TEXTS[name]
    assert not any(REPLACEMENT in piece for piece in pieces)
    if name != "english":
        assert pieces.count("") > 0  # multi-byte characters were held back


def test_a_broken_character_that_the_full_decode_shows_is_kept():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("ok ") + [0xE2, 0x82]  # an unfinished three-byte character
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert pieces[-1] == REPLACEMENT


class SentencePieceTokenizer:
    """Just the decode the detokenizer needs, straight from the sentencepiece library."""

    def __init__(self, processor):
        self.decode = processor.decode


@pytest.fixture(scope="module")
def sentencepiece_processor(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("spm") / "corpus.txt"
    corpus.write_text("\n".join(list(TEXTS.values()) * 20), encoding="utf-8")
    prefix = corpus.parent / "model"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(prefix) + ".model")


@pytest.mark.parametrize("name", TEXTS)
def test_sentencepiece_tokens_keep_their_word_start_spaces(sentencepiece_processor, name):
    tokenizer = SentencePieceTokenizer(sentencepiece_processor)
    ids = sentencepiece_processor.encode(TEXTS[name] + " 终 ✨ end")  # rare characters become bytes
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == sentencepiece_processor.decode(ids)
    assert not any(REPLACEMENT in piece for piece in pieces)
    assert sum(1 for piece in pieces if piece.startswith(" ")) > 0
