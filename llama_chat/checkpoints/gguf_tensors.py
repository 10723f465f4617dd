"""A GGUF model's tensors under our names and layout (llama.cpp's format).

Matrices are handed out as GGUFMatrix, read from the file they lie in (one part of a split
model, or the model's one file) a block of rows at a time by
plain reads (a memory map's touched pages would stay counted in the process's resident
memory until the load ends): 4-bit blocks (Q4_0, Q4_1, Q4_K) as their levels, scales and
zeros, every other type dequantised to float32. GGUF lists a tensor's dimensions innermost
first (ggml order), so a PyTorch [out, in] weight is stored with shape [in, out].
llama.cpp's converter reorders q and k projection rows into the interleaved rotary
layout; they are put back into the half-split layout our model uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from llama_chat.checkpoints.contents import Weight
from llama_chat.checkpoints.gguf_blocks import FOUR_BIT_TYPES, KERNEL_BLOCK_TYPES, int4_groups
from llama_chat.checkpoints.gguf_file import TensorInfo
from llama_chat.checkpoints.stored import Rows, StoredMatrix, read_range
from llama_chat.checkpoints.tensor_names import TensorNames, assemble_state_dict, expected_shapes
from llama_chat.engine.config import ModelArgs
from llama_chat.errors import LlamaChatError

# Types gguf.quants can dequantise that make sense for weights.
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    )
)

# Rotary factor tensors: Llama 3.1's per-frequency divisors, and Phi-3's longrope factors,
# one per turning pair: within its original context, and beyond.
ROPE_FREQS = "rope_freqs.weight"
LONGROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")

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


def check_tensor_types(stored: Mapping[str, TensorInfo], source: str) -> None:
    """Refuse, naming the tensor, a file with a tensor stored in a type llama-chat cannot decode."""
    for name, tensor in stored.items():
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise LlamaChatError(
                f"{source}: tensor {name} is stored as {tensor.tensor_type.name}, which llama-chat cannot "
                "load; use a file quantised as F16, BF16, Q8_0, Q4_0/Q4_1/Q5_0/Q5_1 or a K-quant"
            )


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
        return GGUFMatrix(stored[name]) if len(shape) == 2 else read_vector(stored[name])

    return assemble_state_dict(args, names, take, interleaved_rotary=interleaved_rotary)


def read_vector(tensor: TensorInfo) -> torch.Tensor:
    """A 1-D tensor (a norm's gains, rotary factors) as float32."""
    raw = np.frombuffer(read_range(tensor.file, tensor.offset, tensor.n_bytes), dtype=np.uint8)[None]
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

    def __init__(self, tensor: TensorInfo) -> None:
        self.tensor = tensor
        self.shape = tensor.shape
        self.row_bytes = tensor.n_bytes // self.shape[0]
        self.type_name = tensor.tensor_type.name
        self.four_bit = self.type_name in FOUR_BIT_TYPES
        self.float_storage = self.type_name in ("F32", "F16", "BF16")
        self.stored_bytes = int(tensor.n_bytes)
        self.block_type = self.type_name if self.type_name in KERNEL_BLOCK_TYPES else None

    def _raw(self, start: int, stop: int) -> np.ndarray:
        count = stop - start
        data = read_range(self.tensor.file, self.tensor.offset + start * self.row_bytes, count * self.row_bytes)
        return np.frombuffer(data, dtype=np.uint8).reshape(count, self.row_bytes)

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return torch.from_numpy(self._raw(start, stop))

    def rows(self, start: int, stop: int) -> Rows:
        count = stop - start
        raw = self._raw(start, stop)
        if self.four_bit:
            return int4_groups(raw, self.type_name, self.shape[1])
        return torch.from_numpy(_float_rows(raw, self.tensor.tensor_type).reshape(count, self.shape[1]))
