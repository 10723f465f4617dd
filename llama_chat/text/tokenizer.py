"""The interface every tokenizer backend offers, and a byte-level tokenizer for tests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path

from llama_chat.errors import LlamaChatError

# Control tokens that end generation whatever a file's eos/eot ids say
# (llama.cpp recognises the same names).
END_OF_GENERATION_NAMES = frozenset(
    {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>", "<|end|>", "<end_of_turn>"}
)


class Tokenizer(ABC):
    """Text to token ids and back.

    `encode` treats its input as plain text: a special-token string such as
    "<|im_end|>" typed by a user becomes ordinary tokens, never the control token.
    Control tokens are looked up by name with `token_id` and inserted by the chat format.
    """

    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos_token: bool = False  # whether the model expects bos_id at the start of a text
    end_of_turn_ids: frozenset[int] = frozenset()  # ids besides eos_id that end a reply

    @abstractmethod
    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of plain text."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (control tokens appear as their names)."""

    @abstractmethod
    def token_id(self, name: str) -> int | None:
        """The id of a special (control) token by its name, or None."""

    @abstractmethod
    def special_token_names(self) -> Iterable[str]:
        """Names of all control tokens (what a chat template may write to mean one)."""

    @abstractmethod
    def token_bytes(self, token: int) -> bytes | None:
        """The bytes of text a token stands for (part of a character, maybe); None for a
        control token or an id with no text (what a grammar may never produce)."""

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a reply (end-of-sequence and end-of-turn tokens)."""
        return frozenset(i for i in (self.eos_id,) if i is not None) | self.end_of_turn_ids

    def token_name(self, token: int | None) -> str | None:
        """The name of a control token (they decode to their own names in every backend)."""
        return self.decode([token]) if token is not None else None

    def save(self, directory: Path) -> dict:
        """Write this tokenizer's files into a Hugging Face-style directory.

        Returns the entries it needs in tokenizer_config.json.
        """
        raise LlamaChatError(f"a {type(self).__name__} cannot be saved to a checkpoint directory")


class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte (ids 0-255), then a few named control tokens.

    Multi-byte characters span several tokens, which makes it a demanding test of
    streaming detokenisation, and it needs no vocabulary file. A `vocab_size` larger
    than that adds unnamed tokens <extra_N>, so it can serve a model of any vocabulary.
    Like Llama's SentencePiece tokenizers, it wants <s> (where it has one) before a text.
    """

    add_bos_token = True

    def __init__(self, specials: Sequence[str] = ("<s>", "</s>"), vocab_size: int | None = None) -> None:
        self.specials = list(specials)
        extra = (vocab_size or 0) - 256 - len(self.specials)
        self.specials += [f"<extra_{n}>" for n in range(max(extra, 0))]
        self.vocab_size = 256 + len(self.specials)
        self.bos_id = self.token_id("<s>")
        self.eos_id = self.token_id("</s>")

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        pieces: list[str] = []
        pending = bytearray()
        for token in ids:
            if token < 256:
                pending.append(token)
                continue
            pieces.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            pieces.append(self.specials[token - 256])
        pieces.append(pending.decode("utf-8", errors="replace"))
        return "".join(pieces)

    def token_id(self, name: str) -> int | None:
        return 256 + self.specials.index(name) if name in self.specials else None

    def token_bytes(self, token: int) -> bytes | None:
        return bytes([token]) if 0 <= token < 256 else None

    def special_token_names(self) -> list[str]:
        return list(self.specials)
