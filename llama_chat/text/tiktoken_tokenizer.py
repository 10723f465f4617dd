"""Llama 3's tiktoken tokenizer (the tokenizer.model of Meta's Llama 3 checkpoints)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from llama_chat.errors import LlamaChatError
from llama_chat.text.tokenizer import Tokenizer

# Llama 3's pre-tokenizer split: contractions, words, numbers of up to 3 digits,
# punctuation runs, newlines, other whitespace.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_SPECIAL_TOKENS = 256
_NAMED_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
_STOP_TOKENS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")

# tiktoken's BPE is quadratic in the length of one pre-token: long runs of
# whitespace or of non-whitespace are cut before encoding, as Meta's reference does.
_MAX_ENCODE_CHARS = 400_000
_MAX_RUN_CHARS = 25_000


def llama3_special_tokens(base_vocab_size: int) -> dict[str, int]:
    """The 256 special tokens that follow the base vocabulary, by name (Llama 3.1 naming)."""
    reserved = (
        f"<|reserved_special_token_{i}|>"
        for i in range(3, 3 + NUM_SPECIAL_TOKENS - len(_NAMED_SPECIAL_TOKENS))
    )
    names = [*_NAMED_SPECIAL_TOKENS, *reserved]
    return {name: base_vocab_size + offset for offset, name in enumerate(names)}


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """The mergeable ranks of a tiktoken BPE file: one "base64-token rank" line per token."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (ValueError, binascii.Error):
                raise LlamaChatError(
                    f"{path}: line {number} is not 'base64-token rank': not a tiktoken tokenizer file"
                ) from None
    if not ranks:
        raise LlamaChatError(f"{path}: empty tiktoken tokenizer file")
    return ranks


def looks_like_tiktoken(path: str | Path) -> bool:
    """Whether a tokenizer.model is a tiktoken BPE file (text lines) rather than SentencePiece (protobuf)."""
    with open(path, "rb") as file:
        first_line = file.readline(1024).split()
    if len(first_line) != 2 or not first_line[1].isdigit():
        return False
    try:
        base64.b64decode(first_line[0], validate=True)
    except binascii.Error:
        return False
    return True


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding: a regex split, then byte-level BPE by rank; special tokens by name.

    `stop_tokens` name the tokens that end a reply besides `eos_token`.
    """

    add_bos_token = True  # Llama 3 texts start with <|begin_of_text|>

    def __init__(
        self,
        mergeable_ranks: Mapping[bytes, int],
        special_tokens: Mapping[str, int],
        *,
        pattern: str = LLAMA3_PATTERN,
        bos_token: str | None = None,
        eos_token: str | None = None,
        stop_tokens: Sequence[str] = (),
        name: str = "llama3",
    ) -> None:
        try:
            import tiktoken
        except ImportError:
            raise LlamaChatError("this model's tokenizer needs the tiktoken package: pip install tiktoken") from None
        self.special_tokens = dict(special_tokens)
        self.mergeable_ranks = dict(mergeable_ranks)
        self.encoding = tiktoken.Encoding(
            name=name, pat_str=pattern, mergeable_ranks=self.mergeable_ranks, special_tokens=self.special_tokens
        )
        self.vocab_size = self.encoding.n_vocab
        self.bos_id = self.token_id(bos_token) if bos_token else None
        self.eos_id = self.token_id(eos_token) if eos_token else None
        self.end_of_turn_ids = frozenset(self.special_tokens[t] for t in stop_tokens if t in self.special_tokens)

    @classmethod
    def llama3(cls, path: str | Path) -> TiktokenTokenizer:
        """Meta's Llama 3 tokenizer.model: the BPE file plus Llama 3's pattern and special tokens."""
        ranks = read_tiktoken_ranks(path)
        return cls(
            ranks,
            llama3_special_tokens(len(ranks)),
            bos_token="<|begin_of_text|>",
            eos_token="<|end_of_text|>",
            stop_tokens=_STOP_TOKENS,
        )

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = [self.bos_id] if add_bos and self.bos_id is not None else []
        for chunk in _encodable_chunks(text):
            # Special-token strings in the text are ordinary text: allowed nowhere, refused nowhere.
            ids.extend(self.encoding.encode(chunk, allowed_special=set(), disallowed_special=()))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids), errors="replace")

    def token_id(self, name: str) -> int | None:
        return self.special_tokens.get(name)

    def special_token_names(self) -> list[str]:
        return list(self.special_tokens)

    def token_bytes(self, token: int) -> bytes | None:
        if token in self.special_tokens.values() or not 0 <= token < len(self.mergeable_ranks):
            return None
        return self.encoding.decode_single_token_bytes(token)

    def save(self, directory: Path) -> dict:
        """tokenizer.model in Meta's tiktoken format: base64 of each token's bytes, then its rank."""
        lines = [
            f"{base64.b64encode(token).decode('ascii')} {rank}\n"
            for token, rank in sorted(self.mergeable_ranks.items(), key=lambda item: item[1])
        ]
        (Path(directory) / "tokenizer.model").write_text("".join(lines), encoding="ascii")
        return {"add_bos_token": True}


def _encodable_chunks(text: str) -> Iterator[str]:
    for start in range(0, len(text), _MAX_ENCODE_CHARS):
        yield from _split_long_runs(text[start : start + _MAX_ENCODE_CHARS])


def _split_long_runs(text: str) -> Iterator[str]:
    """Cut text so that no piece holds more than _MAX_RUN_CHARS whitespace or non-whitespace in a row."""
    start = 0
    for run in re.finditer(r"\s+|\S+", text):
        for cut in range(run.start() + _MAX_RUN_CHARS, run.end(), _MAX_RUN_CHARS):
            yield text[start:cut]
            start = cut
    yield text[start:]
