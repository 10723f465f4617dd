"""llama-chat's own kernels over GGUF blocks as a weight back-end (block_linear.py holds the
modules, native.py the library, cpu_paths.py the choice of its variant)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.stored import GROUP, StoredMatrix
from llama_chat.engine.model import Transformer
from llama_chat.kernels import native
from llama_chat.kernels.backend import PackedBackend, Progress, Source
from llama_chat.kernels.block_linear import BLOCK_TYPES, BlockEmbedding, BlockLinear, StackedBlockLinear
from llama_chat.kernels.cache_attention import CACHE_DTYPE, use_cache_attention
from llama_chat.kernels.packed import Int8Table, PackedEmbedding, PackedHead, PackedLinear, Scratch
from llama_chat.kernels.packed_cache_load import packed_from_cache
from llama_chat.kernels.quantize import Mode, block_mode, layer_matrix_modes


def table_block_type(table: StoredMatrix) -> str | None:
    """The block type an embedding or output head keeps for our kernels: the file's own
    where they read it, else Q8_0 (1.06 bytes a weight); None where the width is not whole
    blocks."""
    if table.block_type in BLOCK_TYPES:
        return table.block_type
    return "Q8_0" if table.shape[1] % GROUP == 0 else None


@dataclass(frozen=True)
class BlockKernels(PackedBackend):
    variant: str
    activation_bits: int  # of several tokens' activations: 16 or 8
    reason: str

    @property
    def variant_number(self) -> int:
        return native.variant_number(self.variant)

    @staticmethod
    def plan(checkpoint: Checkpoint, quantize: str) -> dict[str, Mode]:
        """A GGUF block type (or one for each stacked part) for each matrix (quantize.block_mode)."""
        return layer_matrix_modes(checkpoint, quantize, block_mode)

    def build(
        self, checkpoint: Checkpoint, modes: dict[str, Mode], source: Source, progress: Progress
    ) -> tuple[Transformer, str]:
        """Mapped from the packed cache (packed into it on a first load), every layer
        attending over its KV cache with the kernels too."""
        transformer, note = packed_from_cache(checkpoint, self, modes, source, progress)
        use_cache_attention(transformer, self.variant_number)
        return transformer, note

    def kv_cache_dtype(self) -> torch.dtype | None:
        return CACHE_DTYPE  # the kernels attend over the cache, which they read at half width

    def pack_matrix(self, source: StoredMatrix, mode: Mode, scratch: Scratch, *, read: bool = True) -> nn.Module:
        if isinstance(mode, tuple):
            return StackedBlockLinear(source, self.variant_number, self.activation_bits, read=read)
        if mode in BLOCK_TYPES:
            return BlockLinear(source, mode, self.variant_number, self.activation_bits, read=read)
        # Widths that are not whole groups of 32: PyTorch's int8 rows, float32 in and out as
        # the kernels around them take it, packed at layout.
        return PackedLinear(source, mode, scratch, torch.float32, 1, torch.float32)

    def pack_table(self, table: StoredMatrix, scratch: Scratch, *, read: bool = True) -> nn.Module:
        """Held as the file's blocks (read by the kernels, no wider than the file; a tied
        table is both), else as int8 groups for PyTorch's."""
        block_type = table_block_type(table)
        if block_type is None:
            return Int8Table(table, scratch, read=read)
        return BlockLinear(table, block_type, self.variant_number, 16, read=read)

    def embedding(self, table: nn.Module) -> nn.Module:
        return BlockEmbedding(table) if isinstance(table, BlockLinear) else PackedEmbedding(table, torch.float32)

    def head(self, table: nn.Module) -> nn.Module:
        return table if isinstance(table, BlockLinear) else PackedHead(table)

    def arithmetic(self) -> str:
        return f"llama-chat's {self.variant} kernels, {self.activation_bits}-bit prompt steps"
