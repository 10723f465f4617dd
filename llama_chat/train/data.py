"""Training data for `llama-chat train`: the corpus, its split, the tokenizer, and batches."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece
import torch

from llama_chat.errors import LlamaChatError
from llama_chat.text.sentencepiece_tokenizer import SentencePieceTokenizer

# SentencePiece's own pieces: <unk>, <s>, </s>, 256 byte pieces, and the newline piece.
RESERVED_PIECES = 3 + 256 + 1


@dataclass
class Corpus:
    """The text split once into a training part and a held-out validation part."""

    train_text: str
    validation_text: str
    fingerprint: str  # sha256 of the whole text: a resumed run must see the same data


def read_corpus(paths: Sequence[str | Path], validation_fraction: float) -> Corpus:
    """Read the files; the last `validation_fraction` of each file is held out.

    Cutting every file (rather than the concatenation) keeps each play or book in
    both parts; the two parts never share a character of the text.
    """
    if not paths:
        raise LlamaChatError("no training data: give one or more text files with --data")
    train_parts, validation_parts, digest = [], [], hashlib.sha256()
    for path in map(Path, paths):
        text = _read_text(path)
        digest.update(text.encode("utf-8"))
        cut = _cut_at_line(text, round(len(text) * (1 - validation_fraction)))
        train_parts.append(text[:cut])
        validation_parts.append(text[cut:])
    return Corpus("".join(train_parts), "".join(validation_parts), digest.hexdigest())


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise LlamaChatError(f"{path}: no such file; --data takes plain-text files")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LlamaChatError(f"{path}: not UTF-8 text; --data takes plain-text files") from None
    if not text.strip():
        raise LlamaChatError(f"{path}: the file is empty; give files with text to train on")
    return text


def _cut_at_line(text: str, position: int) -> int:
    """The start of the line at or after position, so that no line is split in two."""
    newline = text.find("\n", position)
    return position if newline < 0 else newline + 1


def train_tokenizer(text: str, kind: str, vocab_size: int) -> SentencePieceTokenizer:
    """A SentencePiece tokenizer learnt from the training text: "bpe" or "char" pieces.

    Both fall back to bytes for characters never seen, and keep text exactly: no
    normalisation, no added leading space, whitespace and newlines as they are.
    """
    lines = [line for line in text.split("\n") if line]
    if kind == "char":
        vocab_size = RESERVED_PIECES + len(set(text) - {"\n"})
    elif vocab_size <= RESERVED_PIECES + len(set(text)):
        raise LlamaChatError(
            f"--vocab-size {vocab_size} is too small for this text: give more than "
            f"{RESERVED_PIECES + len(set(text))} (the byte pieces and every character seen)"
        )
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, model_type=kind, vocab_size=vocab_size,
            hard_vocab_limit=False, byte_fallback=True, character_coverage=1.0,
            normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
            user_defined_symbols=["\n"], split_digits=True, num_threads=1, minloglevel=2,
        )
    except RuntimeError as error:
        raise LlamaChatError(f"could not train a {kind} tokenizer on this text ({error})") from None
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return SentencePieceTokenizer(processor)


def encode(tokenizer: SentencePieceTokenizer, text: str) -> torch.Tensor:
    """The token ids of a text, as one long tensor (int64)."""
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def check_length(ids: torch.Tensor, context: int, part: str) -> None:
    if len(ids) < context + 1:
        raise LlamaChatError(
            f"the {part} text is {len(ids)} tokens, less than one context window ({context} + 1): "
            f"give more text, a smaller --context or a different --validation-fraction"
        )


def windows(ids: torch.Tensor, starts: torch.Tensor, context: int, bos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets [len(starts), context] for windows of ids beginning at `starts`.

    Every input opens with <s>, as a prompt does when llama-chat completes it, and goes
    on mid-text: the model learns to continue text from whatever point it is given.
    """
    offsets = torch.arange(context)
    targets = ids[starts[:, None] + offsets]
    inputs = torch.cat([torch.full((len(starts), 1), bos_id), targets[:, :-1]], dim=1)
    return inputs, targets


def random_batch(
    ids: torch.Tensor, batch_size: int, context: int, bos_id: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of windows at random places, drawn from `generator` (its state is the data position)."""
    starts = torch.randint(0, len(ids) - context + 1, (batch_size,), generator=generator)
    return windows(ids, starts, context, bos_id)


def validation_batches(
    ids: torch.Tensor, batch_size: int, context: int, bos_id: int, max_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same evenly spread windows of the validation ids at every evaluation."""
    count = min(max_batches * batch_size, (len(ids) - context) // context + 1)
    starts = torch.linspace(0, len(ids) - context, count).long()
    return [windows(ids, chunk, context, bos_id) for chunk in starts.split(batch_size)]
