"""The header of a .safetensors file, checked whole before any tensor is read.

The format is an 8-byte little-endian header length, a JSON object naming each tensor's
dtype, shape and byte range [begin, end) within the data that follows (and an optional
"__metadata__" object of strings), then the data. Every range is checked against the
file's size and the tensor's shape and dtype, and the ranges may not overlap.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from llama_chat.checkpoints.values import LARGEST_WHOLE_NUMBER
from llama_chat.untrusted_files import open_regular_file, parse_json, shown

MAX_HEADER_BYTES = 100 * 2**20  # as the safetensors library allows
MAX_DIMENSIONS = 8
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2,
              "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # from the start of the data, which starts at SafetensorsHeader.data_start
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    data_start: int
    tensors: dict[str, TensorEntry]  # in the header's order
    metadata: dict[str, str]


def read_safetensors_header(file, size: int) -> SafetensorsHeader:
    """The header of the open binary `file` of `size` bytes; ValueError saying what is
    wrong for anything that is not a well-formed header of a file that size."""
    raw_length = file.read(8)
    if len(raw_length) < 8:
        raise ValueError("it is shorter than a header")
    (length,) = struct.unpack("<Q", raw_length)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise ValueError(f"a header of {length} bytes in a file of {size}")
    header = parse_json(file.read(length))
    if not isinstance(header, dict):
        raise ValueError("its header is not an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise ValueError("its __metadata__ is not an object of strings")
    data_start = 8 + length
    tensors = {name: _entry(name, entry) for name, entry in header.items()}
    _check_ranges(tensors, size - data_start)
    return SafetensorsHeader(data_start, tensors, metadata)


def read_safetensors_file_header(path: Path) -> SafetensorsHeader:
    """read_safetensors_header of the file at `path` (OSError where it cannot be read)."""
    with open_regular_file(path) as file:
        return read_safetensors_header(file, os.fstat(file.fileno()).st_size)


def _entry(name: str, entry: object) -> TensorEntry:
    if not isinstance(entry, dict):
        raise ValueError(f"tensor {shown(name)} is described by {shown(entry)}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEM_BYTES:
        raise ValueError(f"tensor {shown(name)} has dtype {shown(dtype)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMENSIONS or not all(_count(size) for size in shape):
        raise ValueError(f"tensor {shown(name)} has shape {shown(shape)}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(offset) for offset in offsets):
        raise ValueError(f"tensor {shown(name)} has data_offsets {shown(offsets)}")
    begin, end = offsets
    # Python ints: dimensions whose product passes 2**63 do not wrap to a small size.
    if end - begin != math.prod(shape) * ITEM_BYTES[dtype]:
        raise ValueError(f"tensor {shown(name)} has {end - begin} bytes for shape {shape} of {dtype}")
    return TensorEntry(dtype, tuple(shape), begin, end)


def _count(value: object) -> bool:
    """A size or an offset: a whole number from 0 up (a bool is not one)."""
    return type(value) is int and 0 <= value <= LARGEST_WHOLE_NUMBER**2


def _check_ranges(tensors: dict[str, TensorEntry], data_bytes: int) -> None:
    end = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin < end and entry.end > entry.begin:  # an empty tensor overlaps nothing
            raise ValueError(f"tensor {shown(name)} overlaps another")
        end = max(end, entry.end)
    if end > data_bytes:
        raise ValueError(f"its tensors need {end} bytes of data, the file holds {data_bytes}")
