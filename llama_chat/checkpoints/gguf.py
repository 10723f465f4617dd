"""GGUF checkpoints (llama.cpp's single-file format): hyper-parameters, tokenizer, weights.

Matrices are handed out as GGUFMatrix, read from the file a block of rows at a time by
plain reads (a memory map's touched pages would stay counted in the process's resident
memory until the load ends): 4-bit blocks (Q4_0, Q4_1, Q4_K) as their levels, scales and
zeros, every other type dequantised to float32. The header is read by gguf_file. GGUF
lists a tensor's dimensions innermost first (ggml order), so a PyTorch [out, in] weight
is stored with shape [in, out]. llama.cpp's converter
reorders q and k projection rows into the interleaved rotary layout; they are put
back into the half-split layout our model uses.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from llama_chat.checkpoints import sampling_defaults
from llama_chat.checkpoints.contents import Checkpoint, Weight
from llama_chat.checkpoints.gguf_blocks import FOUR_BIT_TYPES, KERNEL_BLOCK_TYPES, int4_groups
from llama_chat.checkpoints.gguf_file import MAGIC as GGUF_MAGIC
from llama_chat.checkpoints.gguf_file import TensorInfo, read_gguf_header
from llama_chat.checkpoints.stored import Rows, StoredMatrix, read_range
from llama_chat.checkpoints.tensor_names import TensorNames, assemble_state_dict, expected_shapes
from llama_chat.checkpoints.values import (
    context_length,
    layer_count,
    of_type,
    positive_number,
    real_number,
    shown,
    whole_number,
)
from llama_chat.engine.config import ARCHITECTURE_SWITCHES, ModelArgs, RopeScaling
from llama_chat.engine.rope import rope_inverse_frequencies
from llama_chat.errors import LlamaChatError, first_line
from llama_chat.text.gguf_tokenizer import tokenizer_from_gguf_metadata

# Types gguf.quants can dequantise that make sense for weights.
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    )
)

ROPE_FREQS = "rope_freqs.weight"
# The architectures llama-chat reads from GGUF (Mistral's files say llama); their
# hyper-parameters sit under the architecture's name (qwen2.block_count, ...).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "granite", "phi3", "gemma2", "gemma3")
# Those whose q/k rows llama.cpp's converter keeps as the checkpoint has them (rotating
# halves); it stores the others' in the interleaved rotary layout.
HALF_ROTARY = frozenset({"qwen2", "qwen3", "phi3", "gemma2", "gemma3"})
# Gemma's layers as llama.cpp reads a file that does not list them: of each run of this many
# layers, the last attends globally and the others within the sliding window.
GEMMA_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}
# Gemma 2's caps where its file does not give them (llama.cpp's defaults).
GEMMA2_SOFTCAPS = {"attention_softcap": 50.0, "logit_softcap": 30.0}
# Gemma's 27 B models scale attention scores by the width per head, not the head's
# size; their files do not say so, and llama.cpp knows them by their layer count.
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
# Phi-3's longrope factors, one per turning pair: within its original context, and beyond.
LONGROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")
# Granite's multipliers: ModelArgs' names -> the keys under the architecture's name.
SCALES = {"embedding_scale": "embedding_scale", "residual_scale": "residual_scale",
          "attention_scale": "attention.scale", "logit_scale": "logit_scale"}

GGUF_NAMES = TensorNames(
    embeddings="token_embd.weight",
    norm="output_norm.weight",
    output="output.weight",
    q="blk.{i}.attn_q.weight",
    k="blk.{i}.attn_k.weight",
    v="blk.{i}.attn_v.weight",
    o="blk.{i}.attn_output.weight",
    gate="blk.{i}.ffn_gate.weight",
    up="blk.{i}.ffn_up.weight",
    down="blk.{i}.ffn_down.weight",
    attention_norm="blk.{i}.attn_norm.weight",
    ffn_norm="blk.{i}.ffn_norm.weight",
    q_bias="blk.{i}.attn_q.bias",
    k_bias="blk.{i}.attn_k.bias",
    v_bias="blk.{i}.attn_v.bias",
    q_norm="blk.{i}.attn_q_norm.weight",
    k_norm="blk.{i}.attn_k_norm.weight",
    post_attention_norm="blk.{i}.post_attention_norm.weight",
    post_ffn_norm="blk.{i}.post_ffw_norm.weight",
)
# Phi-3's files keep q, k and v in one tensor, and gate and up in one (under ffn_up's name).
FUSED_GGUF_NAMES = replace(GGUF_NAMES, qkv="blk.{i}.attn_qkv.weight", gate_up="blk.{i}.ffn_up.weight")


def load_gguf(path: str | Path) -> Checkpoint:
    """Read a GGUF file's metadata and tokenizer (an architecture of ARCHITECTURES); its
    weights are read when the loader asks for them."""
    source = str(path)
    metadata, stored = _read(Path(path))
    _check_metadata_types(metadata, source)
    architecture = metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise LlamaChatError(f"{source} is a {shown(architecture)} model; llama-chat runs "
                             f"{', '.join(ARCHITECTURES)} models")
    _check_types(stored, source)
    try:
        tokenizer = tokenizer_from_gguf_metadata(metadata, source)
    except LlamaChatError:
        raise
    except Exception as error:  # noqa: BLE001 (tokenizers refuses a vocabulary with plain Exceptions)
        raise LlamaChatError(f"{source}: its tokenizer metadata makes no tokenizer ({first_line(error)})") from None
    tokens = metadata["tokenizer.ggml.tokens"]
    factors = {name: _vector(stored[name], source).double()
               for name in (ROPE_FREQS, *LONGROPE_FACTORS) if name in stored}
    args = args_from_gguf_metadata(
        metadata,
        vocab_size=len(tokens),
        tie_embeddings="output.weight" not in stored,
        rope_factors=factors,
        source=source,
    )
    tensors = convert_gguf_tensors(stored, args, source, interleaved_rotary=architecture not in HALF_ROTARY)
    return Checkpoint(
        args=args,
        tensors=tensors,
        tokenizer=tokenizer,
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token=tokens[tokenizer.bos_id] if tokenizer.bos_id is not None else None,
        eos_token=tokens[tokenizer.eos_id] if tokenizer.eos_id is not None else None,
        source_quantization=_layer_weight_type(stored),
        sampling=sampling_defaults.from_gguf(metadata),
    )


def _layer_weight_type(stored: Mapping[str, TensorInfo]) -> str:
    """The type most of the blocks' matrices are stored as."""
    types = Counter(t.tensor_type.name for name, t in stored.items() if name.startswith("blk.") and len(t.shape) == 2)
    return types.most_common(1)[0][0] if types else "F32"


