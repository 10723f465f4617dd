"""HFTokenizer and the tokenizers built from GGUF vocabulary metadata."""

import random
import warnings
from pathlib import Path

import pytest
import sentencepiece
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from llama_chat.errors import LlamaChatError
from llama_chat.text.detokenizer import StreamingDetokenizer
from llama_chat.text.gguf_tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    merges_from_scores,
    pre_tokenizer_for,
    tokenizer_from_gguf_metadata,
)
from llama_chat.text.hf_tokenizer import HFTokenizer

ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2", "12 3", "Ġ Ġ"]


def byte_level_metadata(pre: str | None = "gpt-2", **overrides) -> dict:
    """GGUF tokenizer metadata for a tiny byte-level vocabulary: control tokens, bytes, merges."""
    tokens = CONTROL_TOKENS + ALPHABET + ["".join(merge.split(" ")) for merge in MERGES] + ["<tool>"]
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [CONTROL] * 3 + [NORMAL] * (len(tokens) - 4) + [USER_DEFINED],
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 0,
    }
    if pre is not None:
        metadata["tokenizer.ggml.pre"] = pre
    metadata.update(overrides)
    return metadata


def words(pre: str, text: str) -> list[str]:
    return [word for word, _ in pre_tokenizer_for(pre).pre_tokenize_str(text)]


# --- HFTokenizer over a hand-made tokenizers.Tokenizer --------------------------------


def small_hf_tokenizer() -> Tokenizer:
    vocab = {"<s>": 0, "</s>": 1, "<eot>": 2, **{c: 3 + i for i, c in enumerate(ALPHABET)}, "Ġt": 259}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>", "<eot>")])
    return tokenizer


def test_bpe_tokenizer_reads_special_tokens_as_plain_text():
    tokenizer = HFTokenizer(small_hf_tokenizer(), bos_id=0, eos_id=1, end_of_turn_ids=[2])
    ids = tokenizer.encode("a <eot> t")
    vocab = {i: t for t, i in tokenizer.tokenizer.get_vocab().items()}
    assert [vocab[i] for i in ids] == ["a", "Ġ", "<", "e", "o", "t", ">", "Ġt"]
    assert tokenizer.decode(ids) == "a <eot> t"
    assert tokenizer.encode("x", add_bos=True) == [0, 3 + ALPHABET.index("x")]
    assert tokenizer.decode([0, 259, 2]) == "<s> t<eot>"


def test_bpe_tokenizer_names_and_stop_ids():
    tokenizer = HFTokenizer(small_hf_tokenizer(), bos_id=0, eos_id=1, end_of_turn_ids=[2], add_bos_token=True)
    assert tokenizer.token_id("<eot>") == 2
    assert tokenizer.token_id("Ġt") is None  # ordinary vocabulary is not a named token
    assert tokenizer.stop_ids == frozenset({1, 2})
    assert tokenizer.vocab_size == 260
    assert tokenizer.add_bos_token


# --- pre-tokenizers named by tokenizer.ggml.pre ----------------------------------------


def test_smollm_split_isolates_every_digit_before_the_gpt2_split():
    assert words("smollm", "x 2024  0.18") == ["x", "Ġ", "2", "0", "2", "4", "ĠĠ", "0", ".", "1", "8"]


def test_llama3_split_groups_digits_by_three_and_keeps_contractions():
    assert words("llama-bpe", "I'm 12345") == ["I", "'m", "Ġ", "123", "45"]
    assert words("llama3", "I'm 12345") == words("llama-bpe", "I'm 12345")


def test_gpt2_split_keeps_a_number_with_its_leading_space():
    assert words("gpt-2", "I'm 12345  0.18") == ["I", "'m", "Ġ12345", "Ġ", "Ġ0", ".", "18"]


def test_default_split_is_llama_cpps_default():
    # Punctuation runs first, then the GPT-2 split, then digit runs in threes.
    assert words("default", "I'm 12345") == ["I", "'", "m", "Ġ", "123", "45"]


def test_unknown_split_name_warns_and_falls_back_to_gpt2():
    with pytest.warns(UserWarning, match=r"'no-such-split' is unknown.*'gpt-2'"):
        pre_tokenizer = pre_tokenizer_for("no-such-split", "m.gguf")
    assert [w for w, _ in pre_tokenizer.pre_tokenize_str("a 12")] == ["a", "Ġ12"]


def test_missing_split_name_warns_and_uses_default():
    with pytest.warns(UserWarning, match="no tokenizer.ggml.pre"):
        tokenizer = tokenizer_from_gguf_metadata(byte_level_metadata(pre=None))
    assert tokenizer.decode(tokenizer.encode("the 123")) == "the 123"


