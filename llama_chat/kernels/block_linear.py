"""Weights held as GGUF blocks and multiplied by llama-chat's own kernels (native.py).

A GGUF file's Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K matrices are kept as the file stores
them, byte for byte, so each weight costs what it costs in the file; only the order of
blocks changes: rows in groups of 4, interleaved block by block, so that a single token
reads 4 rows as one sequential stream (1.36x faster from memory than 4 rows read side by
side, measured on a 16384 x 2048 Q4_0 matrix). Float weights are
quantised into blocks the same kernels read: Q8_0 (int8 with a scale per 32 weights), or
Q4_1 with `--quantize int4` or where the checkpoint says it came from 4-bit blocks.

A single token multiplies float32 activations with the decoded blocks (decode keeps
float32 numerics); several tokens (a prompt, a chat turn) quantise the activations in
groups of 32 and use integer dot products: 16-bit activations carried as two int8 halves
by default, or int8 (half the integer work, but measured to change a fifth of the default
model's near-tied choices more than float32 does; see the README).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llama_chat.checkpoints.gguf_blocks import KERNEL_BLOCK_TYPES
from llama_chat.checkpoints.stored import GROUP, StoredMatrix, as_float
from llama_chat.kernels import native

# The GGUF types the kernels read, with their ggml numbers and (weights, bytes) a block.
BLOCK_TYPES = {name: GGMLQuantizationType[name].value for name in KERNEL_BLOCK_TYPES}
BLOCK_SIZES = {name: GGML_QUANT_SIZES[GGMLQuantizationType[name]] for name in KERNEL_BLOCK_TYPES}
CHUNK_WEIGHTS = 1 << 18  # weights converted at a time: bounds a load's temporaries
ROW_GROUP = 4  # rows interleaved block by block (kernels/csrc/kernels.h)


def row_bytes(block_type: str, columns: int) -> int:
    weights, size = BLOCK_SIZES[block_type]
    return columns // weights * size


def _halves(values: torch.Tensor) -> torch.Tensor:
    """float32 [..., n] as float16's bytes [..., n, 2]."""
    return values.to(torch.float16).view(torch.uint8).view(*values.shape, 2)


def q8_0_blocks(weight: torch.Tensor) -> torch.Tensor:
    """float32 [rows, columns] as Q8_0 bytes [rows, columns / 32 * 34]: levels -127..127
    against the group's largest magnitude / 127, rounded to the scale as stored."""
    rows, columns = weight.shape
    groups = weight.view(rows, -1, GROUP)
    scale = (groups.abs().amax(-1) / 127).to(torch.float16).float()
    levels = torch.round(groups / scale.clamp_min(1e-30)[..., None]).clamp_(-127, 127).to(torch.int8)
    return torch.cat([_halves(scale), levels.view(torch.uint8)], dim=-1).view(rows, -1)


def q4_1_blocks(weight: torch.Tensor) -> torch.Tensor:
    """float32 [rows, columns] as Q4_1 bytes: levels 0..15 spanning each group's minimum to
    maximum, against the scale and minimum as stored."""
    rows, columns = weight.shape
    groups = weight.view(rows, -1, GROUP)
    low = groups.amin(-1).to(torch.float16).float()
    scale = ((groups.amax(-1) - low) / 15).to(torch.float16).float()
    levels = torch.round((groups - low[..., None]) / scale.clamp_min(1e-30)[..., None]).clamp_(0, 15).to(torch.uint8)
    packed = levels[..., :16] | (levels[..., 16:] << 4)
    return torch.cat([_halves(scale), _halves(low), packed], dim=-1).view(rows, -1)


QUANTISERS = {"Q8_0": q8_0_blocks, "Q4_1": q4_1_blocks}


def interleave_rows(rows: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """Bytes [rows, bytes a row] (rows padded with zero blocks to a multiple of 4) as
    groups of 4 rows interleaved block by block, [rows / 4, 4 * bytes a row]."""
    count, size = rows.shape
    padded = -(-count // ROW_GROUP) * ROW_GROUP
    if padded != count:
        rows = torch.cat([rows, rows.new_zeros(padded - count, size)])
    grouped = rows.view(padded // ROW_GROUP, ROW_GROUP, size // block_bytes, block_bytes)
    return grouped.transpose(1, 2).reshape(padded // ROW_GROUP, ROW_GROUP * size)


class BlockLinear(nn.Module):
    """y = x W^T with W held once as GGUF blocks of `block_type`."""

    def __init__(self, source: StoredMatrix, block_type: str, variant: int, activation_bits: int = 16) -> None:
        super().__init__()
        self.out_features, self.in_features = source.shape
        self.block_type = block_type
        self.type_number = BLOCK_TYPES[block_type]
        self.variant = variant
        self.activation_bits = activation_bits  # of several tokens' activations: 8 or 16
        size = row_bytes(block_type, self.in_features)
        groups = -(-self.out_features // ROW_GROUP)
        self.register_buffer("blocks", torch.empty(groups, ROW_GROUP * size, dtype=torch.uint8))
        alignment = math.lcm(ROW_GROUP, source.row_alignment)
        step = max(alignment, CHUNK_WEIGHTS // self.in_features // alignment * alignment)
        for start in range(0, self.out_features, step):
            stop = min(start + step, self.out_features)
            if source.block_type == block_type:
                rows = source.blocks(start, stop)
            else:
                rows = QUANTISERS[block_type](as_float(source.rows(start, stop)))
            grouped = interleave_rows(rows, BLOCK_SIZES[block_type][1])
            self.blocks[start // ROW_GROUP : start // ROW_GROUP + len(grouped)] = grouped

    def file_blocks(self) -> torch.Tensor:
        """The blocks in the file's order, [out_features, bytes a row]."""
        groups, width = self.blocks.shape
        size = BLOCK_SIZES[self.block_type][1]
        rows = self.blocks.view(groups, width // (ROW_GROUP * size), ROW_GROUP, size).transpose(1, 2)
        return rows.reshape(groups * ROW_GROUP, width // ROW_GROUP)[: self.out_features]

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # Unpickled in another process (the decode step's compiler): it calls the operator.
        native.load_built()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        bits = 0 if flat.shape[0] == 1 else self.activation_bits  # 0: float32 activations
        out = torch.ops.llama_chat.block_linear(flat, self.blocks, self.type_number, self.out_features, self.variant, bits)
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.block_type} blocks, {self.activation_bits}-bit steps"

