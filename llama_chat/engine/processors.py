"""Logits processors: what holds a reply to rules (a format, later tool calls) beside the model.

A processor changes the logits before each token is chosen and follows the tokens taken.
It may also propose drafts it is sure of (the bytes a format forces next), refuse drafts
it would never allow, and take tokens past max_tokens to end the reply whole. The
decode loop and speculation see only `Processors`, the reply's processors as one, so a
new kind of rule slots in without touching them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class LogitsProcessor:
    """A rule a reply's tokens follow. Each method has the default of a processor that has
    no say in it: a processor overrides what it needs (`mask` and `advance` at least)."""

    extra_tokens = 0  # tokens past max_tokens the reply may take to end whole
    seconds = 0.0  # time spent on masks and draft checks, for the reply's statistics
    masks = 0  # masks computed

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [vocab] with the tokens not allowed next set to -inf."""
        return logits

    def advance(self, token: int) -> None:
        """Take a token that was chosen (always one the mask allowed)."""

    def forced(self) -> list[int]:
        """Tokens that must come next whatever the model says: drafts almost always kept."""
        return []

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of these tokens, in order from here, are allowed."""
        return len(tokens)

    def near_end(self, generated: int, max_tokens: int, room: int) -> None:
        """Told before each token after the first: tokens generated so far, the budget, and
        the tokens the reply may still take (its limit and the cache's room)."""

    @property
    def finished(self) -> bool:
        """Whether nothing more may follow: the reply ends here."""
        return False


class Processors(LogitsProcessor):
    """A reply's processors applied as one, in order."""

    def __init__(self, processors: Sequence[LogitsProcessor] = ()) -> None:
        self.processors = list(processors)

    def __bool__(self) -> bool:
        return bool(self.processors)

    @property
    def extra_tokens(self) -> int:
        return max((p.extra_tokens for p in self.processors), default=0)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.processors)

    @property
    def masks(self) -> int:
        return sum(p.masks for p in self.processors)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        for processor in self.processors:
            logits = processor.mask(logits)
        return logits

    def advance(self, token: int) -> None:
        for processor in self.processors:
            processor.advance(token)

    def forced(self) -> list[int]:
        """The first processor's forced tokens, as far as the others allow them."""
        for index, processor in enumerate(self.processors):
            tokens = processor.forced()
            if tokens:
                others = self.processors[:index] + self.processors[index + 1 :]
                return tokens[: min((p.allowed_prefix(tokens) for p in others), default=len(tokens))]
        return []

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        return min((p.allowed_prefix(tokens) for p in self.processors), default=len(tokens))

    def near_end(self, generated: int, max_tokens: int, room: int) -> None:
        for processor in self.processors:
            processor.near_end(generated, max_tokens, room)

    @property
    def finished(self) -> bool:
        return any(p.finished for p in self.processors)