# --- byte-level ("gpt2") GGUF vocabularies ---------------------------------------------


def test_gguf_byte_level_vocabulary_applies_merges_and_split():
    tokenizer = tokenizer_from_gguf_metadata(byte_level_metadata(pre="gpt-2"))
    vocab = byte_level_metadata()["tokenizer.ggml.tokens"]
    assert [vocab[i] for i in tokenizer.encode(" the in 123")] == ["Ġthe", "Ġ", "in", "Ġ", "123"]
    digits = tokenizer_from_gguf_metadata(byte_level_metadata(pre="smollm"))
    assert [vocab[i] for i in digits.encode(" 123")] == ["Ġ", "1", "2", "3"]


def test_gguf_control_tokens_are_plain_text_when_typed():
    tokenizer = tokenizer_from_gguf_metadata(byte_level_metadata())
    ids = tokenizer.encode("<|im_end|>")
    assert len(ids) > 1 and not set(ids) & {0, 1, 2}
    assert tokenizer.decode(ids) == "<|im_end|>"
    assert tokenizer.token_id("<|im_end|>") == 2
    assert tokenizer.decode([1, *tokenizer.encode("hi"), 2]) == "<|im_start|>hi<|im_end|>"


def test_gguf_user_defined_tokens_are_matched_whole():
    tokenizer = tokenizer_from_gguf_metadata(byte_level_metadata())
    tool = len(byte_level_metadata()["tokenizer.ggml.tokens"]) - 1
    assert tokenizer.encode("a<tool>b")[1] == tool
    assert tokenizer.token_id("<tool>") == tool


def test_gguf_special_ids_and_end_of_generation_tokens():
    tokenizer = tokenizer_from_gguf_metadata(byte_level_metadata(**{"tokenizer.ggml.add_bos_token": True}))
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 0)
    # <|im_end|> is a control token llama.cpp also treats as the end of a reply.
    assert tokenizer.stop_ids == frozenset({0, 2})
    assert tokenizer.add_bos_token
    assert tokenizer.vocab_size == len(byte_level_metadata()["tokenizer.ggml.tokens"])


def test_gguf_llama3_vocabulary_takes_whole_words_that_are_tokens():
    metadata = byte_level_metadata(pre="llama-bpe")
    metadata["tokenizer.ggml.tokens"] = [*metadata["tokenizer.ggml.tokens"], "Ġxyz"]  # no merge builds it
    metadata["tokenizer.ggml.token_type"] = [*metadata["tokenizer.ggml.token_type"], NORMAL]
    whole = len(metadata["tokenizer.ggml.tokens"]) - 1
    assert tokenizer_from_gguf_metadata(metadata).encode(" xyz") == [whole]
    metadata["tokenizer.ggml.pre"] = "gpt-2"
    assert len(tokenizer_from_gguf_metadata(metadata).encode(" xyz")) == 4


def test_gguf_llama3_split_adds_bos_unless_the_file_says_otherwise():
    assert tokenizer_from_gguf_metadata(byte_level_metadata(pre="llama-bpe")).add_bos_token
    told = byte_level_metadata(pre="llama-bpe", **{"tokenizer.ggml.add_bos_token": False})
    assert not tokenizer_from_gguf_metadata(told).add_bos_token
    assert not tokenizer_from_gguf_metadata(byte_level_metadata(pre="smollm")).add_bos_token


def test_gguf_unknown_tokenizer_kind_is_refused():
    with pytest.raises(LlamaChatError, match="'bert' tokenizer"):
        tokenizer_from_gguf_metadata(byte_level_metadata(**{"tokenizer.ggml.model": "bert"}), "m.gguf")


def test_gguf_bad_special_id_is_refused():
    with pytest.raises(LlamaChatError, match="eos token id 9999"):
        tokenizer_from_gguf_metadata(byte_level_metadata(**{"tokenizer.ggml.eos_token_id": 9999}))


def test_streaming_detokenizer_pieces_join_to_decode():
    tokenizer = tokenizer_from_gguf_metadata(byte_level_metadata())
    ids = [1, *tokenizer.encode("the Привет 🙂 in"), 2]
    detokenizer = StreamingDetokenizer(tokenizer)
    text = "".join(detokenizer.add(i) for i in ids) + detokenizer.flush()
    assert text == tokenizer.decode(ids) == "<|im_start|>the Привет 🙂 in<|im_end|>"


# --- SentencePiece-style ("llama") GGUF vocabularies ------------------------------------

CORPUS = """The quick brown fox jumps over the lazy dog. A tokenizer splits text into pieces.
Sentences with numbers like 2024 and 3.14 appear too, and the model reads them all.
Hello world! Hello there, general. The theory of everything is a thing of the mind.
""" * 20


