"""The header of a GGUF file: its metadata as Python values and where each tensor lies.

The layout (GGUF versions 2 and 3, little-endian): "GGUF", a u32 version, u64 counts of
tensors and of metadata entries; each entry a string key, a u32 value type and the value
(an array: element type, u64 count, elements); each tensor a name, u32 dimension count,
u64 dimensions (innermost first), u32 type and u64 offset from the data section, which
starts at the next multiple of general.alignment (32 unless set).

The gguf package's reader builds a numpy view for every part of every entry, which for
a vocabulary of 50,000 tokens costs seconds at each load; this reads the same in a
fraction of that and touches nothing but the header.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llama_chat.errors import LlamaChatError

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # PyTorch order: outermost first
    offset: int  # from the start of the file
    n_bytes: int


class _Cursor:
    def __init__(self, buffer) -> None:
        self.buffer = buffer
        self.position = 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        self.position += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        end = self.position + length
        if end > len(self.buffer):
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.buffer[self.position : end]).decode("utf-8")
        self.position = end
        return text

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row (a vocabulary, its merges): one tight loop, as a load
        spends a tenth of a second here for 50,000 tokens."""
        buffer, position, unpack_length = self.buffer, self.position, _LENGTH.unpack_from
        texts = []
        for _ in range(count):
            (length,) = unpack_length(buffer, position)
            position += 8
            texts.append(str(buffer[position : position + length], "utf-8"))
            position += length
        if position > len(buffer):
            raise ValueError("a string runs past the end of the file")
        self.position = position
        return texts

    def value(self, value_type: int) -> Any:
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            element_type, count = self.take("<I"), self.take("<Q")
            if element_type in _NUMPY:
                items = np.frombuffer(self.buffer, dtype=_NUMPY[element_type], count=count, offset=self.position)
                self.position += items.nbytes
                return items.tolist()
            if element_type == STRING:
                return self.strings(count)
            return [self.value(element_type) for _ in range(count)]
        return self.take(_SCALARS[value_type])


def read_gguf_header(path: Path) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The metadata (name to value) and the tensors (name to TensorInfo) of a GGUF file."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return _parse(mapped, len(mapped))
    # A truncated or damaged file fails wherever the reader runs out of bytes or meets nonsense.
    except (ValueError, struct.error, KeyError, IndexError, OverflowError, UnicodeDecodeError, MemoryError):
        raise LlamaChatError(f"{path}: the GGUF file is truncated or corrupt; download it again") from None


def _parse(buffer, size: int) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    cursor = _Cursor(buffer)
    if bytes(buffer[:4]) != MAGIC:
        raise ValueError("no GGUF magic")
    cursor.position = 4
    version = cursor.take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}")
    tensor_count, entry_count = cursor.take("<Q"), cursor.take("<Q")
    metadata = {}
    for _ in range(entry_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("<I"))
    layout = []
    for _ in range(tensor_count):
        name = cursor.string()
        dimensions = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
        layout.append((name, dimensions, GGMLQuantizationType(cursor.take("<I")), cursor.take("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-cursor.position // alignment) * alignment
    tensors = {}
    for name, dimensions, tensor_type, offset in layout:
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        n_bytes = int(np.prod(dimensions, dtype=np.int64)) // block_size * type_size
        start = data_start + offset
        if start + n_bytes > size:
            raise ValueError(f"tensor {name} runs past the end of the file")
        tensors[name] = TensorInfo(name, tensor_type, tuple(reversed(dimensions)), start, n_bytes)
    return metadata, tensors