def _read(path: Path) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The file's metadata as Python values, and where its tensors lie."""
    if not path.is_file():
        raise LlamaChatError(f"{path}: no such file")
    with path.open("rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise LlamaChatError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return read_gguf_header(path)


# The types of the metadata llama-chat reads, other than the hyper-parameters (checked
# where they are read). A GGUF array holds one element type, so its first element tells.
_METADATA_TYPES: dict[str, tuple[type, type | None]] = {
    "general.architecture": (str, None),
    "tokenizer.chat_template": (str, None),
    **{f"{architecture}.rope.scaling.type": (str, None) for architecture in ARCHITECTURES},
    "tokenizer.ggml.model": (str, None),
    "tokenizer.ggml.pre": (str, None),
    "tokenizer.ggml.tokens": (list, str),
    "tokenizer.ggml.merges": (list, str),
    "tokenizer.ggml.token_type": (list, int),
    "tokenizer.ggml.scores": (list, float),
    "tokenizer.ggml.add_bos_token": (bool, None),
    "tokenizer.ggml.add_space_prefix": (bool, None),
    **{f"tokenizer.ggml.{role}_token_id": (int, None) for role in ("bos", "eos", "unknown", "eot", "eom")},
}


def _check_metadata_types(metadata: Mapping[str, Any], source: str) -> None:
    """Refuse, naming the key, metadata llama-chat reads that holds a value of another type."""
    for key, (kind, element_kind) in _METADATA_TYPES.items():
        value = metadata.get(key)
        if value is None:
            continue
        of_type(value, kind, key, source)
        if element_kind is not None and value:
            of_type(value[0], element_kind, f"{key}[0]", source)


def _check_types(stored: Mapping[str, TensorInfo], source: str) -> None:
    for name, tensor in stored.items():
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise LlamaChatError(
                f"{source}: tensor {name} is stored as {tensor.tensor_type.name}, which llama-chat cannot "
                "load; use a file quantised as F16, BF16, Q8_0, Q4_0/Q4_1/Q5_0/Q5_1 or a K-quant"
            )


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

    def read(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{prefix}.{key}", default)
        if value is None:
            raise LlamaChatError(f"{source} has no '{prefix}.{key}' entry; the file is incomplete")
        if isinstance(value, list):
            raise LlamaChatError(f"{source}: {prefix}.{key} varies by layer, which llama-chat does not support")
        return value

    def whole(key: str, default: int | None = None) -> int:
        return whole_number(read(key, default), f"{prefix}.{key}", source)

    def real(key: str, default: float) -> float:
        return real_number(read(key, default), f"{prefix}.{key}", source)

    if metadata.get(f"{prefix}.expert_count", 0):
        raise LlamaChatError(f"{source} is a mixture-of-experts model, which llama-chat cannot run")
    dim, n_heads = whole("embedding_length"), whole("attention.head_count")
    head_dim = whole("attention.key_length", dim // n_heads)  # as llama.cpp reads them
    if whole("attention.value_length", head_dim) != head_dim:
        raise LlamaChatError(f"{source}: keys and values of different sizes are not supported")
    args = ModelArgs(
        dim=dim,
        n_layers=layer_count(whole("block_count"), f"{prefix}.block_count", source),
        n_heads=n_heads,
        n_kv_heads=whole("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        rotary_dim=whole("rope.dimension_count", head_dim),
        vocab_size=vocab_size,
        hidden_dim=whole("feed_forward_length"),
        norm_eps=real("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=real("rope.freq_base", 10000.0),
        max_seq_len=context_length(whole("context_length", 2048), f"{prefix}.context_length", source),
        tie_embeddings=tie_embeddings,
        architecture=prefix,
        **ARCHITECTURE_SWITCHES.get(prefix, {}),
        **{name: real(key, 1.0) for name, key in SCALES.items() if f"{prefix}.{key}" in metadata},
    )
    args = replace(args, rope_scaling=_rope_scaling(metadata, prefix, args, rope_factors or {}, source))
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


def _rope_scaling(
    metadata: Mapping[str, Any], prefix: str, args: ModelArgs, rope_factors: Mapping[str, torch.Tensor], source: str
) -> RopeScaling:
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


def convert_gguf_tensors(
    stored: Mapping[str, TensorInfo], args: ModelArgs, source: str = "model.gguf", *, interleaved_rotary: bool = True
) -> dict[str, Weight]:
    """GGUF tensors under our names and layout: vectors read now, matrices when asked for."""
    names = FUSED_GGUF_NAMES if FUSED_GGUF_NAMES.qkv.format(i=0) in stored else GGUF_NAMES
    shapes = expected_shapes(args, names)
    unknown = sorted(set(stored) - set(shapes) - {ROPE_FREQS, *LONGROPE_FACTORS})
    if unknown:
        raise LlamaChatError(f"{source} has tensor {unknown[0]}, which a plain Llama model does not use")

    def take(name: str) -> Weight:
        if name not in stored:
            raise LlamaChatError(f"{source} is missing tensor {name}; the file is incomplete")
        shape = stored[name].shape
        if shape != shapes[name]:
            raise LlamaChatError(f"{source}: tensor {name} has shape {list(shape)}, expected {list(shapes[name])}")
        return GGUFMatrix(stored[name], source) if len(shape) == 2 else _vector(stored[name], source)

    return assemble_state_dict(args, names, take, interleaved_rotary=interleaved_rotary)


def _vector(tensor: TensorInfo, path: str) -> torch.Tensor:
    """A 1-D tensor (a norm's gains, rotary factors) as float32."""
    raw = np.frombuffer(read_range(path, tensor.offset, tensor.n_bytes), dtype=np.uint8)[None]
    return torch.from_numpy(_float_rows(raw, tensor.tensor_type).reshape(-1))


def _float_rows(raw: np.ndarray, tensor_type: GGMLQuantizationType) -> np.ndarray:
    """Raw bytes [rows, bytes per row] of any supported type as float32 [rows, columns]."""
    if tensor_type == GGMLQuantizationType.F32:
        return raw.view(np.float32).copy()  # writable: torch.from_numpy would warn otherwise
    if tensor_type == GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32)
    return dequantize(raw, tensor_type)


class GGUFMatrix(StoredMatrix):
    """A matrix of a GGUF file, read and decoded a block of rows at a time."""

    def __init__(self, tensor: TensorInfo, path: str) -> None:
        self.tensor = tensor
        self.path = path
        self.shape = tensor.shape
        self.row_bytes = tensor.n_bytes // self.shape[0]
        self.type_name = tensor.tensor_type.name
        self.four_bit = self.type_name in FOUR_BIT_TYPES
        self.float_storage = self.type_name in ("F32", "F16", "BF16")
        self.stored_bytes = int(tensor.n_bytes)
        self.block_type = self.type_name if self.type_name in KERNEL_BLOCK_TYPES else None

    def _raw(self, start: int, stop: int) -> np.ndarray:
        count = stop - start
        data = read_range(self.path, self.tensor.offset + start * self.row_bytes, count * self.row_bytes)
        return np.frombuffer(data, dtype=np.uint8).reshape(count, self.row_bytes)

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return torch.from_numpy(self._raw(start, stop))

    def rows(self, start: int, stop: int) -> Rows:
        count = stop - start
        raw = self._raw(start, stop)
        if self.four_bit:
            return int4_groups(raw, self.type_name, self.shape[1])
        return torch.from_numpy(_float_rows(raw, self.tensor.tensor_type).reshape(count, self.shape[1]))
