"""What llama-chat's kernel library (csrc/) reports of itself: its variants and the layout
its weights are arranged in, read from the loaded library (`llama_chat::layout`) rather
than kept here as copies that could drift from the C++. Only code that runs where the
library is loaded asks for them; PyTorch's kernels need none of it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TypeLayout:
    """One GGUF block type as the kernels hold it: its block, a unit (one block of each of a
    tile's rows) and where its float16 fields lie."""

    block_weights: int
    block_bytes: int
    unit_columns: int
    unit_bytes: int
    halves_at: int  # where the float16 fields start in a file block
    halves: int  # how many there are (d; then m or dmin)


@dataclass(frozen=True)
class LibraryLayout:
    variants: tuple[str, ...]  # in the library's numbering
    tile_rows: int  # rows a tile holds
    types: dict[int, TypeLayout]  # by ggml type number


@functools.cache  # asked once the library is loaded: it is what it is for the process
def library_layout() -> LibraryLayout:
    reported = json.loads(torch.ops.llama_chat.layout())
    return LibraryLayout(
        variants=tuple(reported["variants"]),
        tile_rows=reported["tile_rows"],
        types={int(number): TypeLayout(**fields) for number, fields in reported["types"].items()},
    )
