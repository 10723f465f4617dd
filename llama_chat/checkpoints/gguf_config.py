"""A GGUF file's hyper-parameters (llama.*, qwen2.*, ... metadata) as ModelArgs, read as llama.cpp reads them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from llama_chat.checkpoints.gguf_rope import rope_scaling_from_gguf
from llama_chat.checkpoints.values import (
    context_length,
    layer_count,
    positive_number,
    real_number,
    shown,
    whole_number,
)
from llama_chat.engine.config import ARCHITECTURE_SWITCHES, ModelArgs
from llama_chat.errors import LlamaChatError

# Gemma's layers as llama.cpp reads a file that does not list them: of each run of this many
# layers, the last attends globally and the others within the sliding window.
GEMMA_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}
# Gemma 2's caps where its file does not give them (llama.cpp's defaults).
GEMMA2_SOFTCAPS = {"attention_softcap": 50.0, "logit_softcap": 30.0}
# Gemma's 27 B models scale attention scores by the width per head, not the head's
# size; their files do not say so, and llama.cpp knows them by their layer count.
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
# Granite's multipliers: ModelArgs' names -> the keys under the architecture's name.
SCALES = {"embedding_scale": "embedding_scale", "residual_scale": "residual_scale",
          "attention_scale": "attention.scale", "logit_scale": "logit_scale"}


class _ArchitectureEntries:
    """The metadata under the architecture's name: one value per model, a missing one refused
    unless it has a default."""

    def __init__(self, metadata: Mapping[str, Any], prefix: str, source: str) -> None:
        self.metadata, self.prefix, self.source = metadata, prefix, source

    def value(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(f"{self.prefix}.{key}", default)
        if value is None:
            raise LlamaChatError(f"{self.source} has no '{self.prefix}.{key}' entry; the file is incomplete")
        if isinstance(value, list):
            raise LlamaChatError(f"{self.source}: {self.prefix}.{key} varies by layer, which llama-chat does not support")
        return value

    def whole(self, key: str, default: int | None = None) -> int:
        return whole_number(self.value(key, default), f"{self.prefix}.{key}", self.source)

    def real(self, key: str, default: float) -> float:
        return real_number(self.value(key, default), f"{self.prefix}.{key}", self.source)


def args_from_gguf_metadata(
    metadata: Mapping[str, Any],
    *,
    vocab_size: int,
    tie_embeddings: bool,
    rope_factors: Mapping[str, torch.Tensor] | None = None,
    source: str = "model.gguf",
) -> ModelArgs:
    """ModelArgs from the architecture's metadata (llama.*, qwen2.*, ...), its switches on;
    `rope_factors` are the rotary factor tensors the file has (rope_freqs, Phi-3's longrope
    factors), by name."""
    prefix = metadata.get("general.architecture", "llama")
    entries = _ArchitectureEntries(metadata, prefix, source)
    if metadata.get(f"{prefix}.expert_count", 0):
        raise LlamaChatError(f"{source} is a mixture-of-experts model, which llama-chat cannot run")
    dim, n_heads = entries.whole("embedding_length"), entries.whole("attention.head_count")
    head_dim = entries.whole("attention.key_length", dim // n_heads)  # as llama.cpp reads them
    if entries.whole("attention.value_length", head_dim) != head_dim:
        raise LlamaChatError(f"{source}: keys and values of different sizes are not supported")
    args = ModelArgs(
        dim=dim,
        n_layers=layer_count(entries.whole("block_count"), f"{prefix}.block_count", source),
        n_heads=n_heads,
        n_kv_heads=entries.whole("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        rotary_dim=entries.whole("rope.dimension_count", head_dim),
        vocab_size=vocab_size,
        hidden_dim=entries.whole("feed_forward_length"),
        norm_eps=entries.real("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=entries.real("rope.freq_base", 10000.0),
        max_seq_len=context_length(entries.whole("context_length", 2048), f"{prefix}.context_length", source),
        tie_embeddings=tie_embeddings,
        architecture=prefix,
        **ARCHITECTURE_SWITCHES.get(prefix, {}),
        **{name: entries.real(key, 1.0) for name, key in SCALES.items() if f"{prefix}.{key}" in metadata},
    )
    args = replace(args, rope_scaling=rope_scaling_from_gguf(metadata, prefix, args, rope_factors or {}, source))
    return _gemma_args(metadata, prefix, args, source) if prefix in GEMMA_WINDOW_PATTERN else args


def _gemma_args(metadata: Mapping[str, Any], prefix: str, args: ModelArgs, source: str) -> ModelArgs:
    """Gemma 2's and 3's values as llama.cpp reads them: norms stored as 1 + w already (its
    converter adds the 1), embeddings scaled by sqrt(dim), the windowed layers and their
    rotation, the caps."""

    def positive(key: str, default: float | None) -> float | None:
        value = metadata.get(f"{prefix}.{key}", default)
        return None if value is None else positive_number(value, f"{prefix}.{key}", source)

    window_key = f"{prefix}.attention.sliding_window"
    window = metadata.get(window_key, 4096 if prefix == "gemma2" else None)  # Gemma 2's default
    windowed: tuple[bool, ...] = ()
    if window is not None:
        if type(window) is not int or window <= 0:
            raise LlamaChatError(f"{source}: {window_key} is {shown(window)}, where a positive number of positions "
                                 "belongs")
        windowed = _windowed_layers(metadata, prefix, args.n_layers, source)
    caps = GEMMA2_SOFTCAPS if prefix == "gemma2" else {"attention_softcap": None, "logit_softcap": None}
    per_head = args.dim // args.n_heads if args.n_layers == GEMMA_27B_LAYERS[prefix] else args.head_dim
    return replace(
        args, embedding_scale=math.sqrt(args.dim), attention_scale=per_head**-0.5,
        sliding_window=window if windowed else None, windowed_layers=windowed,
        local_rope_theta=positive("rope.freq_base_swa", 10000.0 if prefix == "gemma3" else None),
        attention_softcap=positive("attn_logit_softcapping", caps["attention_softcap"]),
        logit_softcap=positive("final_logit_softcapping", caps["logit_softcap"]),
    )


def _windowed_layers(metadata: Mapping[str, Any], prefix: str, n_layers: int, source: str) -> tuple[bool, ...]:
    """Which layers attend within the window: listed one by one, or every layer but the last
    of each run of a pattern's length."""
    key = f"{prefix}.attention.sliding_window_pattern"
    pattern = metadata.get(key, GEMMA_WINDOW_PATTERN[prefix])
    if isinstance(pattern, list):
        if len(pattern) != n_layers or not all(type(entry) is bool for entry in pattern):
            raise LlamaChatError(f"{source}: {key} lists {len(pattern)} entries for {n_layers} layers; "
                                 "one true or false a layer belongs")
        return tuple(pattern)
    pattern = whole_number(pattern, key, source)
    return tuple(layer % pattern < pattern - 1 for layer in range(n_layers))
