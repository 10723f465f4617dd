"""PyTorch's packed int8/int4 kernels as a weight back-end (packed.py holds the modules,
cpu_paths.py measures the dtypes and the row limit this back-end runs with)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.stored import StoredMatrix
from llama_chat.engine.model import Transformer
from llama_chat.kernels.backend import PackedBackend, Progress, Source
from llama_chat.kernels.packed import Int8Table, PackedEmbedding, PackedHead, PackedLinear, Scratch
from llama_chat.kernels.packed_build import build_packed_transformer
from llama_chat.kernels.quantize import Mode, layer_matrix_modes, matrix_mode
from llama_chat.kernels.weights_record import dtype_name


@dataclass(frozen=True)
class PyTorchKernels(PackedBackend):
    matmul_dtype: torch.dtype  # prompt steps' products of dequantised weights
    kernel_dtype: torch.dtype
    kernel_rows: int  # steps of up to this many tokens use the packed kernels
    reason: str  # how each was chosen, for people

    @staticmethod
    def plan(checkpoint: Checkpoint, quantize: str) -> dict[str, Mode]:
        """int4 or int8 for each matrix (quantize.matrix_mode)."""
        return layer_matrix_modes(checkpoint, quantize, matrix_mode)

    def build(
        self, checkpoint: Checkpoint, modes: dict[str, Mode], source: Source, progress: Progress
    ) -> tuple[Transformer, str]:
        """Packed in memory at each load (the packed cache keeps only llama-chat's kernels' packing)."""
        return build_packed_transformer(checkpoint, self, modes, progress), ""

    def pack_matrix(self, source: StoredMatrix, mode: Mode, scratch: Scratch, *, read: bool = True) -> nn.Module:
        # Packed even with read=False: the kernel's packing is what lays the matrix out.
        return PackedLinear(source, mode, scratch, self.kernel_dtype, self.kernel_rows, self.matmul_dtype)

    def pack_table(self, table: StoredMatrix, scratch: Scratch, *, read: bool = True) -> nn.Module:
        return Int8Table(table, scratch, read=read)

    def embedding(self, table: nn.Module) -> nn.Module:
        return PackedEmbedding(table, torch.float32)

    def head(self, table: nn.Module) -> nn.Module:
        return PackedHead(table)

    def arithmetic(self) -> str:
        """"bfloat16 products and kernels, kernels up to 32 tokens a step" and the like."""
        if self.matmul_dtype == self.kernel_dtype:
            dtypes = f"{dtype_name(self.matmul_dtype)} products and kernels"
        else:
            dtypes = f"{dtype_name(self.matmul_dtype)} products, {dtype_name(self.kernel_dtype)} kernels"
        return f"{dtypes}, kernels up to {self.kernel_rows} tokens a step"
