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
TILE_ROWS = 16  # rows a tile of Q4_0 or Q4_1 holds (kernels/csrc/kernels.h)
TILED_TYPES = ("Q4_0", "Q4_1")


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
    grouped = _padded(rows, ROW_GROUP).view(-1, ROW_GROUP, size // block_bytes, block_bytes)
    return grouped.transpose(1, 2).reshape(-1, ROW_GROUP * size)


def _padded(rows: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -len(rows) % multiple
    return torch.cat([rows, rows.new_zeros(extra, rows.shape[1])]) if extra else rows


def tile_rows(rows: torch.Tensor, block_type: str) -> torch.Tensor:
    """Q4_0 or Q4_1 blocks [rows, bytes a row] (rows padded with zeros to a multiple of 16)
    as tiles [rows / 16, bytes a row * 16], laid out as kernels/csrc/kernels.h says: per
    group of 32 columns, the 16 rows' levels in 64-byte chunks (byte 4 r + j of chunk k:
    column 8 k + j in the low nibble, 8 k + 4 + j in the high one), their float16 scales,
    and for Q4_1 their float16 minimums."""
    rows = _padded(rows, TILE_ROWS)
    head = 4 if block_type == "Q4_1" else 2  # bytes before the nibbles: d, and m for Q4_1
    blocks = rows.view(len(rows) // TILE_ROWS, TILE_ROWS, -1, head + 16)  # [tile, row, group, byte]
    nibbles = blocks[..., head:]
    levels = torch.cat([nibbles & 15, nibbles >> 4], dim=-1)  # GGUF: byte i holds columns i and i + 16
    slices = levels.view(*levels.shape[:3], 4, 2, 4)  # [tile, row, group, k, half, j]
    packed = (slices[..., 0, :] | (slices[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)  # [tile, group, k, row, j]
    halves = blocks[..., :head].view(*blocks.shape[:3], head // 2, 2).permute(0, 2, 3, 1, 4)  # [tile, group, which, row, 2]
    tiles = torch.cat([packed.flatten(2), halves.flatten(2)], dim=-1)
    return tiles.reshape(len(tiles), -1)


def untile_rows(tiles: torch.Tensor, block_type: str, count: int) -> torch.Tensor:
    """The inverse of tile_rows: the first `count` rows' blocks [count, bytes a row]."""
    head = 4 if block_type == "Q4_1" else 2
    groups = tiles.view(len(tiles), -1, TILE_ROWS * (head + 16))  # [tile, group, 16 rows' bytes]
    packed = groups[..., :256].view(len(tiles), -1, 4, TILE_ROWS, 4).permute(0, 3, 1, 2, 4)  # [tile, row, group, k, j]
    slices = torch.stack([packed & 15, packed >> 4], dim=-2)  # [tile, row, group, k, half, j]
    levels = slices.flatten(3)
    nibbles = levels[..., :16] | (levels[..., 16:] << 4)
    halves = groups[..., 256:].view(len(tiles), -1, head // 2, TILE_ROWS, 2).permute(0, 3, 1, 2, 4).flatten(3)
    blocks = torch.cat([halves, nibbles], dim=-1)
    return blocks.reshape(len(tiles) * TILE_ROWS, -1)[:count]


class BlockLinear(nn.Module):
    """y = x W^T with W held once as GGUF blocks of `block_type`: Q4_0 and Q4_1 in tiles of
    16 rows, other types in groups of 4 rows."""

    def __init__(self, source: StoredMatrix, block_type: str, variant: int, activation_bits: int = 16) -> None:
        super().__init__()
        self.out_features, self.in_features = source.shape
        self.block_type = block_type
        self.type_number = BLOCK_TYPES[block_type]
        self.variant = variant
        self.activation_bits = activation_bits  # of several tokens' activations: 8 or 16
        self.tiled = block_type in TILED_TYPES
        unit = TILE_ROWS if self.tiled else ROW_GROUP  # rows arranged together
        size = row_bytes(block_type, self.in_features)
        self.register_buffer("blocks", torch.empty(-(-self.out_features // unit), unit * size, dtype=torch.uint8))
        alignment = math.lcm(unit, source.row_alignment)
        step = max(alignment, CHUNK_WEIGHTS // self.in_features // alignment * alignment)
        for start in range(0, self.out_features, step):
            stop = min(start + step, self.out_features)
            if source.block_type == block_type:
                rows = source.blocks(start, stop)
            else:
                rows = QUANTISERS[block_type](as_float(source.rows(start, stop)))
            arranged = tile_rows(rows, block_type) if self.tiled else interleave_rows(rows, BLOCK_SIZES[block_type][1])
            self.blocks[start // unit : start // unit + len(arranged)] = arranged

    def file_blocks(self) -> torch.Tensor:
        """The blocks in the file's order, [out_features, bytes a row]."""
        if self.tiled:
            return untile_rows(self.blocks, self.block_type, self.out_features)
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
        if flat.shape[0] > 1:
            bits = self.activation_bits
        else:  # a single token: 16-bit activations on tiles, float32 on other blocks
            bits = 16 if self.tiled else 0
        out = torch.ops.llama_chat.block_linear(flat, self.blocks, self.type_number, self.out_features, self.variant, bits)
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        layout = "tiles of 16 rows" if self.tiled else "groups of 4 rows"
        return f"{self.in_features} -> {self.out_features}, {self.block_type} blocks in {layout}, {self.activation_bits}-bit steps"
