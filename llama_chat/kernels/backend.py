"""What a CPU weight back-end is: how a packed model's matrices are held and multiplied.

Two back-ends pack the weights on the cpu, as they are read:
- PyTorch's packed int8/int4 kernels (pytorch_backend.PyTorchKernels), with prompt steps
  multiplying dequantised copies in the dtype measured fastest;
- llama-chat's own kernels over GGUF blocks (block_backend.BlockKernels), where the
  kernel library is built.
Each plans (which packing each of the layers' matrices gets), packs a matrix or the
embedding and head table into modules, and describes itself in words for people.
cpu_paths.choose_backend picks one; loading.py builds the model with it. Dense weights
(--quantize none, or a device other than the cpu) are not a back-end: loading's
build_transformer converts them, with nothing to plan, pack or describe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.stored import StoredMatrix
from llama_chat.kernels.packed import Scratch
from llama_chat.kernels.quantize import describe_packing


class WeightBackend(ABC):
    reason: str  # how it was chosen, for people
    # Whether its packing is kept in the packed cache (packed_cache.py) and mapped on later
    # loads, or packed in memory at each load.
    keeps_packed_cache: ClassVar[bool]
    cache_dtype: ClassVar[torch.dtype | None] = None  # the KV cache's dtype it asks for (None: the model's)

    @staticmethod
    @abstractmethod
    def plan(checkpoint: Checkpoint, quantize: str) -> dict[str, str]:
        """How each of the layers' matrices will be packed, by name (nothing is read)."""

    @abstractmethod
    def pack_matrix(self, source: StoredMatrix, mode: str, scratch: Scratch, *, read: bool = True) -> nn.Module:
        """A layer's matrix packed as `mode` says; read=False: only the shapes, on the meta
        device, where the packing allows (the packed cache or a fill gives them memory)."""

    @abstractmethod
    def pack_table(self, table: StoredMatrix, scratch: Scratch, *, read: bool = True) -> nn.Module:
        """The embedding or output head table (a tied model's both), read=False as above."""

    @abstractmethod
    def embedding(self, table: nn.Module) -> nn.Module:
        """The token embedding that looks rows up in a packed table."""

    @abstractmethod
    def head(self, table: nn.Module) -> nn.Module:
        """The output head that multiplies by a packed table."""

    @abstractmethod
    def arithmetic(self) -> str:
        """What the numbers computed depend on (a saved KV cache is only good for the same)."""

    def describe(self) -> str:
        """The arithmetic, then how it was chosen: "...; measured here: ..." and the like."""
        return f"{self.arithmetic()}; {self.reason}"

    def quantization(self, modes: dict[str, str]) -> str:
        """'int4', 'Q4_K and Q6_K' and the like: what the layers' matrices are packed as."""
        return describe_packing(modes)

    def prepare(self, transformer: nn.Module) -> None:
        """Whatever the packed model needs besides its weights (nothing, unless said)."""
