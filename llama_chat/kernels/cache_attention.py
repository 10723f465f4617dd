"""Attention over the KV cache by llama-chat's kernel (csrc/attention_*): a step's new tokens
(one, a verify step's, a prompt chunk's) read the cache where it lies, in its own dtype,
once for all the query heads that share a key/value head, under a float32 streaming
softmax, with no table of scores held (a prompt chunk of 512 tokens after 3000 held
tens of MB of them, several times over, in PyTorch's operations).

PyTorch's attention reads a float16 cache back into float32 first (a copy of the cache
every step), so a half-width cache used to cost time; the kernel reads the half-width
cache as it is, half the bytes of a float32 one. Where the kernel runs, the cache is
therefore float16 unless --kv-dtype says otherwise (fidelity: benchmarks/kv_dtype.py and
docs/chatting.md).
"""

from __future__ import annotations

import torch
from torch import nn

from llama_chat.kernels import native

CACHE_DTYPE = torch.float16  # the cache's dtype where this kernel reads it (auto --kv-dtype)


class CacheAttention(nn.Module):
    """softmax(scale q k^T) v of a step's tokens over the cached positions (under
    past_mask, where one is given) and over themselves (causally): what Attention computes
    over a cache, in one call."""

    def __init__(self, variant: int) -> None:
        super().__init__()
        self.variant = variant

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # Unpickled in another process (the decode step's compiler): it calls the operator.
        native.load_built()

    def forward(
        self,
        q: torch.Tensor,
        new_keys: torch.Tensor,
        new_values: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
        position: int,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        past_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [time, heads, head_dim], new_keys and new_values [time, kv_heads, head_dim],
        past_keys and past_values [kv_heads, capacity, head_dim] whose first `position`
        positions are scored, all visible, or with past_mask [position] or [time, position]
        added to those scores (a windowed layer's ring), the scores scaled by `scale`, the new
        tokens seeing at most the last `window` of themselves, every score capped by
        `softcap`; the attended values [time, heads, head_dim]."""
        out = torch.ops.llama_chat.cache_attention(
            q.float(), new_keys.float(), new_values.float(), past_keys, past_values, position,
            None if past_mask is None else past_mask.float(), scale, window or 0, softcap or 0.0, self.variant,
        )
        return out.to(q.dtype)

    def extra_repr(self) -> str:
        return f"variant {native.variant_names()[self.variant]}"


def use_cache_attention(transformer: nn.Module, variant: int) -> None:
    """Let every layer of `transformer` attend over its cache with the kernel in `variant`."""
    for layer in transformer.layers:
        layer.attention.cache_attention = CacheAttention(variant)
