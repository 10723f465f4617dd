"""Weights held as GGUF blocks and multiplied by llama-chat's own kernels (native.py).

A GGUF file's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K matrices keep the file's
blocks and (but for the K types' 6-bit scales, held a byte each: Q4_K's 148 bytes a block
against 144) its size, rearranged into tiles of 16 rows whose levels (4-bit, or the low 4
bits of Q5's and Q6_K's with the fifth bit or top 2 beside them; Q8_0's bytes plus 128)
feed integer dot products directly (kernels.h has the layout): a single token and several
tokens both run integer kernels, with activations quantised per group of 32 to 16 bits
carried as two int8 halves (within 1/65000 of each group's largest value; a step's
activations can go to int8 instead, half the integer work, but measured to change 4% of the
default model's teacher-forced choices; see docs/kernels.md).
Float weights are quantised into blocks the same kernels read: Q8_0 (int8 with a scale per
32 weights), or Q4_1 with `--quantize int4` or where the checkpoint says it came from 4-bit
blocks. The sizes of tiles and their units are the library's own, read from it
(library_layout.py), never copied here.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from llama_chat.checkpoints.gguf_blocks import KERNEL_BLOCK_TYPES
from llama_chat.checkpoints.stored import GROUP, StackedRows, StoredMatrix, as_float
from llama_chat.engine.compiled import VERIFY_TOKENS
from llama_chat.kernels import native
from llama_chat.kernels.library_layout import TypeLayout, library_layout

# The GGUF types the kernels read, by their ggml numbers (how the library names them).
BLOCK_TYPES = {name: GGMLQuantizationType[name].value for name in KERNEL_BLOCK_TYPES}
CHUNK_WEIGHTS = 1 << 21  # weights converted at a time: bounds a load's temporaries (1 << 18 packed the
# 1.2 B Q4_0 file in 4.1-4.3 s, 1 << 21 in 2.9-3.2 s, 30 MB more at its peak)


def type_layout(block_type: str) -> TypeLayout:
    """How the loaded library holds `block_type` (its block's and unit's sizes)."""
    return library_layout().types[BLOCK_TYPES[block_type]]


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


def _k_scales_packed(scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """Q4_K's 8 scales and 8 minimums [..., 8] (6 bits each) packed into its 12 bytes."""
    return torch.cat([
        scales[..., :4] | ((scales[..., 4:] >> 4) << 6),
        minimums[..., :4] | ((minimums[..., 4:] >> 4) << 6),
        (scales[..., 4:] & 15) | ((minimums[..., 4:] & 15) << 4),
    ], dim=-1)


# Q6_K's 2-bit high parts: four to a byte, at these shifts (a column against its 4 places).
CRUMB_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
# The places of a byte's 8 bits: Q5's fifth bits, eight to a byte.
BIT_PLACES = torch.arange(8, dtype=torch.uint8)
FIFTH_BIT_TYPES = ("Q5_0", "Q5_1", "Q5_K")
SCALE_MIN_TYPES = ("Q4_K", "Q5_K")  # 6-bit scales and minimums, 8 of each a block
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")  # blocks of 256 whose units start with a byte a row of factors
FACTOR_BYTES = 16  # each K type's byte factors a row: Q4_K's and Q5_K's 8 scales and 8 minimums, Q6_K's 16 scales


def arranged_bytes(block_type: str, columns: int) -> int:
    """Bytes of one tile (16 rows) in the kernels' layout."""
    kind = type_layout(block_type)
    return columns // kind.unit_columns * kind.unit_bytes


def _blocks_from_parts(
    levels: torch.Tensor, halves: torch.Tensor, factors: torch.Tensor | None, block_type: str
) -> torch.Tensor:
    rows, units = halves.shape[:2]
    if block_type in SCALE_MIN_TYPES:
        runs = levels.reshape(rows, units, 4, 2, 32)  # 64 columns a run: the low nibbles' 32, the high ones'
        nibbles = (runs[..., 0, :] & 15) | ((runs[..., 1, :] & 15) << 4)
        scales = _k_scales_packed(factors[..., :8], factors[..., 8:])
        parts = [halves.flatten(2), scales]
        if block_type == "Q5_K":  # qh: bit 2 run (+ 1) of byte l is column 64 run + l's (+ 32's) fifth bit
            fifth = ((runs >> 4) << torch.tensor([0, 1], dtype=torch.uint8)[:, None]).sum(dim=3, dtype=torch.uint8)
            parts.append((fifth << (2 * torch.arange(4, dtype=torch.uint8))[:, None]).sum(dim=2, dtype=torch.uint8))
        return torch.cat([*parts, nibbles.flatten(2)], dim=-1)
    if block_type == "Q6_K":
        quarters = levels.reshape(rows, units, 2, 4, 32)
        low, high = quarters & 15, quarters >> 4
        packed_low = low[:, :, :, 0:2] | (low[:, :, :, 2:4] << 4)  # [.., half block, first or second 32, l]
        packed_high = high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4) | (high[:, :, :, 3] << 6)
        return torch.cat([packed_low.flatten(2), packed_high.flatten(2), factors, halves.flatten(2)], dim=-1)
    if block_type == "Q8_0":
        return torch.cat([halves.flatten(2), levels], dim=-1)
    nibbles = (levels[..., :16] & 15) | (levels[..., 16:] << 4)
    if block_type in ("Q5_0", "Q5_1"):  # qh: bit i of byte b is column 8 b + i's fifth bit
        fifth = ((levels >> 4).reshape(rows, units, 4, 8) << BIT_PLACES).sum(dim=-1, dtype=torch.uint8)
        return torch.cat([halves.flatten(2), fifth, nibbles], dim=-1)
    return torch.cat([halves.flatten(2), nibbles], dim=-1)


