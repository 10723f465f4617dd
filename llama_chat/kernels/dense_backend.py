"""Dense weights as a weight back-end: each tensor converted to the model's dtype and moved
to the device as it is read (--quantize none, a device other than the cpu, or an explicit
float32 or float16 with auto)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.stored import StoredMatrix
from llama_chat.engine.model import Transformer
from llama_chat.errors import LlamaChatError
from llama_chat.kernels.backend import Progress, Source, WeightBackend
from llama_chat.kernels.quantize import Mode
from llama_chat.kernels.weights_record import DENSE, WeightsRecord


@dataclass(frozen=True)
class DenseWeights(WeightBackend):
    device: torch.device
    dtype: torch.dtype

    @staticmethod
    def plan(checkpoint: Checkpoint, quantize: str) -> dict[str, Mode]:
        return {}  # nothing is packed

    def build(
        self, checkpoint: Checkpoint, modes: dict[str, Mode], source: Source, progress: Progress
    ) -> tuple[Transformer, str]:
        return build_transformer(checkpoint, self.device, self.dtype, progress), ""

    def record(self, modes: dict[str, Mode], note: str) -> WeightsRecord:
        return DENSE


def build_transformer(
    checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, progress: Progress
) -> Transformer:
    """The Transformer with the checkpoint's weights as dense `dtype` tensors on `device`,
    converted one tensor at a time."""
    with torch.device("meta"):
        transformer = Transformer(checkpoint.args)
    converted: dict[int, torch.Tensor] = {}  # by source, so a tied head is converted once
    state = {}
    for name, weight in checkpoint.tensors.items():
        if id(weight) not in converted:
            with progress.item(name, weight):
                value = weight.dense() if isinstance(weight, StoredMatrix) else weight
                converted[id(weight)] = value.to(device=device, dtype=dtype)
        state[name] = converted[id(weight)]
    try:
        transformer.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        # The first line only names the module; the second says which tensors are wrong.
        detail = (str(error).strip().splitlines() + [""])[1].strip()[:300]
        raise LlamaChatError(f"the checkpoint's tensors do not fit the model: {detail}") from None
    if checkpoint.args.tie_embeddings:
        transformer.output.weight = transformer.tok_embeddings.weight
    return transformer.to(device)  # the weights are there already; this moves the rotary tables
