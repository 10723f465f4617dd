"""The KV cache: preallocated key/value buffers and the token ids they hold."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llama_chat.engine.config import ModelArgs
from llama_chat.errors import ContextOverflowError


def common_length(first: Sequence[int], second: Sequence[int]) -> int:
    """How many ids the two sequences begin with alike."""
    length = 0
    for a, b in zip(first, second):
        if a != b:
            break
        length += 1
    return length


class KVCache:
    """Keys and values of every layer for up to `capacity` positions of one sequence.

    `tokens` lists the ids whose keys and values fill positions [0, len(tokens)); it is
    the single record of what the cache holds. Truncating only shortens that list: the
    stale entries past it are overwritten by the next write.
    """

    def __init__(
        self,
        args: ModelArgs,
        capacity: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not 0 < capacity <= args.max_seq_len:
            raise ContextOverflowError(
                f"context size {capacity} is out of range: this model supports 1 to {args.max_seq_len} tokens"
            )
        shape = (args.n_layers, 1, args.n_kv_heads, capacity, args.head_dim)
        # Uninitialised: a position is read only after it is written, and untouched pages
        # cost no memory (zeros would commit the whole context up front: 1 GB for an 8 B
        # model's 4096 positions in float32).
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)
        self._zeros = torch.zeros(capacity, device=device, dtype=dtype)
        self.capacity = capacity
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def past_bias(self) -> torch.Tensor:
        """The attention bias of the positions held (zeros: every one visible to a new token);
        its length tells a decode step its position."""
        return self._zeros[: len(self.tokens)]

    def write(self, ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write the keys and values [n_layers, kv_heads, len(ids), head_dim] of ids at the next
        positions: the one way anything enters the cache."""
        start = len(self.tokens)
        if start + len(ids) > self.capacity:
            raise ContextOverflowError(f"the context of {self.capacity} tokens is full")
        self.keys[:, 0, :, start : start + len(ids)] = keys
        self.values[:, 0, :, start : start + len(ids)] = values
        self.tokens.extend(ids)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on, without copying anything: how a rejected
        draft, a retried reply or a changed prompt is taken back."""
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"cannot truncate a cache of {len(self.tokens)} tokens to {length}")
        del self.tokens[length:]

    def keep_common_prefix(self, ids: Sequence[int], at_most: int | None = None) -> int:
        """Keep the cached positions that start `ids` (at most `at_most` of them), forget the
        rest, and return how many were kept: the tokens a new prompt need not feed again."""
        kept = self.common_prefix(ids)
        if at_most is not None:
            kept = min(kept, at_most)
        self.truncate(kept)
        return kept

    def common_prefix(self, ids: Sequence[int]) -> int:
        """How many cached positions start `ids`."""
        return common_length(self.tokens, ids)

    def room(self) -> int:
        """How many more positions fit."""
        return self.capacity - len(self.tokens)

    def check_room(self, count: int) -> None:
        """Refuse, with one line, `count` more tokens that do not fit."""
        if count > self.room():
            raise ContextOverflowError(
                f"{count} more tokens do not fit: the context holds {self.capacity} and {len(self)} are used"
            )