def untile_rows(tiles: torch.Tensor, block_type: str, count: int) -> torch.Tensor:
    """The kernels' tiles [tiles, bytes a tile] (arranged as kernels/csrc/kernels.h says) as
    the first `count` rows' blocks in the file's order [count, bytes a row]."""
    kind, tile_rows = type_layout(block_type), library_layout().tile_rows
    fields = kind.halves
    groups_a_unit = kind.unit_columns // GROUP
    level_bytes = 512 if block_type == "Q8_0" else 256  # a group's
    high_bytes = {"Q6_K": 128, "Q5_0": 64, "Q5_1": 64, "Q5_K": 64}.get(block_type, 0)  # a group's
    factor_bytes = FACTOR_BYTES * tile_rows if block_type in K_TYPES else 0  # a unit's, ahead of its groups
    field_bytes = 2 * tile_rows * fields  # a unit's float16 fields, after its groups
    units = tiles.view(len(tiles), -1, kind.unit_bytes)
    count_units, rows = units.shape[1], len(tiles) * tile_rows
    shape = (len(tiles), count_units, groups_a_unit)
    groups = units[..., factor_bytes : kind.unit_bytes - field_bytes].reshape(*shape, level_bytes + high_bytes)
    if block_type == "Q8_0":  # level vector v: byte 4 r + j is row r's column 4 v + j, plus 128
        stored = groups[..., :level_bytes].reshape(*shape, 8, tile_rows, 4)
        levels = stored.permute(0, 4, 1, 2, 3, 5) ^ 0x80  # [tile, row, unit, group, v, j]: the file's int8 bytes
    else:
        packed = groups[..., :level_bytes].reshape(*shape, 4, tile_rows, 4).permute(0, 4, 1, 2, 3, 5)
        levels = torch.stack([packed & 15, packed >> 4], dim=-2)  # [tile, row, unit, group, k, half, j]
    if block_type in FIFTH_BIT_TYPES:  # bit v of byte 4 r + j: level vector v's fifth
        bits = groups[..., level_bytes:].reshape(*shape, tile_rows, 1, 4)
        fifth = (bits.permute(0, 3, 1, 2, 4, 5) >> BIT_PLACES[:, None]) & 1  # [tile, row, unit, group, v, j]
        levels = levels | (fifth.reshape(levels.shape) << 4)
    elif high_bytes:
        bits = groups[..., level_bytes:].reshape(*shape, 2, tile_rows, 4)
        bits = bits.permute(0, 4, 1, 2, 3, 5)[..., None, :]  # [tile, row, unit, group, chunk, 1, j]
        crumbs = (bits >> CRUMB_SHIFTS) & 3  # [.., chunk, v % 4, j]
        levels = levels | (crumbs.reshape(levels.shape) << 4)
    halves = units[..., kind.unit_bytes - field_bytes :].reshape(len(tiles), count_units, fields, tile_rows, 2)
    halves = halves.permute(0, 3, 1, 2, 4).reshape(rows, count_units, fields, 2)
    factors = None
    if factor_bytes:
        factors = units[..., :factor_bytes].reshape(len(tiles), count_units, FACTOR_BYTES, tile_rows)
        factors = factors.permute(0, 3, 1, 2).reshape(rows, count_units, FACTOR_BYTES)
    return _blocks_from_parts(levels.reshape(rows, -1, 32), halves, factors, block_type).reshape(rows, -1)[:count]


# Steps of more tokens than this are prompt chunks; fewer are verify steps and short chat
# turns (the compiled multi-token step's bound), which --prompt-math fast keeps exact.
PROMPT_ROWS = VERIFY_TOKENS


def set_prompt_math(model: nn.Module, fast: bool) -> int:
    """Prompt chunks with 8-bit activation blocks (fast) or 16-bit (exact) in every matrix of
    `model` held as blocks; how many such matrices there are (0: the switch does nothing)."""
    matrices = [module for module in model.modules() if isinstance(module, BlockLinear)]
    for matrix in matrices:
        matrix.fast_prompts = fast
    return len(matrices)


