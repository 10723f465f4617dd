"""A .safetensors file read with plain file reads, a tensor's rows at a time.

The format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the data. Reading rows by file reads
instead of through a memory map keeps the file's pages out of the process's
resident memory, so loading a large model costs only what it keeps.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

from llama_chat.checkpoints.stored import read_range
from llama_chat.errors import LlamaChatError

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
MAX_HEADER_BYTES = 100 * 2**20


class SafetensorsFile:
    """The tensors of one file: names, shapes and dtypes from its header; data on request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as file:
                (length,) = struct.unpack("<Q", file.read(8))
                if length > MAX_HEADER_BYTES:
                    raise ValueError(f"a header of {length} bytes")
                header = json.loads(file.read(length))
            size = path.stat().st_size
        except (struct.error, ValueError, UnicodeDecodeError) as error:
            raise LlamaChatError(f"{path}: not a readable safetensors file ({error})") from None
        if not isinstance(header, dict):
            raise LlamaChatError(f"{path}: not a readable safetensors file (its header is not an object)")
        header.pop("__metadata__", None)
        self._data_start = 8 + length
        self._entries = header
        for name, entry in header.items():
            try:
                begin, end = (int(x) for x in entry["data_offsets"])
                shape = [int(x) for x in entry["shape"]]
                dtype = str(entry["dtype"])
            except (KeyError, TypeError, ValueError):
                raise LlamaChatError(f"{path}: not a readable safetensors file (bad entry {name!r})") from None
            itemsize = torch.empty(0, dtype=DTYPES[dtype]).element_size() if dtype in DTYPES else None
            if self._data_start + end > size or (itemsize and end - begin != math.prod(shape) * itemsize):
                raise LlamaChatError(f"{path}: the safetensors file is truncated or corrupt (tensor {name!r})")

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def nbytes(self, name: str) -> int:
        begin, end = self._entries[name]["data_offsets"]
        return int(end) - int(begin)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def dtype_name(self, name: str) -> str:
        return self._entries[name]["dtype"]

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows [start, stop) of a float tensor (the whole of a 1-D one), read from the file."""
        shape = self.shape(name)
        dtype = DTYPES[self.dtype_name(name)]
        stop = shape[0] if stop is None else stop
        row_bytes = math.prod(shape[1:]) * torch.empty(0, dtype=dtype).element_size()
        offset = self._data_start + self._entries[name]["data_offsets"][0] + start * row_bytes
        data = read_range(self.path, offset, (stop - start) * row_bytes)
        return torch.frombuffer(data, dtype=dtype).view(stop - start, *shape[1:])