def train_sentencepiece(directory: Path) -> sentencepiece.SentencePieceProcessor:
    """A tiny SentencePiece BPE model trained like Llama's: byte fallback, digits split."""
    (directory / "corpus.txt").write_text(CORPUS)
    sentencepiece.SentencePieceTrainer.train(
        input=str(directory / "corpus.txt"), model_prefix=str(directory / "m"), vocab_size=400,
        model_type="bpe", byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, user_defined_symbols=["<tool>"],
        bos_id=1, eos_id=2, unk_id=0, minloglevel=2,
    )
    return sentencepiece.SentencePieceProcessor(model_file=str(directory / "m.model"))


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory) -> sentencepiece.SentencePieceProcessor:
    return train_sentencepiece(tmp_path_factory.mktemp("spm"))


def spm_metadata(sp: sentencepiece.SentencePieceProcessor) -> dict:
    """What llama.cpp's converter writes for a SentencePiece tokenizer.model."""
    def kind(i: int) -> int:
        if sp.IsUnknown(i):
            return UNKNOWN
        if sp.IsControl(i):
            return CONTROL
        if sp.IsByte(i):
            return BYTE
        if sp.IsUnused(i):
            return UNUSED
        return USER_DEFINED if sp.IdToPiece(i) == "<tool>" else NORMAL

    size = sp.GetPieceSize()
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.IdToPiece(i) for i in range(size)],
        "tokenizer.ggml.scores": [sp.GetScore(i) for i in range(size)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(size)],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": True,
    }


SPM_TEXTS = [
    "The quick brown fox", "Hello world! 2024", "  leading spaces and  double", "trailing ",
    "unseen: Привет, 你好 🙂", "the<tool>thing", "new\nlines\n\nhere", "</s> typed by a user", "",
]


@pytest.mark.parametrize("text", SPM_TEXTS)
def test_gguf_sentencepiece_vocabulary_matches_sentencepiece(sentencepiece_model, text):
    tokenizer = tokenizer_from_gguf_metadata(spm_metadata(sentencepiece_model))
    expected = sentencepiece_model.encode(text)
    assert tokenizer.encode(text) == expected
    assert tokenizer.decode(expected) == sentencepiece_model.decode(expected)


def test_gguf_sentencepiece_vocabulary_matches_sentencepiece_on_random_text(sentencepiece_model):
    tokenizer = tokenizer_from_gguf_metadata(spm_metadata(sentencepiece_model))
    rng = random.Random(0)
    alphabet = "the quick brown fox THE  0123456789.,!?\n\té中🙂<>/"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        assert tokenizer.encode(text) == sentencepiece_model.encode(text), repr(text)


def test_gguf_sentencepiece_names_and_control_tokens(sentencepiece_model):
    tokenizer = tokenizer_from_gguf_metadata(spm_metadata(sentencepiece_model))
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.add_bos_token) == (1, 2, True)
    assert tokenizer.token_id("</s>") == 2
    assert tokenizer.decode([1, *tokenizer.encode("Hello"), 2]) == "<s>Hello</s>"
    assert tokenizer.encode("Hello", add_bos=True)[0] == 1


def test_merges_from_scores_rank_by_score_of_the_merged_piece():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0, 0, 0, -5.0, -1.0, -3.0]
    merges = merges_from_scores(tokens, scores, [NORMAL] * 6)
    assert merges == [("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b")]


def test_gguf_sentencepiece_without_scores_is_refused(sentencepiece_model):
    metadata = spm_metadata(sentencepiece_model)
    del metadata["tokenizer.ggml.scores"]
    with pytest.raises(LlamaChatError, match="one score per token"):
        tokenizer_from_gguf_metadata(metadata)


def test_known_split_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("default", "gpt-2", "llama-bpe", "llama3", "smollm", "smaug-bpe", "starcoder"):
            pre_tokenizer_for(name)


def text_bytes(tokenizer, text: str) -> bytes:
    return b"".join(tokenizer.token_bytes(token) for token in tokenizer.encode(text))


def test_token_bytes_spell_the_text_in_both_kinds_of_vocabulary(sentencepiece_model):
    byte_level = tokenizer_from_gguf_metadata(byte_level_metadata())
    assert text_bytes(byte_level, " the in 123\n\té🙂") == " the in 123\n\té🙂".encode()
    assert byte_level.token_bytes(2) is None  # <|im_end|>, a control token
    spm = tokenizer_from_gguf_metadata(spm_metadata(sentencepiece_model))
    for text in SPM_TEXTS:
        # The dummy prefix is a space before the text, which decoding strips again.
        assert text_bytes(spm, text) == (" " + text if text else "").encode(), repr(text)
    assert spm.token_bytes(2) is None  # </s>
