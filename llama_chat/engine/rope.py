"""Rotary position embeddings: each pair of features turned by an angle that grows with the position."""

from __future__ import annotations

import math

import torch

from llama_chat.engine.config import ModelArgs


def rope_inverse_frequencies(args: ModelArgs) -> torch.Tensor:
    """The rotation speed of each pair of features, after any rope scaling (float64)."""
    # On the cpu even while a model is laid out on the meta device (loading does that).
    exponents = torch.arange(0, args.head_dim, 2, dtype=torch.float64, device="cpu") / args.head_dim
    inv_freq = 1.0 / (args.rope_theta**exponents)
    scaling = args.rope_scaling
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        old_context = scaling.original_max_position_embeddings
        low_freq_wavelen = old_context / scaling.low_freq_factor
        high_freq_wavelen = old_context / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # Between the two wavelengths, blend the scaled and unscaled frequency.
        smooth = (old_context / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, blended)
        return torch.where(wavelen < high_freq_wavelen, inv_freq, scaled)
    return inv_freq


def rope_tables(args: ModelArgs, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of every position's angles, [length, 1, head_dim], half-split layout.

    The middle axis broadcasts over heads. The sin table's first half is negated, so that
    rotating is x*cos + swap_halves(x)*sin: (x1, x2) becomes (x1*cos - x2*sin, x2*cos + x1*sin).
    """
    positions = torch.arange(length, dtype=torch.float64, device="cpu")
    angles = torch.outer(positions, rope_inverse_frequencies(args))
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1).float()[:, None], torch.cat([-sin, sin], dim=-1).float()[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [batch, time, heads, head_dim] by the angles of cos/signed_sin [time, 1, head_dim]."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, signed_sin)
