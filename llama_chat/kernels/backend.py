"""What a weight back-end is: how a model's matrices are held and multiplied, from the
checkpoint read to the model that runs.

Three back-ends, behind this one interface:
- dense weights in the model's dtype on any device (dense_backend.DenseWeights);
- PyTorch's packed int8/int4 kernels on the cpu (pytorch_backend.PyTorchKernels), with
  prompt steps multiplying dequantised copies in the dtype measured fastest;
- llama-chat's own kernels over GGUF blocks on the cpu (block_backend.BlockKernels), where
  the kernel library is built.
Each plans (which packing each of the layers' matrices gets), builds the model (packing as
it reads, through the packed cache where it keeps one, with whatever attention it runs),
says which KV cache dtype it wants, and records how the weights run. cpu_paths.choose_backend
is the one place a back-end is chosen; loading.py calls only what is declared here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from llama_chat.checkpoints.contents import Checkpoint, Weight
from llama_chat.checkpoints.stored import StoredMatrix
from llama_chat.engine.model import Transformer
from llama_chat.kernels.packed import Scratch
from llama_chat.kernels.quantize import Mode, block_types
from llama_chat.kernels.weights_record import WeightsRecord
from llama_chat.parallel.sharding import Shard


class Progress(Protocol):
    """What a load reports: each weight as it is read and converted, then the end."""

    def item(self, what: str, weight: Weight) -> AbstractContextManager[None]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Source:
    """Where the weights come from, as far as keeping their packing between loads goes."""

    path: Path  # the model file or folder
    shard: Shard | None = None  # this tensor-parallel rank's share, if any
    cache_bound_gb: float | None = None  # what the packed cache is pruned to (LLAMA_CHAT_PACKED_CACHE_GB)


class WeightBackend(ABC):
    @staticmethod
    @abstractmethod
    def plan(checkpoint: Checkpoint, quantize: str) -> dict[str, Mode]:
        """How each of the layers' matrices will be packed, by name (nothing is read)."""

    @abstractmethod
    def build(
        self, checkpoint: Checkpoint, modes: dict[str, Mode], source: Source, progress: Progress
    ) -> tuple[Transformer, str]:
        """The model with its weights in place, ready to run; and a note for people on what
        became of its packed cache ("" where nothing is worth saying)."""

    @abstractmethod
    def record(self, modes: dict[str, Mode], note: str) -> WeightsRecord:
        """How the weights run, with build's note."""

    def kv_cache_dtype(self) -> torch.dtype | None:
        """The KV cache's dtype this back-end asks for where --kv-dtype is auto (None: the model's)."""
        return None


class PackedBackend(WeightBackend):
    """A back-end that packs the weights on the cpu as they are read."""

    reason: str  # how it was chosen, for people

    @abstractmethod
    def pack_matrix(self, source: StoredMatrix, mode: Mode, scratch: Scratch, *, read: bool = True) -> nn.Module:
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

    def record(self, modes: dict[str, Mode], note: str) -> WeightsRecord:
        words = self.describe() + (f"; {note}" if note else "")
        return WeightsRecord(packed=True, block_types=block_types(modes), arithmetic=self.arithmetic(), note=words)
