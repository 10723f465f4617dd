"""Logits processors: what holds a reply to rules (a format, later tool calls) beside the model.

A processor changes the logits before each token is chosen and follows the tokens taken.
It may also propose drafts it is sure of (the bytes a format forces next), refuse drafts
it would never allow, and take tokens past max_tokens to end the reply whole. A reply
follows one processor or none; the decode loop and speculation see only this interface,
so a new kind of rule slots in without touching them (a reply with no rule runs with the
base class, which has no say in anything).
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

    def near_end(self, generated: int, max_tokens: int, remaining: int) -> None:
        """Told before each token after the first: tokens generated so far, the budget, and
        the tokens the reply may still take (its limit and the positions left in the cache)."""

    @property
    def finished(self) -> bool:
        """Whether nothing more may follow: the reply ends here."""
        return False

