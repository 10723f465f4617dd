"""Packed weights for the cpu: one copy of each matrix, in the format PyTorch's kernels read.

Decoding one token reads every weight once, so its speed is bounded by the bytes of
the weights: int4 (groups of 32, as GGUF's 4-bit blocks) or int8 rows. A step over
many tokens (a prompt) is bound by arithmetic instead, and the packed kernels are slow
at it; so a PackedLinear dequantises its matrix into a scratch buffer shared by the
whole model and multiplies in the dtype measured fastest. No second copy is kept.

The int4 kernel's byte layout is PyTorch's own and differs between CPU capabilities
(AVX-512, AVX2, plain); Int4Layout reads it off the kernel's packing function once and
checks it, so that prompt steps can unpack the levels with plain tensor operations.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from llama_chat.checkpoints.stored import GROUP, Int4Groups, StoredMatrix, as_float

CHUNK_WEIGHTS = 1 << 18  # weights converted at a time: bounds the float temporaries of a load
SCRATCH_CHUNK_WEIGHTS = 1 << 20  # weights dequantised at a time through the float32 scratch


@dataclass(frozen=True)
class Int4Layout:
    """Where the int4 kernel keeps level (row, column): blocks of `block` rows, each stored
    column by column as block/2 bytes. Byte j holds rows j and j + block/2 (low and high
    nibble) when `pairs` is false, rows 2j and 2j + 1 when it is true."""

    block: int
    pairs: bool

    def _halves(self, tensor: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows a block's low and high nibbles hold, along `axis` of a blocked tensor."""
        if self.pairs:
            return tensor.unflatten(axis, (-1, 2)).unbind(axis + 1)
        return tensor.split(self.block // 2, dim=axis)

    def unpack_transposed(self, packed: torch.Tensor, out: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Levels of packed [rows, columns/2], columns start.. (as many as out holds), written
        into out [those columns, rows] (any dtype)."""
        rows, half = packed.shape
        count = out.shape[0]
        blocks = packed.view(rows // self.block, 2 * half, self.block // 2).transpose(0, 1)[start : start + count]
        low, high = self._halves(out.view(count, rows // self.block, self.block), 2)
        low.copy_(blocks & 15)
        high.copy_(blocks >> 4)
        return out

    @classmethod
    def read_off(cls, block: int, rows_in_block: list[int]) -> Int4Layout | None:
        """The layout whose first column of a block holds these rows, nibble by nibble."""
        for pairs in (False, True):
            layout = cls(block, pairs)
            low, high = layout._halves(torch.arange(block)[None], 1)
            if torch.stack([low.flatten(), high.flatten()], dim=1).flatten().tolist() == rows_in_block:
                return layout
        return None


def int4_kernels_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


@functools.cache
def int4_layout() -> Int4Layout | None:
    """The int4 kernel's layout on this CPU, read off its packing of coordinate patterns;
    None when the kernel is missing or its layout is not one of the known kinds."""
    if not int4_kernels_available():
        return None
    rows, columns = 128, 64
    row, column = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")

    def packed_nibbles(levels: torch.Tensor) -> torch.Tensor:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.int(), 1).flatten()
        return torch.stack([packed & 15, packed >> 4], dim=1).flatten().long()

    try:
        row_of = packed_nibbles(row % 16) + 16 * packed_nibbles(row // 16)
        column_of = packed_nibbles(column % 16) + 16 * packed_nibbles(column // 16)
    except RuntimeError:
        return None
    second_column = (column_of == 1).nonzero()
    block = int(second_column[0]) if len(second_column) else 0
    if block <= 0 or rows % block or block % 2:
        return None
    layout = Int4Layout.read_off(block, row_of[:block].tolist())
    if layout is None:
        return None
    levels = torch.randint(0, 16, (rows, columns), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    expected = pack_int4(levels)
    unpacked = layout.unpack_transposed(expected, torch.empty(columns, rows, dtype=torch.uint8))
    return layout if torch.equal(unpacked.t(), levels) else None


def pack_int4(levels: torch.Tensor) -> torch.Tensor:
    """uint8 levels [rows, columns] to the kernel's packed [rows, columns/2], by the kernel's
    own packing; the layout keeps blocks of rows together, so row ranges pack separately."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.int(), 1)


def int8_kernels_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm") and hasattr(torch, "_int_mm")


class Scratch:
    """The buffers every PackedLinear of a model dequantises into, each grown as needed:
    one for whole weights (per dtype) and a small float32 one for a chunk of a weight."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def __deepcopy__(self, memo: dict) -> Scratch:
        return Scratch()  # a copy of a model (engine/compiled's structure) needs none of these

    def take(self, shape: tuple[int, int], dtype: torch.dtype, purpose: str = "weight") -> torch.Tensor:
        size = math.prod(shape)
        buffer = self._buffers.get((purpose, dtype))
        if buffer is None or buffer.numel() < size:
            # A plain tensor even when first taken under inference mode, so that a step run
            # outside it (with grad mode merely off) may write to it too.
            with torch.inference_mode(False):
                buffer = self._buffers[purpose, dtype] = torch.empty(size, dtype=dtype)
        return buffer[:size].view(shape)


def bfloat16_at_least(values: torch.Tensor) -> torch.Tensor:
    """The nearest bfloat16 not below each float32 value."""
    rounded = values.to(torch.bfloat16)
    too_small = rounded.float() < values
    return torch.where(too_small, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)


def int8_rows(weight: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row, rounded against the scale as stored in `scale_dtype`, so each
    weight is within half a step of what it was and the largest is not clamped."""
    step = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12)
    scale = bfloat16_at_least(step).to(scale_dtype) if scale_dtype == torch.bfloat16 else step.to(scale_dtype)
    levels = torch.round(weight / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return levels, scale


def int4_from_float(weight: torch.Tensor) -> Int4Groups:
    """Asymmetric 4-bit groups of 32 spanning each group's minimum to maximum."""
    rows = weight.shape[0]
    groups = weight.view(rows, -1, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-12)
    levels = torch.round((groups - low[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
    return Int4Groups(levels.view(rows, -1), scale, low + 8 * scale)


def chunk_rows(source: StoredMatrix, alignment: int) -> int:
    """Rows converted at a time: about CHUNK_WEIGHTS weights, at the alignment reads need."""
    step = math.lcm(alignment, source.row_alignment)
    return max(step, CHUNK_WEIGHTS // source.shape[1] // step * step)


class PackedLinear(nn.Module):
    """y = x W^T with W held once, as int4 groups or int8 rows.

    Up to `kernel_rows` rows of x go through PyTorch's packed kernel in `kernel_dtype`
    (which the scales are kept in); more rows multiply a copy dequantised to `matmul_dtype`
    in the shared scratch buffer. Either way x is rounded to that dtype on the way in and
    the result comes back in x's dtype. Which is faster where is measured (cpu_paths).
    """

    def __init__(
        self, source: StoredMatrix, mode: str, scratch: Scratch, kernel_dtype: torch.dtype, kernel_rows: int = 1,
        matmul_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.mode = mode
        self.out_features, self.in_features = source.shape
        self.kernel_dtype = kernel_dtype
        self.kernel_rows = kernel_rows
        self.matmul_dtype = matmul_dtype
        self.scratch = scratch
        if mode == "int4":
            self._pack_int4(source)
        elif mode == "int8":
            self._pack_int8(source)
        else:
            raise ValueError(f"unknown packing {mode!r}")

    def _pack_int4(self, source: StoredMatrix) -> None:
        layout = int4_layout()
        assert layout is not None, "int4 packing asked for where the kernel's layout is unknown"
        # Buffers, not plain attributes: a compiled decode step takes every buffer as an input.
        self.register_buffer("packed", torch.empty(self.out_features, self.in_features // 2, dtype=torch.uint8))
        self.register_buffer(
            "scales_and_zeros", torch.empty(self.in_features // GROUP, self.out_features, 2, dtype=self.kernel_dtype)
        )
        step = chunk_rows(source, layout.block)
        for start in range(0, self.out_features, step):
            stop = min(start + step, self.out_features)
            rows = source.rows(start, stop)
            groups = rows if isinstance(rows, Int4Groups) else int4_from_float(rows.float())
            self.packed[start:stop] = pack_int4(groups.levels)
            self.scales_and_zeros[:, start:stop, 0] = groups.scales.t()
            self.scales_and_zeros[:, start:stop, 1] = groups.zeros.t()

    def _pack_int8(self, source: StoredMatrix) -> None:
        self.register_buffer("weight_int8", torch.empty(self.out_features, self.in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(self.out_features, dtype=self.kernel_dtype))
        step = chunk_rows(source, 1)
        for start in range(0, self.out_features, step):
            stop = min(start + step, self.out_features)
            self.weight_int8[start:stop], self.scales[start:stop] = int8_rows(
                as_float(source.rows(start, stop)), self.kernel_dtype
            )

    def in_dtype(self, dtype: torch.dtype) -> PackedLinear:
        """This layer's levels, shared, with its scales in `dtype`, multiplied in it: the same
        work in another dtype, for timing (packing a large layer again takes seconds)."""
        other = copy.copy(self)
        other._buffers = dict(self._buffers)
        other.kernel_dtype = other.matmul_dtype = dtype
        name = "scales_and_zeros" if self.mode == "int4" else "scales"
        other._buffers[name] = self._buffers[name].to(dtype)
        return other

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.kernel_rows:
            out = flat.to(self.matmul_dtype) @ self.dequantize(self.matmul_dtype).t()
        else:
            out = self._kernel(flat.to(self.kernel_dtype))
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def _kernel(self, rows: torch.Tensor) -> torch.Tensor:
        if self.mode == "int4":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scales_and_zeros)
        return torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scales)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] in `dtype`, in the scratch buffer (the next call overwrites it).

        int4 weights unpack fastest into W^T (the kernel stores blocks of rows column by
        column), so they come back as a transposed view, which a matrix product takes as is.
        The arithmetic runs in float32 a chunk at a time: bfloat16 arithmetic that
        broadcasts the scales is many times slower on CPUs.
        """
        if self.mode == "int8":
            shape = (self.out_features, self.in_features)
        else:
            shape = (self.in_features, self.out_features)
        weight = self.scratch.take(shape, dtype)
        step = max(GROUP, SCRATCH_CHUNK_WEIGHTS // shape[1] // GROUP * GROUP)
        for start in range(0, shape[0], step):
            stop = min(start + step, shape[0])
            chunk = weight[start:stop] if dtype == torch.float32 else self.scratch.take(
                (stop - start, shape[1]), torch.float32, "chunk"
            )
            self._dequantize_rows(start, chunk)
            if chunk.data_ptr() != weight[start:stop].data_ptr():
                weight[start:stop].copy_(chunk)
        return weight if self.mode == "int8" else weight.t()

    def _dequantize_rows(self, start: int, out: torch.Tensor) -> None:
        """Rows start.. of the int8 weight, or of the int4 weight's transpose, into float32 out."""
        stop = start + out.shape[0]
        if self.mode == "int8":
            torch.mul(self.weight_int8[start:stop], self.scales[start:stop, None].float(), out=out)
            return
        int4_layout().unpack_transposed(self.packed, out, start)
        scales, zeros = self.scales_and_zeros[start // GROUP : stop // GROUP].float().unbind(-1)
        # (level - 8) * scale + zero, as level * scale + (zero - 8 * scale)
        grouped = out.view(-1, GROUP, self.out_features)
        torch.addcmul((zeros - 8 * scales)[:, None], grouped, scales[:, None], out=grouped)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.mode}, kernel {self.kernel_dtype}"


def int8_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 levels with a float32 scale per group of 32 along each row, the
    group's largest magnitude / 127. A GGUF Q8_0 matrix comes back exactly: its largest
    level is +-127, so the scale found is the stored one and every level divides out."""
    rows, columns = weight.shape
    groups = weight.view(rows, -1, GROUP)
    scales = groups.abs().amax(dim=-1) / 127
    levels = torch.round(groups / scales.clamp_min(1e-30)[..., None]).clamp_(-127, 127)
    return levels.to(torch.int8).view(rows, columns), scales


class Int8Table(nn.Module):
    """A [vocab, dim] table serving as the embedding (rows looked up) and as the output head
    (float32 logits), so a tied model keeps it once.

    Each group of 32 weights along a row is int8 levels times a float32 scale: GGUF's Q8_0
    held exactly (1.125 bytes a weight), and other sources within half a step. One scale per
    row instead was measured to change greedy answers of the default model.
    """

    def __init__(self, source: StoredMatrix, scratch: Scratch, *, read: bool = True) -> None:
        """read=False: only the shapes, on the meta device (`fill` or the packed cache fills them)."""
        super().__init__()
        self.vocab_size, self.dim = source.shape
        self.scratch = scratch
        device = None if read else "meta"
        self.register_buffer("levels", torch.empty(source.shape, dtype=torch.int8, device=device))
        scales = torch.empty(self.vocab_size, self.dim // GROUP, dtype=torch.float32, device=device)
        self.register_buffer("scales", scales)
        if read:
            self.fill(source)

    def fill(self, source: StoredMatrix) -> None:
        """Write `source` into the levels and scales, a chunk of rows at a time."""
        step = chunk_rows(source, 1)
        for start in range(0, self.vocab_size, step):
            stop = min(start + step, self.vocab_size)
            self.levels[start:stop], self.scales[start:stop] = int8_groups(as_float(source.rows(start, stop)))

    def _dequantize(self, levels: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.copy_(levels)
        out.view(out.shape[0], -1, GROUP).mul_(scales[..., None])
        return out

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat = ids.reshape(-1)
        out = torch.empty(flat.shape[0], self.dim)  # shape, not len(): a traced size stays symbolic
        return self._dequantize(self.levels[flat], self.scales[flat], out).view(*ids.shape, self.dim).to(dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T in float32 (bfloat16 logits would step by 0.125 between 16 and 32 and tie
        near-equal tokens).

        Compiled, this is one fused pass over the int8 levels, so a decode step reads the
        table once at 1.125 bytes a weight. Eager, the table is dequantised a chunk of rows
        at a time into a scratch buffer that stays in cache, and multiplied from there.
        """
        flat = x.reshape(-1, self.dim).float()
        if torch.compiler.is_compiling():
            grouped = self.levels.view(1, self.vocab_size, -1, GROUP).float() * flat.view(-1, 1, self.dim // GROUP, GROUP)
            out = (grouped.sum(-1) * self.scales).sum(-1)
        else:
            out = torch.empty(len(flat), self.vocab_size)
            step = max(1, SCRATCH_CHUNK_WEIGHTS // self.dim)
            for start in range(0, self.vocab_size, step):
                stop = min(start + step, self.vocab_size)
                weights = self.scratch.take((stop - start, self.dim), torch.float32, "chunk")
                self._dequantize(self.levels[start:stop], self.scales[start:stop], weights)
                out[:, start:stop] = flat @ weights.t()
        return out.view(*x.shape[:-1], self.vocab_size)


class PackedEmbedding(nn.Module):
    def __init__(self, table: Int8Table, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = table
        self.dtype = dtype

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table.rows(tokens, self.dtype)


class PackedHead(nn.Module):
    def __init__(self, table: Int8Table) -> None:
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table.logits(x)
