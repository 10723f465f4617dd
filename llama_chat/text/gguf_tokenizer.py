"""Tokenizers described by GGUF metadata (the tokenizer.ggml.* keys llama.cpp writes).

Two vocabulary kinds are supported:
- "gpt2": byte-level BPE with merges; `tokenizer.ggml.pre` names how text is split
  into words before merging, which must match the split the model was trained with;
- "llama": SentencePiece-style BPE, where merge priority comes from the score of the
  merged piece and characters missing from the vocabulary fall back to <0xNN> tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from llama_chat.errors import LlamaChatError
from llama_chat.text.hf_tokenizer import HFTokenizer
from llama_chat.text.tiktoken_tokenizer import LLAMA3_PATTERN
from llama_chat.text.tokenizer import END_OF_GENERATION_NAMES

# llama.cpp's token types (SentencePiece's piece types, same numbers).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# llama.cpp's "default", used for files written before the split was recorded:
# each expression splits the pieces the previous one left.
DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")

FALLBACK_PRE_TOKENIZER = "gpt-2"


def _byte_level_after(*splits: str) -> pre_tokenizers.PreTokenizer:
    """Regex splits (matches kept as their own words), then bytes to the BPE alphabet."""
    steps = [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
    return pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # SmolLM and StarCoder: every digit is a word of its own, then the GPT-2 split.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _llama3() -> pre_tokenizers.PreTokenizer:
    return _byte_level_after(LLAMA3_PATTERN)


def _qwen2() -> pre_tokenizers.PreTokenizer:
    # Qwen2's (and its distillations'): Llama 3's split with every digit a word of its own.
    return _byte_level_after(LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}"))


# tiktoken's o200k split (GPT-4o's), which Phi-4-mini's tokenizer.json names: a word may
# start with capitals and ends at a change back to them; contractions stay on their word.
_LETTERS_UPPER, _LETTERS_LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
O200K_SPLIT = "|".join([
    rf"[^\r\n\p{{L}}\p{{N}}]?{_LETTERS_UPPER}*{_LETTERS_LOWER}+{_CONTRACTION}",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_LETTERS_UPPER}+{_LETTERS_LOWER}*{_CONTRACTION}",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])


def _o200k() -> pre_tokenizers.PreTokenizer:
    return _byte_level_after(O200K_SPLIT)


def _default() -> pre_tokenizers.PreTokenizer:
    return _byte_level_after(*DEFAULT_SPLITS)


# tokenizer.ggml.pre names (llama.cpp's) -> how to build the split.
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _default,
    **dict.fromkeys(("gpt-2", "mpt", "olmo", "jais"), _gpt2),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"), _llama3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _qwen2),
    **dict.fromkeys(("gpt-4o", "llama4"), _o200k),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"), _digits_then_gpt2
    ),
}
# Llama 3's tokenizer takes a whole word that is itself a token before trying merges,
# and wants BOS unless the file says otherwise (as llama.cpp does for these names).
LLAMA3_NAMES = frozenset({"llama-bpe", "llama3", "llama-v3", "falcon3"})


def pre_tokenizer_for(name: str | None, source: str = "model.gguf") -> pre_tokenizers.PreTokenizer:
    """The text split llama.cpp calls `name`; a warning and the GPT-2 split for unknown names."""
    if name is None:
        warnings.warn(
            f"{source} does not say how its tokenizer splits text (no tokenizer.ggml.pre); "
            "using llama.cpp's 'default' split, so tokens may differ from the model's training",
            stacklevel=2,
        )
        name = "default"
    build = PRE_TOKENIZERS.get(name)
    if build is None:
        warnings.warn(
            f"{source}: tokenizer pre-split {name!r} is unknown to llama-chat; falling back to the "
            f"{FALLBACK_PRE_TOKENIZER!r} split, so tokens may differ from the model's training",
            stacklevel=2,
        )
        build = PRE_TOKENIZERS[FALLBACK_PRE_TOKENIZER]
    return build()


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any], source: str = "model.gguf") -> HFTokenizer:
    """The tokenizer a GGUF file's tokenizer.ggml.* metadata describes."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise LlamaChatError(f"{source} has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    token_types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise LlamaChatError(
            f"{source}: tokenizer.ggml.token_type does not match the vocabulary; the file is corrupt"
        )
    if kind == "gpt2":
        tokenizer = _byte_level_tokenizer(tokens, metadata, source)
        default_add_bos = metadata.get("tokenizer.ggml.pre") in LLAMA3_NAMES
        prefix_space = False
    elif kind == "llama":
        tokenizer = _sentencepiece_tokenizer(tokens, token_types, metadata, source)
        default_add_bos = True
        prefix_space = add_space_prefix(metadata)
    else:
        raise LlamaChatError(
            f"{source} uses a {kind!r} tokenizer; llama-chat reads 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece) vocabularies"
        )
    _add_named_tokens(tokenizer, tokens, token_types)
    ends = [metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("eot", "eom")]
    ends += [
        index
        for index, (token, token_type) in enumerate(zip(tokens, token_types))
        if token_type == CONTROL and token in END_OF_GENERATION_NAMES
    ]
    return HFTokenizer(
        tokenizer,
        bos_id=_token_id(metadata, "bos", len(tokens), source),
        eos_id=_token_id(metadata, "eos", len(tokens), source),
        end_of_turn_ids=[i for i in ends if i is not None and 0 <= i < len(tokens)],
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos)),
        add_prefix_space=prefix_space,
    )


