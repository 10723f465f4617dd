"""A .safetensors file read with plain file reads, a tensor's rows at a time.

The header (see safetensors_header) is checked whole when the file is opened. Reading
rows by file reads instead of through a memory map keeps the file's pages out of the
process's resident memory, so loading a large model costs only what it keeps.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from llama_chat.checkpoints.safetensors_header import read_safetensors_file_header
from llama_chat.checkpoints.stored import read_range
from llama_chat.errors import LlamaChatError

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class SafetensorsFile:
    """The tensors of one file: names, shapes and dtypes from its header; data on request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            header = read_safetensors_file_header(path)
        except OSError as error:
            raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error})") from None
        except ValueError as error:
            raise LlamaChatError(f"{path}: not a readable safetensors file ({error})") from None
        self._data_start = header.data_start
        self._entries = header.tensors

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def nbytes(self, name: str) -> int:
        entry = self._entries[name]
        return entry.end - entry.begin

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def dtype_name(self, name: str) -> str:
        return self._entries[name].dtype

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows [start, stop) of a float tensor (the whole of a 1-D one), read from the file."""
        shape = self.shape(name)
        dtype = DTYPES[self.dtype_name(name)]
        stop = shape[0] if stop is None else stop
        row_bytes = math.prod(shape[1:]) * torch.empty(0, dtype=dtype).element_size()
        offset = self._data_start + self._entries[name].begin + start * row_bytes
        data = read_range(self.path, offset, (stop - start) * row_bytes)
        return torch.frombuffer(data, dtype=dtype).view(stop - start, *shape[1:])
