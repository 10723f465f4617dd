"""Decode steps: from the token just chosen to the next. The plain step is here; the
speculative one, which may give several tokens a step, is in engine/speculation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.engine.processors import LogitsProcessor
from llama_chat.engine.sampling import Sampler

if TYPE_CHECKING:
    from llama_chat.engine.runners import Runner


@dataclass(frozen=True)
class StepResult:
    """What a step gives: the drafts the model kept, then the token it chose after them."""

    token: int
    kept: list[int] = field(default_factory=list)
    drafted: int = 0  # drafts the model weighed


class DecodeStep(Protocol):
    def __call__(self, token: int, history: Sequence[int], remaining: int) -> StepResult:
        """Feed `token` (history is everything before it) and choose what follows; at most
        `remaining` tokens may come before the chosen one."""


class PlainStep:
    """Feeds the last token and chooses the next from the model's logits, as the reply's
    processor allows."""

    def __init__(self, runner: Runner, cache: KVCache, sampler: Sampler, processor: LogitsProcessor) -> None:
        self.runner = runner
        self.cache = cache
        self.sampler = sampler
        self.processor = processor

    def choose(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        return self.sampler(self.processor.mask(logits), history)

    def __call__(self, token: int, history: Sequence[int], remaining: int = 0) -> StepResult:
        return StepResult(self.choose(self.runner(self.cache, [token]), history))
