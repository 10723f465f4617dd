"""A GGUF file's rotary scaling, from its metadata and its rotary factor tensors, as llama.cpp reads it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from llama_chat.checkpoints.gguf_tensors import LONGROPE_FACTORS, ROPE_FREQS
from llama_chat.checkpoints.values import real_number, whole_number
from llama_chat.untrusted_files import shown
from llama_chat.engine.config import ModelArgs, RopeScaling
from llama_chat.engine.rope import rope_inverse_frequencies
from llama_chat.errors import LlamaChatError


def rope_scaling_from_gguf(
    metadata: Mapping[str, Any], prefix: str, args: ModelArgs, rope_factors: Mapping[str, torch.Tensor], source: str
) -> RopeScaling:
    """The scaling the metadata under `prefix` names (linear), or the factor tensors give
    (llama3 from rope_freqs, Phi-3's longrope)."""
    kind = metadata.get(f"{prefix}.rope.scaling.type", "none")
    factor_key = f"{prefix}.rope.scaling.factor"
    if kind == "none" and metadata.get(f"{prefix}.rope.scale_linear"):  # older files
        kind, factor_key = "linear", f"{prefix}.rope.scale_linear"
    if rope_factors:
        if kind not in ("none", "longrope"):
            raise LlamaChatError(f"{source} combines {kind} rope scaling with rotary factor tensors, "
                                 "which is not supported")
        original_key = f"{prefix}.rope.scaling.original_context_length"
        original = whole_number(metadata.get(original_key, 8192), original_key, source)
        if ROPE_FREQS in rope_factors:
            if len(rope_factors) > 1:
                raise LlamaChatError(
                    f"{source} has both rope_freqs and longrope factors; it is not a model llama-chat knows"
                )
            return llama3_scaling_from_factors(rope_factors[ROPE_FREQS], args, original, source)
        return _longrope_scaling(metadata, prefix, args, rope_factors, original, source)
    factor = metadata.get(factor_key)
    if kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=real_number(factor, factor_key, source))
    raise LlamaChatError(f"{source} uses {shown(kind)} rope scaling; llama-chat supports linear and llama3")


def _longrope_scaling(
    metadata: Mapping[str, Any], prefix: str, args: ModelArgs, rope_factors: Mapping[str, torch.Tensor],
    original: int, source: str,
) -> RopeScaling:
    """Phi-3's longrope, from its two factor tensors and the attention factor llama.cpp's
    converter writes (1 where it is missing, as llama.cpp reads it)."""
    factors = []
    for name in LONGROPE_FACTORS:
        if name not in rope_factors:
            raise LlamaChatError(f"{source} has {' and '.join(rope_factors)} without {name}; the file is incomplete")
        values = rope_factors[name].flatten()
        if values.numel() != args.rotary_dim // 2:
            raise LlamaChatError(f"{source}: {name} has {values.numel()} entries, expected {args.rotary_dim // 2}")
        if not (torch.isfinite(values) & (values > 0)).all():
            raise LlamaChatError(f"{source}: {name} holds values that are not positive numbers")
        factors.append(tuple(values.tolist()))
    attention_key = f"{prefix}.rope.scaling.attn_factor"
    return RopeScaling(
        kind="longrope", short_factors=factors[0], long_factors=factors[1], original_max_position_embeddings=original,
        attention_factor=real_number(metadata.get(attention_key, 1.0), attention_key, source),
    )


def llama3_scaling_from_factors(
    rope_factors: torch.Tensor, args: ModelArgs, original_context: int, source: str = "model.gguf"
) -> RopeScaling:
    """The llama3 rope scaling whose per-frequency divisors are `rope_factors`.

    llama.cpp stores Llama 3.1 scaling as the divisor of each rotary frequency: 1 for
    high frequencies, `factor` for low ones, and a blend between. On the blend, the
    weight of the unscaled frequency is linear in the frequency, which gives the low and
    high frequency factors back. The result is checked against the stored divisors.
    """
    factors = rope_factors.double().flatten()
    turning = args.rotary_dim // 2
    if factors.numel() != turning:
        raise LlamaChatError(f"{source}: rope_freqs has {factors.numel()} entries, expected {turning}")
    if not (torch.isfinite(factors) & (factors > 0)).all():
        raise LlamaChatError(f"{source}: rope_freqs holds values that are not positive numbers")
    factor = float(factors.max())
    low, high = 1.0, 4.0  # Llama 3.1's values, used when too few frequencies are blended to tell
    inv_freq = rope_inverse_frequencies(args)[:turning]
    blended = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6))
    if factor > 1 and int(blended.sum()) >= 2:
        # 1/divisor = (1 - s)/factor + s, with s = (original/wavelength - low) / (high - low).
        weight = (1 / factors[blended] - 1 / factor) / (1 - 1 / factor)
        position = original_context * inv_freq[blended] / (2 * math.pi)
        slope, intercept = np.polyfit(position.numpy(), weight.numpy(), 1)
        if slope == 0:
            raise LlamaChatError(f"{source}: its rope_freqs are not a llama3 rope scaling llama-chat can reproduce")
        low = -intercept / slope
        high = low + 1 / slope
    scaling = RopeScaling(
        kind="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
        original_max_position_embeddings=original_context,
    )
    expected = inv_freq / factors
    derived = rope_inverse_frequencies(replace(args, rope_scaling=scaling))[:turning]
    if not torch.allclose(derived, expected, rtol=1e-4, atol=0):
        raise LlamaChatError(f"{source}: its rope_freqs are not a llama3 rope scaling llama-chat can reproduce")
    return scaling
