"""How each matrix is packed for the cpu: int4, int8, or not at all."""

from __future__ import annotations

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.stored import GROUP, StoredMatrix
from llama_chat.engine.device import DTYPES
from llama_chat.errors import LlamaChatError
from llama_chat.kernels.packed import int4_layout, int8_kernels_available

QUANTIZE_MODES = ("auto", "none", "int8", "int4")  # the choices of --quantize

# GGUF types whose values fit int4 groups of 32 exactly, when a converted checkpoint says
# its float weights came from one of them (it says so for the whole file, so only weights
# still stored as floats take the hint).
FOUR_BIT_SOURCES = ("Q4_0", "Q4_1", "Q4_K")


def packs(quantize: str, device: torch.device, dtype: str | None) -> bool:
    """Whether the weights are packed: on the cpu, unless asked not to. `auto` with an explicit
    float32 or float16 asks for the exact, unpacked model."""
    if quantize not in QUANTIZE_MODES:
        raise LlamaChatError(f"unknown quantisation {quantize!r}: use auto, none, int8 or int4")
    if quantize == "none":
        return False
    if device.type != "cpu":
        if quantize != "auto":
            raise LlamaChatError(f"--quantize {quantize} runs on the cpu only; on {device.type} use --quantize none")
        return False
    if not int8_kernels_available():
        if quantize != "auto":
            raise LlamaChatError("this PyTorch has no packed weight kernels; use --quantize none")
        return False
    name = (dtype or "auto").lower()
    return quantize != "auto" or name == "auto" or DTYPES.get(name) is torch.bfloat16


def fits_int4(source: StoredMatrix) -> bool:
    layout = int4_layout()
    rows, columns = source.shape
    return layout is not None and columns % GROUP == 0 and rows % layout.block == 0


def matrix_mode(source: StoredMatrix, quantize: str, source_quantization: str | None, name: str) -> str:
    """int4 for weights stored as 4-bit groups (or when asked), int8 otherwise."""
    if quantize == "int4":
        if not fits_int4(source):
            raise LlamaChatError(
                f"{name} ({source.shape[0]} x {source.shape[1]}) does not split into this CPU's int4 blocks; "
                "use --quantize int8"
            )
        return "int4"
    if quantize == "int8":
        return "int8"
    four_bit = source.four_bit or (source.float_storage and source_quantization in FOUR_BIT_SOURCES)
    return "int4" if four_bit and fits_int4(source) else "int8"


def layer_matrix_modes(checkpoint: Checkpoint, quantize: str) -> dict[str, str]:
    """How each of the layers' matrices will be packed, by name (nothing is read)."""
    return {
        name: matrix_mode(weight, quantize, checkpoint.source_quantization, name)
        for name, weight in checkpoint.tensors.items()
        if isinstance(weight, StoredMatrix) and name not in ("tok_embeddings.weight", "output.weight")
    }


def describe_packing(modes: dict[str, str]) -> str:
    """'int4', 'int8', or 'int4 and int8' by what the layers' matrices are packed as."""
    return " and ".join(sorted(set(modes.values()))) or "none"
