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

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llama_chat.errors import LlamaChatError, first_line
from llama_chat.untrusted_files import open_regular_file, shown

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")

# Bounds far above any real file (a 256k vocabulary with its merges is about a million
# values; llama.cpp allows 4 dimensions), so that a hostile header is refused before it
# costs time or memory.
MAX_TENSORS = 1 << 16
MAX_METADATA_ENTRIES = 1 << 16
MAX_METADATA_VALUES = 1 << 23  # array elements, all arrays together
MAX_STRING_BYTES = 1 << 24
MAX_ARRAY_NESTING = 4  # arrays within arrays: real files use 1
MAX_DIMENSIONS = 4
MAX_ALIGNMENT = 1 << 20
MAX_TENSOR_NAME = 256
_TYPE_NUMBERS = frozenset(t.value for t in GGMLQuantizationType)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # PyTorch order: outermost first
    offset: int  # from the start of the file
    n_bytes: int
    file: Path  # the file it lies in (one part of a split model, gguf_split.py)


class _Cursor:
    """Reads the header's values in order; ValueError (with the reason) or struct.error
    where the bytes are not a header."""

    def __init__(self, buffer) -> None:
        self.buffer = buffer
        self.position = 0
        self.values_left = MAX_METADATA_VALUES

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        self.position += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        end = self.position + self._checked_length(length)
        text = bytes(self.buffer[self.position : end]).decode("utf-8")
        self.position = end
        return text

    def _checked_length(self, length: int) -> int:
        if length > MAX_STRING_BYTES:
            raise ValueError(f"a string of {length} bytes")
        if self.position + length > len(self.buffer):
            raise ValueError("a string runs past the end of the file")
        return length

    def strings(self, count: int, keep: bool = True) -> list[str]:
        """`count` strings in a row (a vocabulary, its merges): one tight loop, as a load
        spends a tenth of a second here for 50,000 tokens. With keep false, checked and
        stepped over, none made."""
        buffer, position, unpack_length = self.buffer, self.position, _LENGTH.unpack_from
        size = len(buffer)
        texts = []
        for _ in range(count):
            (length,) = unpack_length(buffer, position)
            position += 8
            if position + length > size or length > MAX_STRING_BYTES:  # before a copy that size
                self.position = position
                self._checked_length(length)
            if keep:
                texts.append(str(buffer[position : position + length], "utf-8"))
            position += length
        self.position = position
        return texts

    def step_over_array(self) -> None:
        """Move past an array, checked as `value` checks it, without making its values: a
        vocabulary the caller has no use for (its tokenizer kept in the cache) is 262,144
        strings."""
        start = self.position
        element_type, count = self.take("<I"), self.take("<Q")
        if element_type == STRING:
            self._spend(count)
            self.strings(count, keep=False)
        elif element_type in _NUMPY:
            self._spend(count)
            end = self.position + count * np.dtype(_NUMPY[element_type]).itemsize
            if end > len(self.buffer):
                raise ValueError("an array runs past the end of the file")
            self.position = end
        else:  # arrays of arrays: read, as no key stepped over holds them
            self.position = start
            self.value(ARRAY)

    def value(self, value_type: int, nesting: int = 0) -> Any:
        """A metadata value; an array's arrays are read by at most MAX_ARRAY_NESTING nested
        calls, whatever the file says."""
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            element_type, count = self.take("<I"), self.take("<Q")
            self._spend(count)
            if element_type in _NUMPY:
                itemsize = np.dtype(_NUMPY[element_type]).itemsize
                if self.position + count * itemsize > len(self.buffer):
                    raise ValueError("an array runs past the end of the file")
                items = np.frombuffer(self.buffer, dtype=_NUMPY[element_type], count=count, offset=self.position)
                self.position += items.nbytes
                return items.tolist()
            if element_type == STRING:
                return self.strings(count)
            if element_type == ARRAY:
                if nesting + 1 >= MAX_ARRAY_NESTING:
                    raise ValueError(f"metadata arrays nested more than {MAX_ARRAY_NESTING} deep")
                return [self.value(ARRAY, nesting + 1) for _ in range(count)]
            raise ValueError(f"an array of unknown value type {element_type}")
        if value_type not in _SCALARS:
            raise ValueError(f"a metadata value of unknown type {value_type}")
        return self.take(_SCALARS[value_type])

    def _spend(self, count: int) -> None:
        if count > self.values_left:
            raise ValueError(f"its metadata arrays hold more than {MAX_METADATA_VALUES} values")
        self.values_left -= count