def add_space_prefix(metadata: Mapping[str, Any]) -> bool:
    """Whether a SentencePiece vocabulary puts a space before each text (llama.cpp's default: yes)."""
    return bool(metadata.get("tokenizer.ggml.add_space_prefix", True))


def _token_id(metadata: Mapping[str, Any], role: str, vocab_size: int, source: str) -> int | None:
    token = metadata.get(f"tokenizer.ggml.{role}_token_id")
    if token is not None and not 0 <= token < vocab_size:
        raise LlamaChatError(f"{source}: the {role} token id {token} is outside the vocabulary of {vocab_size}")
    return token


def _first_ids(tokens: Sequence[str]) -> dict[str, int]:
    """Token text -> id; a text listed twice keeps its first id."""
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    return vocab


def _byte_level_tokenizer(tokens: Sequence[str], metadata: Mapping[str, Any], source: str) -> BackendTokenizer:
    pairs = [tuple(merge.split(" ")) for merge in metadata.get("tokenizer.ggml.merges") or ()]
    if any(len(pair) != 2 for pair in pairs):
        raise LlamaChatError(f"{source}: a tokenizer merge is not two tokens apart; the file is corrupt")
    name = metadata.get("tokenizer.ggml.pre")
    model = models.BPE(vocab=_first_ids(tokens), merges=pairs, ignore_merges=name in LLAMA3_NAMES)
    tokenizer = BackendTokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizer_for(name, source)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_tokenizer(
    tokens: Sequence[str], token_types: Sequence[int], metadata: Mapping[str, Any], source: str
) -> BackendTokenizer:
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise LlamaChatError(
            f"{source}: a SentencePiece vocabulary needs one score per token (tokenizer.ggml.scores)"
        )
    vocab = _first_ids(tokens)
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    model = models.BPE(
        vocab=vocab,
        merges=merges_from_scores(tokens, scores, token_types, vocab),
        unk_token=tokens[unknown] if unknown is not None and 0 <= unknown < len(tokens) else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = BackendTokenizer(model)
    # Spaces are written "▁"; the dummy prefix (a space before the text) is added by
    # HFTokenizer, since tokenizers' Metaspace skips it when the text starts with a space,
    # and a Prepend normalizer would also put it after every user-defined token.
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix(metadata):
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def merges_from_scores(
    tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int],
    vocab: Mapping[str, int] | None = None,
) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's rule: join the adjacent pair whose union
    is the best-scoring ordinary piece.

    Every split of an ordinary piece into two pieces of the vocabulary is a merge,
    ranked by the piece's score (best first). `vocab` is _first_ids(tokens), if made already.
    """
    vocab = vocab if vocab is not None else _first_ids(tokens)
    candidates = []
    for index, (token, kind) in enumerate(zip(tokens, token_types)):
        if kind != NORMAL or vocab[token] != index:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                candidates.append((-scores[index], index, vocab[left], left, right))
    candidates.sort()
    return [(left, right) for *_, left, right in candidates]


def _add_named_tokens(tokenizer: BackendTokenizer, tokens: Sequence[str], token_types: Sequence[int]) -> None:
    """Control and unknown tokens become special (never read from text, decoded by name);
    user-defined tokens become added tokens that are matched whole in text, as llama.cpp does."""
    special = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, token_types)
        if kind in (CONTROL, UNKNOWN)
    ]
    user_defined = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(tokens, token_types)
        if kind == USER_DEFINED
    ]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user_defined)
