"""SentencePiece tokenizers (Llama 1 and 2, Mistral, and Hugging Face tokenizer.model files)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import sentencepiece

from llama_chat.errors import LlamaChatError
from llama_chat.text.tokenizer import Tokenizer


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model, plus any special tokens added on top of it.

    SentencePiece never produces control pieces (<s>, </s>) from text, so `encode`
    is plain text by construction. `added_tokens` maps the names of extra special
    tokens (from a Hugging Face tokenizer_config.json) to their ids; they, too, are
    never produced by `encode`. `end_of_turn_ids` are ids besides `eos_id` that end a
    reply; `add_bos_token` says whether the model expects `bos_id` at the start of a text.
    """

    def __init__(
        self,
        processor: sentencepiece.SentencePieceProcessor,
        added_tokens: Mapping[str, int] | None = None,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        end_of_turn_ids: Iterable[int] = (),
        add_bos_token: bool = True,
    ) -> None:
        self.processor = processor
        self.added_tokens = dict(added_tokens or {})
        self._added_names = {token_id: name for name, token_id in self.added_tokens.items()}
        self._piece_count = processor.get_piece_size()
        self.vocab_size = max([self._piece_count, *(i + 1 for i in self._added_names)])
        self.bos_id = self._named_or(bos_token, processor.bos_id())
        self.eos_id = self._named_or(eos_token, processor.eos_id())
        self.end_of_turn_ids = frozenset(end_of_turn_ids)
        self.add_bos_token = add_bos_token

    @classmethod
    def from_file(
        cls, path: str | Path, added_tokens: Mapping[str, int] | None = None, **settings
    ) -> SentencePieceTokenizer:
        """Load a tokenizer.model file; `settings` are the constructor's keyword arguments."""
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as error:
            raise LlamaChatError(f"{path}: not a readable SentencePiece model ({error})") from None
        return cls(processor, added_tokens, **settings)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = self.processor.encode(text, out_type=int)
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        # SentencePiece drops control pieces when decoding; show them by name instead,
        # decoding the ordinary ids between them in runs (byte pieces need their neighbours).
        parts: list[str] = []
        run: list[int] = []
        for token in ids:
            name = self._special_name(token)
            if name is None:
                if 0 <= token < self._piece_count:
                    run.append(token)
                continue  # ids past the vocabulary (padded embeddings) have no text
            if run:
                parts.append(self.processor.decode(run))
                run = []
            parts.append(name)
        if run:
            parts.append(self.processor.decode(run))
        return "".join(parts)

    def token_id(self, name: str) -> int | None:
        if name in self.added_tokens:
            return self.added_tokens[name]
        token = self.processor.piece_to_id(name)
        # piece_to_id answers the <unk> id for every unknown piece: check the piece itself.
        if self.processor.id_to_piece(token) != name:
            return None
        if self.processor.IsControl(token) or self.processor.IsUnknown(token):
            return token
        return None

    def special_token_names(self) -> list[str]:
        controls = [
            self.processor.id_to_piece(i) for i in range(self._piece_count) if self.processor.IsControl(i)
        ]
        return [*controls, *self.added_tokens]

    def token_bytes(self, token: int) -> bytes | None:
        processor = self.processor
        if not 0 <= token < self._piece_count or token in self._added_names:
            return None
        if processor.IsControl(token) or processor.IsUnknown(token):
            return None
        piece = processor.id_to_piece(token)
        if processor.IsByte(token):  # written <0xAB>
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def save(self, directory: Path) -> dict:
        (Path(directory) / "tokenizer.model").write_bytes(self.processor.serialized_model_proto())
        return {
            "add_bos_token": self.add_bos_token,
            "added_tokens_decoder": {
                str(token_id): {"content": name, "special": True} for name, token_id in self.added_tokens.items()
            },
        }

    def _named_or(self, name: str | None, model_default: int) -> int | None:
        token = self.token_id(name) if name else None
        if token is not None:
            return token
        return model_default if model_default >= 0 else None  # SentencePiece says -1 for none

    def _special_name(self, token: int) -> str | None:
        if token in self._added_names:
            return self._added_names[token]
        if 0 <= token < self._piece_count and self.processor.IsControl(token):
            return self.processor.id_to_piece(token)
        return None