def read_gguf_header(
    path: Path, step_over: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The metadata (name to value) and the tensors (name to TensorInfo) of a GGUF file;
    LlamaChatError naming the file for anything that is not a readable GGUF header. Arrays
    under the keys `step_over` names are checked but left out of the metadata."""
    try:
        with open_regular_file(path) as file:
            if os.fstat(file.fileno()).st_size < len(MAGIC):
                raise ValueError("it is shorter than a header")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return _parse(mapped, path, step_over)
    except OSError as error:
        raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error})") from None
    # A truncated or damaged file fails wherever the reader runs out of bytes or meets nonsense.
    except (ValueError, struct.error) as error:
        raise LlamaChatError(
            f"{path}: the GGUF file is truncated or corrupt ({_reason(error)}); download it again"
        ) from None


def _reason(error: Exception) -> str:
    if isinstance(error, struct.error):
        return "it ends inside its header"
    if isinstance(error, UnicodeDecodeError):
        return "a name or text in its header is not UTF-8"
    return first_line(error)


def _parse(buffer, path: Path, step_over: frozenset[str]) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    cursor = _Cursor(buffer)
    if bytes(buffer[:4]) != MAGIC:
        raise ValueError("no GGUF magic")
    cursor.position = 4
    version = cursor.take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}, where llama-chat reads 2 and 3")
    tensor_count, entry_count = cursor.take("<Q"), cursor.take("<Q")
    if tensor_count > MAX_TENSORS or entry_count > MAX_METADATA_ENTRIES:
        raise ValueError(f"it lists {tensor_count} tensors and {entry_count} metadata entries")
    metadata = _metadata(cursor, entry_count, step_over)
    layout = [_tensor_entry(cursor) for _ in range(tensor_count)]
    alignment = metadata.get("general.alignment", 32)
    if type(alignment) is not int or not 0 < alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
        raise ValueError(f"general.alignment is {shown(alignment)}, not a power of two up to {MAX_ALIGNMENT}")
    data_start = -(-cursor.position // alignment) * alignment
    tensors = {}
    for name, dimensions, tensor_type, offset in layout:
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        if dimensions and dimensions[0] % block_size:
            raise ValueError(f"tensor {name}'s rows are not whole {tensor_type.name} blocks")
        # Python ints: a product of dimensions past 2**63 must not wrap to a small size.
        n_bytes = math.prod(dimensions) // block_size * type_size
        start = data_start + offset
        if start + n_bytes > len(buffer):
            raise ValueError(f"tensor {name} runs past the end of the file")
        if name in tensors:
            raise ValueError(f"tensor {name} is listed twice")
        tensors[name] = TensorInfo(name, tensor_type, tuple(reversed(dimensions)), start, n_bytes, path)
    return metadata, tensors


def _metadata(cursor: _Cursor, entry_count: int, step_over: frozenset[str]) -> dict[str, Any]:
    """The header's key-value entries; arrays under the keys in `step_over` stepped over."""
    metadata, stepped = {}, set()
    for _ in range(entry_count):
        key = cursor.string()
        if key in metadata or key in stepped:  # which value would hold is anyone's guess (llama.cpp refuses it too)
            raise ValueError(f"metadata key {shown(key)} is listed twice")
        value_type = cursor.take("<I")
        if value_type == ARRAY and key in step_over:
            cursor.step_over_array()
            stepped.add(key)
        else:
            metadata[key] = cursor.value(value_type)
    return metadata


def _tensor_entry(cursor: _Cursor) -> tuple[str, list[int], GGMLQuantizationType, int]:
    """One tensor's name, dimensions, type and offset from the header."""
    name = _tensor_name(cursor.string())
    dimension_count = cursor.take("<I")
    if dimension_count > MAX_DIMENSIONS:
        raise ValueError(f"tensor {name} has {dimension_count} dimensions")
    dimensions = [cursor.take("<Q") for _ in range(dimension_count)]
    type_number = cursor.take("<I")
    if type_number not in _TYPE_NUMBERS:
        raise ValueError(f"tensor {name} has unknown type {type_number}")
    return name, dimensions, GGMLQuantizationType(type_number), cursor.take("<Q")


def _tensor_name(name: str) -> str:
    """A tensor name fit to be shown in a one-line message."""
    if len(name) > MAX_TENSOR_NAME or not name.isprintable():
        raise ValueError(f"a tensor is named {shown(name)}")
    return name

