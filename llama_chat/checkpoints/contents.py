"""What every checkpoint reader returns: the model's settings, its weights in our names (read
only when the model is built), its tokenizer and chat template."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llama_chat.checkpoints.stored import StoredMatrix
from llama_chat.engine.config import ModelArgs
from llama_chat.text.tokenizer import Tokenizer

Weight = torch.Tensor | StoredMatrix  # vectors as tensors, matrices read a block of rows at a time


def stored_bytes(weight: Weight) -> int:
    """Bytes a weight takes in its file (what a load's progress counts)."""
    return weight.stored_bytes if isinstance(weight, StoredMatrix) else weight.numel() * weight.element_size()


@dataclass
class Checkpoint:
    """A model as read from disk, in this project's tensor names and rotary layout."""

    args: ModelArgs
    # Our names: norms as tensors on the CPU (any float dtype), matrices as StoredMatrix,
    # read only when the loader packs or converts them.
    tensors: dict[str, Weight]
    tokenizer: Tokenizer
    chat_template: str | None  # Jinja source shipped with the model, if any
    bos_token: str | None = None  # token names, for templates
    eos_token: str | None = None
    # The GGUF type the layers' weights were stored as (e.g. "Q4_1"), whatever form they
    # reached us in: it tells how far they can be packed again without losing anything.
    source_quantization: str | None = None
    # The sampling settings the model's authors recommend, in SamplingSettings' names.
    sampling: dict = field(default_factory=dict)
    # What the files call the model (GGUF's general.basename and general.name, a Hugging
    # Face config's _name_or_path): how a model card is matched to it (models/cards.py).
    names: tuple[str, ...] = ()

    @property
    def stop_ids(self) -> frozenset[int]:
        """Every end-of-turn and end-of-sequence id: the tokenizer's, which the reader set up."""
        return self.tokenizer.stop_ids

    def state_dict(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Every tensor read and converted to `dtype` (a tied head is the embedding itself)."""
        return dense_state_dict(self.tensors, dtype)


def dense_state_dict(weights: dict[str, Weight], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Weights read into tensors of `dtype`; one weight under two names stays one tensor."""
    dense: dict[int, torch.Tensor] = {}
    state = {}
    for name, weight in weights.items():
        if id(weight) not in dense:
            value = weight.dense() if isinstance(weight, StoredMatrix) else weight
            dense[id(weight)] = value.to(dtype)
        state[name] = dense[id(weight)]
    return state
