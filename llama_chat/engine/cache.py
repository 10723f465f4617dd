"""The KV cache: every layer's keys and values for one sequence, and the token ids they hold.

The model hands each layer's new keys and values to the cache (`update_and_fetch`) and
attends over what it gives back; the cache alone knows its layout and its position.
"""

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
    the single record of what the cache holds. Trimming only shortens that list: the
    stale entries past it are overwritten by the next write. A model call writes each
    layer's keys and values as it goes (`update_and_fetch`) and moves the position on at
    its end (`advance`), so a call interrupted half-way leaves the cache as it was.
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
        shape = (args.n_layers, args.n_kv_heads, capacity, args.head_dim)
        # Uninitialised: a position is read only after it is written, and untouched pages
        # cost no memory (zeros would commit the whole context up front: 1 GB for an 8 B
        # model's 4096 positions in float32).
        self._keys = torch.empty(shape, device=device, dtype=dtype)
        self._values = torch.empty(shape, device=device, dtype=dtype)
        self._zeros = torch.zeros(capacity, device=device, dtype=dtype)
        self.capacity = capacity
        self._tokens: list[int] = []

    @property
    def tokens(self) -> list[int]:
        """The ids held, in order (a copy)."""
        return list(self._tokens)

    @property
    def position(self) -> int:
        """Where the next token goes: how many are held."""
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def dtype(self) -> torch.dtype:
        return self._keys.dtype

    def position_bytes(self) -> int:
        """Bytes one position takes, keys and values of every layer."""
        return 2 * self._keys[:, :, 0].numel() * self._keys.element_size()

    def past_bias(self) -> torch.Tensor:
        """The attention bias of the positions held (zeros: every one visible to a new token);
        its length tells a model call its position."""
        return self._zeros[: len(self._tokens)]

    def update_and_fetch(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store layer's keys and values [time, kv_heads, head_dim] of the tokens being fed at
        the next positions; return that layer's buffers [kv_heads, capacity, head_dim] and
        the bias of the positions held before them (see past_bias). The new tokens are
        attended in the caller's own precision: the stored copies serve later calls."""
        start = len(self._tokens)
        end = start + keys.shape[0]
        if end > self.capacity:
            raise ContextOverflowError(f"the context of {self.capacity} tokens is full")
        self._keys[layer, :, start:end] = keys.transpose(0, 1)
        self._values[layer, :, start:end] = values.transpose(0, 1)
        return self._keys[layer], self._values[layer], self.past_bias()

    def advance(self, ids: Sequence[int]) -> None:
        """Record ids as held, once every layer has stored theirs."""
        if len(self._tokens) + len(ids) > self.capacity:
            raise ContextOverflowError(f"the context of {self.capacity} tokens is full")
        self._tokens.extend(ids)

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's keys and values [n_layers, kv_heads, capacity, head_dim], read whole
        by a compiled model call (which gives its new ones back for `write`)."""
        return self._keys, self._values

    def write(self, ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the keys and values [n_layers, kv_heads, len(ids), head_dim] of ids at the next
        positions, every layer at once."""
        start = len(self._tokens)
        if start + len(ids) > self.capacity:
            raise ContextOverflowError(f"the context of {self.capacity} tokens is full")
        self._keys[:, :, start : start + len(ids)] = keys
        self._values[:, :, start : start + len(ids)] = values
        self._tokens.extend(ids)

    def state(self, length: int | None = None) -> dict[str, torch.Tensor]:
        """The first `length` positions (all by default) as tensors to save: keys and values
        [n_layers, kv_heads, length, head_dim] and their token ids."""
        length = len(self._tokens) if length is None else length
        return {
            "keys": self._keys[:, :, :length].contiguous(),
            "values": self._values[:, :, :length].contiguous(),
            "tokens": torch.tensor(self._tokens[:length], dtype=torch.int64),
        }

    def state_shape(self, length: int) -> list[int]:
        """The shape of state()'s keys and values for `length` positions."""
        layers, kv_heads, _, head_dim = self._keys.shape
        return [layers, kv_heads, length, head_dim]

    def load_state(self, ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold exactly ids, with their keys and values as state() gives them (rounded to this
        cache's dtype)."""
        self.trim(0)
        self.write(ids, keys, values)

    def trim(self, length: int) -> None:
        """Forget every position from `length` on, without copying anything: how a rejected
        draft, a retried reply or a changed prompt is taken back."""
        if not 0 <= length <= len(self._tokens):
            raise ValueError(f"cannot trim a cache of {len(self._tokens)} tokens to {length}")
        del self._tokens[length:]

    def keep_common_prefix(self, ids: Sequence[int], at_most: int | None = None) -> int:
        """Keep the cached positions that start `ids` (at most `at_most` of them), forget the
        rest, and return how many were kept: the tokens a new prompt need not feed again."""
        kept = self.common_prefix(ids)
        if at_most is not None:
            kept = min(kept, at_most)
        self.trim(kept)
        return kept

    def common_prefix(self, ids: Sequence[int]) -> int:
        """How many cached positions start `ids`."""
        return common_length(self._tokens, ids)

    def room(self) -> int:
        """How many more positions fit."""
        return self.capacity - len(self._tokens)

    def check_room(self, count: int) -> None:
        """Refuse, with one line, `count` more tokens that do not fit."""
        if count > self.room():
            raise ContextOverflowError(
                f"{count} more tokens do not fit: the context holds {self.capacity} and {len(self)} are used"
            )
