"""How a loaded model's weights run, as one typed record: what the loader makes, and what
/info, /device, a saved KV cache's identity and the benchmarks read. The words people see
are made from it here, and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WeightsRecord:
    packed: bool = False  # packed for the cpu by a back-end, or dense in the model's dtype
    block_types: tuple[str, ...] = ()  # what the layers' matrices are packed as, sorted: ("Q4_K", "Q6_K")
    arithmetic: str = ""  # what packed weights' numbers depend on (a saved KV cache is only good for the same)
    note: str = ""  # which cpu paths run and why, and what became of the packed cache

    @property
    def packing(self) -> str:
        """'int4', 'int4 and int8', 'Q4_K and Q6_K'; 'none' for dense weights."""
        return " and ".join(self.block_types) or "none"

    def brief(self, dtype: torch.dtype) -> str:
        """The weights in a word or two: their packing, or dense ones' dtype ("float32")."""
        return self.packing if self.packed else dtype_name(dtype)

    def describe(self, dtype: torch.dtype) -> str:
        """The weights with the reasons: "float32", or "int4 weights, bfloat16 products ..."."""
        return f"{self.packing} weights, {self.note}" if self.packed else dtype_name(dtype)


DENSE = WeightsRecord()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
