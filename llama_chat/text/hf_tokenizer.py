"""Tokenizers run by Hugging Face's `tokenizers` library (what a tokenizer.json describes).

One backend for byte-level BPE vocabularies (GPT-2 style: Llama 3, SmolLM) and for
SentencePiece-style BPE with byte fallback, whether the vocabulary came from a GGUF
file or from a tokenizer.json.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers

from llama_chat.text.tokenizer import Tokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback pieces


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as a printable character: printable Latin-1
    bytes as themselves, the others as the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    alphabet = {chr(byte): byte for byte in printable}
    alphabet.update({chr(256 + index): byte for index, byte in enumerate(others)})
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` behind llama-chat's Tokenizer interface.

    The tokenizer's added tokens are its named tokens: the special ones are control
    tokens, which `encode` never produces from text (a typed "<|im_end|>" becomes
    ordinary pieces); non-special added tokens are ordinary vocabulary and are matched.
    `decode` shows control tokens by name. The tokenizer object is taken over: its
    special-token matching is switched off here.

    `end_of_turn_ids` are ids besides `eos_id` that end a reply (such as <|eot_id|>);
    `add_bos_token` says whether the model expects `bos_id` at the start of a text;
    `add_prefix_space` puts a space before every non-empty text, as SentencePiece's
    dummy prefix does (the decoder is expected to strip it again). `vocab_size` is one past
    the largest id, counted here unless the caller knows it (a tokenizer from the cache:
    counting a 262k vocabulary takes a quarter of a second).
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        end_of_turn_ids: Iterable[int] = (),
        add_bos_token: bool = False,
        add_prefix_space: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # Text from a user is plain text: control tokens come only from the chat format.
        tokenizer.encode_special_tokens = True
        added = tokenizer.get_added_tokens_decoder()
        self._named = {token.content: token_id for token_id, token in added.items()}
        self._control_names = {token_id: token.content for token_id, token in added.items() if token.special}
        self.vocab_size = vocab_size if vocab_size is not None else 1 + max(
            [*tokenizer.get_vocab(with_added_tokens=True).values(), *added], default=-1
        )
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.end_of_turn_ids = frozenset(end_of_turn_ids)
        self.add_bos_token = add_bos_token
        self.add_prefix_space = add_prefix_space

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        if self.add_prefix_space and text:
            text = " " + text
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        # Ordinary ids are decoded in runs between control tokens: each run is text that
        # was encoded on its own (so a SentencePiece run's dummy prefix is stripped).
        parts: list[str] = []
        run: list[int] = []
        for token in ids:
            name = self._control_names.get(token)
            if name is None:
                run.append(token)
                continue
            if run:
                parts.append(self.tokenizer.decode(run, skip_special_tokens=False))
                run = []
            parts.append(name)
        if run:
            parts.append(self.tokenizer.decode(run, skip_special_tokens=False))
        return "".join(parts)

    def token_id(self, name: str) -> int | None:
        return self._named.get(name)

    def special_token_names(self) -> list[str]:
        return list(self._control_names.values())

    def token_bytes(self, token: int) -> bytes | None:
        piece = self.tokenizer.id_to_token(token)
        if piece is None or token in self._control_names:
            return None
        if self._named.get(piece) == token:  # an added token is written as its text
            return piece.encode("utf-8")
        if isinstance(self.tokenizer.decoder, tokenizers.decoders.ByteLevel):
            return bytes(_BYTE_LEVEL[char] for char in piece)
        byte = _BYTE_PIECE.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def save(self, directory: Path) -> dict:
        tokenizer = self.tokenizer
        if self.add_prefix_space:
            # tokenizer.json has no such switch: write the prefix as a normalizer step, as
            # Hugging Face's own Llama 2 tokenizer.json does.
            tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())
            steps = [tokenizers.normalizers.Prepend("▁")]
            if tokenizer.normalizer is not None:
                steps.append(tokenizer.normalizer)
            tokenizer.normalizer = tokenizers.normalizers.Sequence(steps)
        tokenizer.save(str(Path(directory) / "tokenizer.json"))
        return {"add_bos_token": self.add_bos_token}
