"""Weights as a checkpoint stores them, read a block of rows at a time.

A reader hands out StoredMatrix objects instead of tensors, so that the loader can
pack each weight as it arrives: only one matrix's rows (or a few thousand of them) are
ever held in float form, whatever the model's size. Rows come back either as float32
or, where the file holds exact 4-bit groups of 32 (GGUF Q4_0, Q4_1, Q4_K), as
Int4Groups that the int4 kernel format takes without any rounding of the levels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llama_chat.errors import LlamaChatError

GROUP = 32  # weights per 4-bit group along a row, as in GGUF's 4-bit blocks


@dataclass
class Int4Groups:
    """Rows of weights w = (level - 8) * scale + zero, one scale and zero per group of 32."""

    levels: torch.Tensor  # uint8 [rows, columns], each 0..15
    scales: torch.Tensor  # float32 [rows, columns / 32]
    zeros: torch.Tensor  # float32 [rows, columns / 32]

    def dequantize(self) -> torch.Tensor:
        rows, columns = self.levels.shape
        grouped = (self.levels.view(rows, -1, GROUP).float() - 8) * self.scales[..., None] + self.zeros[..., None]
        return grouped.view(rows, columns)

    @staticmethod
    def cat(parts: Sequence[Int4Groups]) -> Int4Groups:
        return Int4Groups(*(torch.cat([getattr(p, f) for p in parts]) for f in ("levels", "scales", "zeros")))


Rows = torch.Tensor | Int4Groups


def read_range(path: str | Path, offset: int, count: int) -> bytearray:
    """`count` bytes of a file from `offset`, by a plain read (a memory map's touched pages
    would stay counted in the process's resident memory until the load ends)."""
    data = bytearray(count)
    done = 0
    with open(path, "rb", buffering=0) as file:  # unbuffered: read straight into `data`, one copy
        file.seek(offset)
        view = memoryview(data)
        while done < count and (got := file.readinto(view[done:])):
            done += got
    if done != count:
        raise LlamaChatError(f"{path}: the file ends before the weights it lists; it is truncated or corrupt")
    return data


def as_float(rows: Rows) -> torch.Tensor:
    return rows.dequantize() if isinstance(rows, Int4Groups) else rows.float()


class StoredMatrix:
    """A 2-D weight [out, in] whose rows can be read a range at a time."""

    shape: tuple[int, int]
    four_bit: bool = False  # rows come as exact Int4Groups
    float_storage: bool = True  # stored as floats (not as some other quantised type)
    row_alignment: int = 1  # reads must start and stop at multiples of this (or at the end)
    stored_bytes: int = 0  # its size in the file, for progress
    block_type: str | None = None  # the GGUF block type blocks() hands out as stored, if any

    def rows(self, start: int, stop: int) -> Rows:
        raise NotImplementedError

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        """Rows start..stop as the file's bytes, uint8 [rows, bytes a row] (block_type set)."""
        raise NotImplementedError

    def dense(self) -> torch.Tensor:
        """The whole matrix in float32."""
        return as_float(self.rows(0, self.shape[0]))


class TensorMatrix(StoredMatrix):
    """A tensor already in memory or memory-mapped; `read(start, stop)` returns its rows."""

    def __init__(self, shape: tuple[int, int], read: Callable[[int, int], torch.Tensor], stored_bytes: int) -> None:
        self.shape = shape
        self._read = read
        self.stored_bytes = stored_bytes

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorMatrix:
        return cls(tuple(tensor.shape), lambda start, stop: tensor[start:stop], tensor.numel() * tensor.element_size())

    def rows(self, start: int, stop: int) -> Rows:
        return self._read(start, stop)


class HeadRows(StoredMatrix):
    """q or k projection rows reordered within each head: row p of a head is the stored
    head's row order[p] (see engine/rope.head_feature_order). Reads cover whole heads."""

    def __init__(self, source: StoredMatrix, n_heads: int, order: Sequence[int]) -> None:
        self.source = source
        self.shape = source.shape
        self.four_bit = source.four_bit
        self.float_storage = source.float_storage
        self.stored_bytes = source.stored_bytes
        self.block_type = source.block_type
        self.head_dim = source.shape[0] // n_heads
        self.order = torch.tensor(order)
        self.row_alignment = math.lcm(self.head_dim, source.row_alignment)

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return self._reordered(self.source.blocks(start, stop))

    def rows(self, start: int, stop: int) -> Rows:
        stored = self.source.rows(start, stop)
        if isinstance(stored, Int4Groups):
            return Int4Groups(*(self._reordered(t) for t in (stored.levels, stored.scales, stored.zeros)))
        return self._reordered(stored)

    def _reordered(self, rows: torch.Tensor) -> torch.Tensor:
        count, columns = rows.shape
        return rows.view(-1, self.head_dim, columns)[:, self.order].reshape(count, columns)


class StackedRows(StoredMatrix):
    """Matrices with the same width stacked on top of each other (q, k, v: one projection)."""

    def __init__(self, parts: Sequence[StoredMatrix]) -> None:
        self.parts = list(parts)
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        self.four_bit = all(p.four_bit for p in parts)
        self.float_storage = all(p.float_storage for p in parts)
        self.stored_bytes = sum(p.stored_bytes for p in parts)
        self.row_alignment = math.lcm(*(p.row_alignment for p in parts))
        types = {p.block_type for p in parts}
        self.block_type = types.pop() if len(types) == 1 else None
        self._starts = [0]
        for part in parts:
            self._starts.append(self._starts[-1] + part.shape[0])

    def _pieces(self, start: int, stop: int, read: Callable[[StoredMatrix, int, int], Rows]) -> list[Rows]:
        pieces = []
        for part, offset in zip(self.parts, self._starts):
            low, high = max(start, offset), min(stop, offset + part.shape[0])
            if low < high:
                pieces.append(read(part, low - offset, high - offset))
        return pieces

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return torch.cat(self._pieces(start, stop, lambda part, low, high: part.blocks(low, high)))

    def rows(self, start: int, stop: int) -> Rows:
        pieces = self._pieces(start, stop, lambda part, low, high: part.rows(low, high))
        if len(pieces) == 1:
            return pieces[0]
        if self.four_bit:
            return Int4Groups.cat(pieces)
        return torch.cat([as_float(piece) for piece in pieces])


class ColumnStacked(StoredMatrix):
    """Matrices with the same height side by side (Meta's shards of a row-parallel layer)."""

    def __init__(self, parts: Sequence[StoredMatrix]) -> None:
        self.parts = list(parts)
        self.shape = (parts[0].shape[0], sum(p.shape[1] for p in parts))
        self.float_storage = all(p.float_storage for p in parts)
        self.stored_bytes = sum(p.stored_bytes for p in parts)
        self.row_alignment = math.lcm(*(p.row_alignment for p in parts))

    def rows(self, start: int, stop: int) -> Rows:
        return torch.cat([as_float(part.rows(start, stop)) for part in self.parts], dim=1)


class RowRange(StoredMatrix):
    """Rows first..first+count of a stored matrix (a tensor-parallel rank's share), read
    from the source only where asked."""

    def __init__(self, source: StoredMatrix, first: int, count: int) -> None:
        if first % source.row_alignment or count % source.row_alignment:
            raise ValueError(f"rows {first}..{first + count} do not fall on reads of {source.row_alignment} rows")
        self.source, self.first = source, first
        self.shape = (count, source.shape[1])
        self.four_bit = source.four_bit
        self.float_storage = source.float_storage
        self.row_alignment = source.row_alignment
        self.stored_bytes = source.stored_bytes * count // source.shape[0]
        self.block_type = source.block_type

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return self.source.blocks(self.first + start, self.first + stop)

    def rows(self, start: int, stop: int) -> Rows:
        return self.source.rows(self.first + start, self.first + stop)


class ColumnRange(StoredMatrix):
    """Columns first..first+count of a stored matrix; exact 4-bit groups stay exact, and the
    file's blocks stay the file's, when the range falls on whole groups and blocks."""

    def __init__(self, source: StoredMatrix, first: int, count: int) -> None:
        self.source, self.first, self.count = source, first, count
        self.shape = (source.shape[0], count)
        self.four_bit = source.four_bit and first % GROUP == 0 and count % GROUP == 0
        self.float_storage = source.float_storage
        self.row_alignment = source.row_alignment
        self.stored_bytes = source.stored_bytes * count // source.shape[1]
        if source.block_type is not None:
            weights, size = GGML_QUANT_SIZES[GGMLQuantizationType[source.block_type]]
            if first % weights == 0 and count % weights == 0:
                self.block_type = source.block_type
                self._block_bytes = slice(first // weights * size, (first + count) // weights * size)

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return self.source.blocks(start, stop)[:, self._block_bytes].contiguous()

    def rows(self, start: int, stop: int) -> Rows:
        stored = self.source.rows(start, stop)
        if isinstance(stored, Int4Groups) and self.four_bit:
            columns, groups = slice(self.first, self.first + self.count), slice(
                self.first // GROUP, (self.first + self.count) // GROUP
            )
            return Int4Groups(stored.levels[:, columns], stored.scales[:, groups], stored.zeros[:, groups])
        return as_float(stored)[:, self.first : self.first + self.count]