class BlockLinear(nn.Module):
    """y = x W^T with W held once as GGUF blocks of `block_type`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    Q4_K and Q6_K in tiles of 16 rows, Q5_K in groups of 4 rows."""

    def __init__(
        self, source: StoredMatrix, block_type: str, variant: int, activation_bits: int = 16, *, read: bool = True
    ) -> None:
        """read=False: only the shapes, on the meta device (`fill` or the packed cache fills them)."""
        super().__init__()
        self.out_features, self.in_features = source.shape
        self.block_type = block_type
        self.type_number = BLOCK_TYPES[block_type]
        self.variant = variant
        self.activation_bits = activation_bits  # of several tokens' activations: 8 or 16
        self.fast_prompts = False  # --prompt-math fast: prompt chunks with 8-bit activations (set_prompt_math)
        self.unit = library_layout().tile_rows
        width = arranged_bytes(block_type, self.in_features)
        device = None if read else "meta"
        units = -(-self.out_features // self.unit)
        self.register_buffer("blocks", torch.empty(units, width, dtype=torch.uint8, device=device))
        if read:
            self.fill(source)

    def fill(self, source: StoredMatrix) -> None:
        """Write `source` into the blocks, a chunk of rows at a time."""
        alignment = math.lcm(self.unit, source.row_alignment)
        step = max(alignment, CHUNK_WEIGHTS // self.in_features // alignment * alignment)
        for start in range(0, self.out_features, step):
            stop = min(start + step, self.out_features)
            if source.block_type == self.block_type:
                rows = source.blocks(start, stop)
            else:
                rows = QUANTISERS[self.block_type](as_float(source.rows(start, stop)))
            # Written in place by the kernels library (kernels/csrc/arrange.cpp), at memory's pace.
            arranged = self.blocks[start // self.unit : -(-stop // self.unit)]
            torch.ops.llama_chat.arrange_blocks(rows.contiguous(), self.type_number, arranged)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [n] of the matrix in float32 [n, in_features]: an embedding's lookup,
        dequantised by gguf's own reference code from the file's blocks (a few rows a step,
        so its speed does not matter and its exactness is gguf's)."""
        tiles = self.blocks[ids // self.unit]
        blocks = untile_rows(tiles, self.block_type, len(tiles) * self.unit).view(len(ids), self.unit, -1)
        picked = blocks[torch.arange(len(ids)), ids % self.unit]
        values = gguf_dequantize(picked.numpy(), GGMLQuantizationType[self.block_type])
        return torch.from_numpy(values).float().view(len(ids), self.in_features)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # Unpickled in another process (the decode step's compiler): it calls the operator.
        native.load_built()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        if self.fast_prompts and flat.shape[0] > PROMPT_ROWS:
            bits = 8  # ik_llama.cpp's activation blocks, for a prompt chunk only
        elif flat.shape[0] > 1:
            bits = self.activation_bits
        else:  # a single token: 16-bit activations
            bits = 16
        out = torch.ops.llama_chat.block_linear(
            flat, self.blocks, self.type_number, self.out_features, self.variant, bits
        )
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"{self.in_features} -> {self.out_features}, {self.block_type} blocks in tiles of {self.unit} rows, "
                f"{self.activation_bits}-bit steps")


class BlockEmbedding(nn.Module):
    """The token embedding read from a BlockLinear `table`: the model's output head too when
    the two are tied, so the table is held once, as the file's blocks."""

    def __init__(self, table: BlockLinear) -> None:
        super().__init__()
        self.table = table

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table.rows(tokens.reshape(-1)).view(*tokens.shape, self.table.in_features)


class StackedBlockLinear(nn.Module):
    """Matrices stacked by rows that the file holds in different block types (a Q4_K_M
    file's Q4_K q and k beside a Q6_K v): each run of one type a BlockLinear of its own, so
    none is widened; their outputs side by side."""

    def __init__(self, source: StackedRows, variant: int, activation_bits: int = 16, *, read: bool = True) -> None:
        super().__init__()
        self.parts = nn.ModuleList(
            BlockLinear(run, run.block_type, variant, activation_bits, read=read) for run in _runs_of_one_type(source)
        )

    def fill(self, source: StackedRows) -> None:
        for part, run in zip(self.parts, _runs_of_one_type(source)):
            part.fill(run)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def _runs_of_one_type(source: StackedRows) -> list[StoredMatrix]:
    """The stacked parts, neighbours of one block type stacked together."""
    runs: list[list[StoredMatrix]] = []
    for part in source.parts:
        if runs and runs[-1][0].block_type == part.block_type:
            runs[-1].append(part)
        else:
            runs.append([part])
    return [run[0] if len(run) == 1 else StackedRows(run) for run in runs]
