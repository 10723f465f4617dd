"""Rotary position embeddings: each pair of features turned by an angle that grows with the position."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from llama_chat.engine.config import ModelArgs, RopeScaling


def rope_inverse_frequencies(args: ModelArgs, *, long_context: bool = False) -> torch.Tensor:
    """The rotation speed of each pair of features, after any rope scaling (float64); pairs
    past the rotary width (see head_feature_order) do not turn. `long_context` picks
    longrope's long factors."""
    # On the cpu even while a model is laid out on the meta device (loading does that).
    turning = args.rotary_dim
    exponents = torch.arange(0, turning, 2, dtype=torch.float64, device="cpu") / turning
    inv_freq = _scaled(args, 1.0 / (args.rope_theta**exponents), long_context)
    return torch.cat([inv_freq, inv_freq.new_zeros((args.head_dim - turning) // 2)])


def _scaled(args: ModelArgs, inv_freq: torch.Tensor, long_context: bool) -> torch.Tensor:
    scaling = args.rope_scaling
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "longrope":
        factors = scaling.long_factors if long_context else scaling.short_factors
        return inv_freq / torch.tensor(factors, dtype=torch.float64, device="cpu")
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


def head_feature_order(head_dim: int, rotary_dim: int, *, interleaved: bool) -> list[int]:
    """For each feature of a q or k head in our layout, the one a checkpoint stores there.

    Our layout turns the pairs (i, i + head_dim/2) and nothing else, so every head runs one
    rotation. A checkpoint pairs its first `rotary_dim` features either as (2i, 2i+1)
    (`interleaved`: llama.cpp's layout for Llama) or as (i, i + rotary_dim/2) (Hugging
    Face's), and keeps the rest unturned. Our layout takes its turning pairs' components
    to the front of each half and its unturned features behind them; as q and k are
    reordered alike, their products, and so attention, are unchanged.
    """
    half, turning_pairs = head_dim // 2, rotary_dim // 2
    fixed = head_dim - rotary_dim

    def turning(pair: int, component: int) -> int:
        return 2 * pair + component if interleaved else component * turning_pairs + pair

    order = []
    for component in (0, 1):
        order += [turning(pair, component) for pair in range(turning_pairs)]
        order += [rotary_dim + component * fixed // 2 + i for i in range(half - turning_pairs)]
    return order


def rope_tables(args: ModelArgs, length: int, *, long_context: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of every position's angles, [length, 1, head_dim], half-split layout
    (`long_context` picks longrope's long factors).

    The middle axis broadcasts over heads. The sin table's first half is negated, so that
    rotating is x*cos + swap_halves(x)*sin: (x1, x2) becomes (x1*cos - x2*sin, x2*cos + x1*sin).
    """
    positions = torch.arange(length, dtype=torch.float64, device="cpu")
    angles = torch.outer(positions, rope_inverse_frequencies(args, long_context=long_context))
    cos, sin = angles.cos(), angles.sin()
    if args.rope_scaling.kind == "longrope":
        # Only the turning pairs: an unturned feature keeps cos 1 and sin 0.
        turning = args.rotary_dim // 2
        cos[:, :turning] *= args.rope_scaling.attention_factor
        sin[:, :turning] *= args.rope_scaling.attention_factor
    return torch.cat([cos, cos], dim=-1).float()[:, None], torch.cat([-sin, sin], dim=-1).float()[:, None]


def windowed_rotation(args: ModelArgs) -> ModelArgs | None:
    """The arguments windowed layers turn by where they have a rotation of their own (Gemma 3's
    local base, never scaled), else None: every layer turns alike."""
    if args.local_rope_theta is None or not any(args.windowed_layers):
        return None
    return replace(args, rope_theta=args.local_rope_theta, rope_scaling=RopeScaling())


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [batch, time, heads, head_dim] by the angles of cos/signed_sin [time, 1, head_dim]."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, signed_sin)
