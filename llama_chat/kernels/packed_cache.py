"""A model's packed weights kept on disk, mapped read-only on later loads.

The first load of a file on llama-chat's kernels packs its matrices (tiles,
int8 tables) into private memory laid out as a new safetensors file of the cache
(EntryImage); the model answers from it while the file is written behind the chat (made
whole before it is renamed into place, packed_cache_writer.py) and then mapped over it.
Later loads map that file instead of packing: a start costs what mapping costs, the pages
are the system's page cache (shared by every process using the model, kept between
runs), and no process holds a private copy.

An entry is found by what it was packed from and how: the source files' identity (size,
modification time, a hash of the first MiB and of 16 pieces spread over the file), the
packing code, the modes and kernel variant chosen, the tensor-parallel rank and this
CPU's capability. A changed source gets a new entry; an entry that does not read back (a
truncated or hand-edited file) is removed and packed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import torch

from llama_chat import disk_cache
from llama_chat.checkpoints.gguf_split import named_parts
from llama_chat.checkpoints.safetensors_header import SafetensorsHeader, read_safetensors_header
from llama_chat.errors import CorruptFileError
from llama_chat.kernels.packed_cache_entries import record_use
from llama_chat.process_memory import map_file_over, populate, private_pages
from llama_chat.untrusted_files import open_regular_file, parse_json, shown

# Code whose output the cache holds (paths inside llama_chat/): a change to any of it
# packs anew.
PACKING_SOURCES = ("kernels/block_linear.py", "kernels/block_backend.py", "kernels/csrc/arrange.cpp",
                   "kernels/csrc/blocks.h", "kernels/csrc/kernels.h", "kernels/packed.py", "kernels/quantize.py",
                   "kernels/packed_build.py", "checkpoints/stored.py", "checkpoints/gguf_blocks.py",
                   "kernels/packed_cache.py")
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32,
          "I8": torch.int8, "U8": torch.uint8, "I64": torch.int64}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def source_identity(source: Path) -> list:
    """The identity of a model file (with every later part of a split GGUF model, so that
    replacing any part packs anew), or of every file in a model folder."""
    files = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else named_parts(source)
    return [disk_cache.file_identity(p) for p in files]


def packed_entry(source: Path, settings: dict) -> Path | None:
    """Where the packed weights of `source` (a file or a folder) packed as `settings` say
    are kept; None when the cache is off."""
    folder = disk_cache.entry_path("packed")
    if folder is None:
        return None
    spec = {
        "source": source_identity(source),
        "code": disk_cache.code_digests(PACKING_SOURCES),
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "settings": settings,
    }
    return folder / f"{disk_cache.cache_key(spec)}.safetensors"


# The data starts at a multiple of this, so every tensor (largest items first) starts at a
# multiple of its item size.
DATA_ALIGNMENT = 64


class EntryImage:
    """A new entry's bytes in this process's private memory, laid out exactly as its file
    (header, then every tensor at its offset): packing fills `views` in place, the model
    runs on them at once, and `write` copies the image to the cache in one sequential pass
    (in the background, packed_cache_writer.py) and then maps the written file over the
    image, so the process ends up holding what a later load maps.

    `layout` names, shapes and types the tensors (meta tensors will do); one tensor object
    under several names, a tied table, is held once, the other names aliases in the
    metadata. `source` is the model file's name, which `llama-chat cache` shows."""

    def __init__(self, layout: dict[str, torch.Tensor], source: str) -> None:
        first_name: dict[int, str] = {}
        aliases: dict[str, str] = {}
        for name, tensor in layout.items():
            if id(tensor) in first_name:
                aliases[name] = first_name[id(tensor)]
            else:
                first_name[id(tensor)] = name
        held = sorted(first_name.values(), key=lambda name: -layout[name].element_size())
        entries, offset = {}, 0
        for name in held:
            tensor = layout[name]
            size = tensor.numel() * tensor.element_size()
            entries[name] = {"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                             "data_offsets": [offset, offset + size]}
            offset += size
        digest = _digest({name: (entry["dtype"], entry["shape"]) for name, entry in entries.items()}, aliases)
        metadata = {"aliases": json.dumps(aliases), "layout": digest, "source": source}
        header = json.dumps({"__metadata__": metadata, **entries}).encode()
        header += b" " * (-(8 + len(header)) % DATA_ALIGNMENT)
        data_start = 8 + len(header)
        self.size = data_start + offset
        # Anonymous and private: the process's own pages, never a file's, until `write`.
        self._memory = private_pages(self.size)
        self.bytes = torch.frombuffer(self._memory, dtype=torch.uint8)
        self.bytes[:data_start].copy_(torch.frombuffer(bytearray(struct.pack("<Q", len(header)) + header),
                                                       dtype=torch.uint8))
        views = {}
        for name, entry in entries.items():
            begin, end = entry["data_offsets"]
            views[name] = self.bytes[data_start + begin : data_start + end].view(layout[name].dtype).view(entry["shape"])
        self.views = views | {name: views[target] for name, target in aliases.items()}
        self.mapped = False  # the written file's pages in place of the private ones

    def reserve(self, staging: Path) -> None:
        """Reserve the entry's space in `staging` (a full disk is then an OSError here, at
        load, rather than half-way through the write)."""
        with open(staging, "r+b") as handle:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(handle.fileno(), 0, self.size)
            else:  # no way to reserve the blocks here (macOS): a sparse file
                handle.truncate(self.size)

    def write(self, descriptor: int, stopping: Callable[[], bool] = lambda: False) -> None:
        """Copy the image into the open file `descriptor` (its space reserved), a piece at a
        time, in order; raises WriteStopped as soon as `stopping()` says so between pieces."""
        memory = memoryview(self._memory)
        try:
            offset = 0
            while offset < self.size:
                if stopping():
                    raise WriteStopped
                written = os.pwrite(descriptor, memory[offset : min(offset + WRITE_PIECE, self.size)], offset)
                if written <= 0:
                    raise OSError(f"the cache's file took no bytes at {offset} of {self.size}")
                offset += written
        finally:
            memory.release()

    def map_written(self, descriptor: int) -> None:
        """Put the pages of the entry written through `descriptor` in place of the image's
        private pages, at the same addresses (the bytes are the same, so the model, its
        compiled step and any thread reading the weights meanwhile see no change): the
        process's own memory falls by the entry's size, and the weights are the page
        cache's, shared with every process that maps the entry. Where the system cannot,
        the private pages stay."""
        if os.fstat(descriptor).st_size != self.size:
            return
        self.mapped = map_file_over(self.bytes.data_ptr(), self.size, descriptor)
        if self.mapped:
            populate(self.bytes.data_ptr(), self.size)


class WriteStopped(Exception):
    """A write stopped before its end (the process is ending, or was asked to)."""


# Written a piece at a time: a stop is seen within one piece's write, even at a slow disk's pace.
WRITE_PIECE = 64 << 20


def _digest(layout: dict[str, tuple[str, list[int]]], aliases: dict[str, str]) -> str:
    """A hash of each tensor's name, dtype and shape, and of the names that share them: a
    header edited by hand, its JSON still well-formed, would otherwise hand the model
    tensors of another dtype or shape, or leave a tied table out."""
    return hashlib.sha256(json.dumps([sorted(layout.items()), sorted(aliases.items())]).encode()).hexdigest()


def load_entry(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a file written by `writing`, as views of one read-only mapping of it
    (pages are read when used, and shared with every process mapping the file). Raises
    CorruptFileError (a ValueError) saying what is wrong when the file does not read back
    as written, OSError when it cannot be read."""
    header, aliases, size = _checked_header(path)
    record_use(path)
    # MAP_PRIVATE, never written: the pages stay the file's, counted as shared memory.
    mapped = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    populate(mapped.data_ptr(), size)  # every page is read by the first model call anyway
    state = {}
    for name, entry in header.tensors.items():
        dtype = DTYPES.get(entry.dtype)
        if dtype is None or (header.data_start + entry.begin) % dtype.itemsize:
            raise CorruptFileError(f"tensor {shown(name)} is not one packing writes")
        data = mapped[header.data_start + entry.begin : header.data_start + entry.end]
        state[name] = data.view(dtype).view(entry.shape)
    for name, target in aliases.items():
        state[name] = state[target]
    return state


def source_of(path: Path) -> str | None:
    """The name of the model file an entry was packed from ("" where the entry does not say);
    None for an entry that does not read back."""
    try:
        return _checked_header(path)[0].metadata.get("source", "")
    except (OSError, ValueError):
        return None


def _checked_header(path: Path) -> tuple[SafetensorsHeader, dict[str, str], int]:
    """An entry's header, its aliases and the file's size, all as `writing` wrote them."""
    try:
        with open_regular_file(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            header = read_safetensors_header(handle, size)
        aliases = parse_json(header.metadata.get("aliases", "{}"))
    except ValueError as error:
        raise CorruptFileError(str(error)) from None
    if not isinstance(aliases, dict) or not all(isinstance(t, str) and t in header.tensors for t in aliases.values()):
        raise CorruptFileError("its aliases name tensors it does not hold")
    layout = {name: (entry.dtype, list(entry.shape)) for name, entry in header.tensors.items()}
    if header.metadata.get("layout") != _digest(layout, aliases):
        raise CorruptFileError("its header is not the one it was written with")
    if header.data_start + max((entry.end for entry in header.tensors.values()), default=0) != size:
        raise CorruptFileError("it holds more bytes than its tensors")
    return header, aliases, size
