"""The kernels' weight layout (kernels/csrc/kernels.h) built with PyTorch tensor
operations: the independent reference the library's arrange_blocks operator is checked
against byte for byte, and the way the tests lay out blocks without it."""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llama_chat.checkpoints.gguf_blocks import KERNEL_BLOCK_TYPES

# The layout as kernels.h documents it, written out here so that the library is checked
# against it rather than against what it reports of itself.
TILE_ROWS = 16
FIFTH_BIT_TYPES = ("Q5_0", "Q5_1", "Q5_K")  # 5-bit levels: 4 bits as Q4_0's, the fifth beside them
TILE_HALVES = {"Q4_0": (1, 0), "Q4_1": (2, 0), "Q5_0": (1, 0), "Q5_1": (2, 0), "Q8_0": (1, 0), "Q4_K": (2, 0),
               "Q5_K": (2, 0), "Q6_K": (1, 208)}  # float16 fields: count, where
BLOCK_SIZES = {name: GGML_QUANT_SIZES[GGMLQuantizationType[name]] for name in KERNEL_BLOCK_TYPES}  # (weights, bytes)
CRUMB_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]  # Q6_K's 2-bit high parts in a byte
BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)  # a byte's bits, one a place


def padded(rows: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -len(rows) % multiple
    return torch.cat([rows, rows.new_zeros(extra, rows.shape[1])]) if extra else rows


def k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 bytes of 6-bit scales and minimums [..., 12] as two [..., 8]."""
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat([low & 63, (rest & 15) | ((low >> 6) << 4)], dim=-1)
    minimums = torch.cat([high & 63, (rest >> 4) | ((high >> 6) << 4)], dim=-1)
    return scales, minimums


def block_parts(blocks: torch.Tensor, block_type: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Blocks [rows, units, bytes a block] as levels [rows, groups of 32, 32] (Q8_0's plus 128,
    as the tiles store them), float16 fields' bytes [rows, units, fields, 2] and (K types)
    byte factors [rows, units, 16]."""
    rows, units, _ = blocks.shape
    fields, at = TILE_HALVES[block_type]
    halves = blocks[..., at : at + 2 * fields].reshape(rows, units, fields, 2)
    factors = None
    if block_type in ("Q4_K", "Q5_K"):
        factors = torch.cat(k_scales(blocks[..., 4:16]), dim=-1)
        start = 48 if block_type == "Q5_K" else 16  # Q5_K's 32 bytes of fifth bits come first
        runs = blocks[..., start:].reshape(rows, units, 4, 1, 32)  # 4 runs of 32 bytes: 64 weights each
        levels = torch.cat([runs & 15, runs >> 4], dim=3)  # low nibbles: the run's first 32
        if block_type == "Q5_K":  # bit 2 run of byte l: column 64 run + l's fifth; bit 2 run + 1: column 64 run + 32 + l's
            qh = blocks[..., 16:48].reshape(rows, units, 1, 1, 32)
            shifts = torch.arange(8, dtype=torch.uint8).view(4, 2, 1)
            levels = levels | (((qh >> shifts) & 1) << 4)
    elif block_type == "Q6_K":
        factors = blocks[..., 192:208]
        low = blocks[..., :128].reshape(rows, units, 2, 2, 32)  # [half block, first or second 32, l]
        high = blocks[..., 128:192].reshape(rows, units, 2, 1, 32)
        nibbles = torch.cat([low & 15, low >> 4], dim=3)  # quarters 0..3 of each half block
        levels = nibbles | (((high >> CRUMB_SHIFTS) & 3) << 4)
    elif block_type == "Q8_0":
        levels = (blocks[..., 2:].view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
    elif block_type in ("Q5_0", "Q5_1"):
        qh = blocks[..., 2 * fields : 2 * fields + 4]  # bit i of byte b: column 8 b + i's fifth bit
        fifth = ((qh[..., None] >> BIT_SHIFTS) & 1).reshape(rows, units, 32)
        nibbles = blocks[..., 2 * fields + 4 :]
        levels = torch.cat([nibbles & 15, nibbles >> 4], dim=-1) | (fifth << 4)  # byte i: columns i and i + 16
    else:
        nibbles = blocks[..., 2 * fields :]
        levels = torch.cat([nibbles & 15, nibbles >> 4], dim=-1)  # byte i: columns i and i + 16
    return levels.reshape(rows, -1, 32), halves, factors


def tile_rows(rows: torch.Tensor, block_type: str) -> torch.Tensor:
    """Blocks [rows, bytes a row] (rows padded with zeros to a multiple of 16) as tiles
    [rows / 16, arranged_bytes], laid out as kernels/csrc/kernels.h says: per unit the K
    types' byte factors, then per group its levels and their high bits, then the float16
    fields."""
    rows = padded(rows, TILE_ROWS)
    tiles = len(rows) // TILE_ROWS
    levels, halves, factors = block_parts(rows.view(len(rows), -1, BLOCK_SIZES[block_type][1]), block_type)
    groups, units = levels.shape[1], halves.shape[1]
    per_unit = groups // units
    if block_type == "Q8_0":  # a byte a level: [tile, row, group, v, j] -> bytes [tile, group, v, row, j]
        vectors = levels.view(tiles, TILE_ROWS, groups, 8, 4)
        group_parts = [vectors.permute(0, 2, 3, 1, 4).reshape(tiles, groups, -1)]
    else:
        # levels: [tile, row, group, k, half, j] -> bytes [tile, group, k, row, j]
        slices = levels.view(tiles, TILE_ROWS, groups, 4, 2, 4)
        low = slices & 15
        group_parts = [(low[..., 0, :] | (low[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(tiles, groups, -1)]
        if block_type == "Q6_K":  # the high 2 bits: level vector v = 2 k + half in bits 2 (v % 4) of chunk v // 4
            crumbs = (slices >> 4).reshape(tiles, TILE_ROWS, groups, 2, 4, 4)  # [.., chunk, v % 4, j]
            bits = (crumbs << CRUMB_SHIFTS).sum(dim=4, dtype=torch.uint8)  # disjoint bits: the sum is their or
            group_parts.append(bits.permute(0, 2, 3, 1, 4).reshape(tiles, groups, -1))
        if block_type in FIFTH_BIT_TYPES:  # the fifth bits: bit v of byte 4 r + j is level vector v's, column 4 v + j
            fifth = (slices >> 4).reshape(tiles, TILE_ROWS, groups, 8, 4)  # [.., v, j]
            bits = (fifth << BIT_SHIFTS[:, None]).sum(dim=3, dtype=torch.uint8)  # disjoint bits: the sum is their or
            group_parts.append(bits.permute(0, 2, 1, 3).reshape(tiles, groups, -1))
    parts = []
    if factors is not None:
        parts.append(factors.reshape(tiles, TILE_ROWS, units, -1).permute(0, 2, 3, 1).reshape(tiles, units, -1))
    parts.append(torch.cat(group_parts, dim=-1).reshape(tiles, units, per_unit, -1).reshape(tiles, units, -1))
    parts.append(halves.view(tiles, TILE_ROWS, units, -1, 2).permute(0, 2, 3, 1, 4).reshape(tiles, units, -1))
    return torch.cat(parts, dim=-1).reshape(tiles, -1)
