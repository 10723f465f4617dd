"""What every checkpoint reader returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelArgs
from ..tokenizer import Tokenizer


@dataclass
class Checkpoint:
    """A model as read from disk, in this project's tensor names and rotary layout."""

    args: ModelArgs
    tensors: dict[str, torch.Tensor]  # on the CPU, any float dtype
    tokenizer: Tokenizer
    chat_template: str | None  # Jinja source shipped with the model, if any
    stop_ids: frozenset[int]  # every end-of-turn and end-of-sequence id
    bos_token: str | None = None  # token names, for templates
    eos_token: str | None = None
