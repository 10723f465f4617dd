"""How each matrix is packed for the cpu: int4, int8, or not at all."""

from __future__ import annotations

from collections.abc import Callable

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.stored import GROUP, StackedRows, StoredMatrix
from llama_chat.options import DTYPES
from llama_chat.errors import LlamaChatError
from llama_chat.kernels.packed import int4_layout, int8_kernels_available

QUANTIZE_MODES = ("auto", "none", "int8", "int4")  # the choices of --quantize
# How a matrix is packed: "int4", "int8" or a GGUF block type; stacked parts held each in
# its own block type, one for each part: ("Q4_K", "Q4_K", "Q6_K").
Mode = str | tuple[str, ...]

# GGUF types whose values fit int4 groups of 32 exactly, when a converted checkpoint says
# its float weights came from one of them (it says so for the whole file, so only weights
# still stored as floats take the hint).
FOUR_BIT_SOURCES = ("Q4_0", "Q4_1", "Q4_K")


def refuse_unpackable(quantize: str, device: torch.device) -> None:
    """Refuse a --quantize that is unknown, or that asks for packing where none runs (the
    loader asks before it reads anything)."""
    if quantize not in QUANTIZE_MODES:
        raise LlamaChatError(f"unknown quantisation {quantize!r}: use auto, none, int8 or int4")
    if quantize in ("auto", "none"):
        return
    if device.type != "cpu":
        raise LlamaChatError(f"--quantize {quantize} runs on the cpu only; on {device.type} use --quantize none")
    if not int8_kernels_available():
        raise LlamaChatError("this PyTorch has no packed weight kernels; use --quantize none")


def packs(quantize: str, device: torch.device, dtype: str | None) -> bool:
    """Whether the weights are packed: on the cpu, unless asked not to. `auto` with an explicit
    float32 or float16 asks for the exact, unpacked model."""
    refuse_unpackable(quantize, device)
    if quantize == "none" or device.type != "cpu" or not int8_kernels_available():
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


def block_mode(source: StoredMatrix, quantize: str, source_quantization: str | None, name: str) -> Mode:
    """The GGUF block type llama-chat's kernels hold a matrix in: the file's own where they
    read it (and it fits what was asked; stacked parts of different types each their own,
    one for each part), else Q4_1 for 4-bit and Q8_0 for 8-bit; "int8" (PyTorch's int8 rows)
    for widths that are not whole groups of 32."""
    stored = source.block_type
    if source.shape[1] % GROUP:
        if quantize == "int4":
            raise LlamaChatError(f"{name} ({source.shape[1]} columns) does not split into groups of 32; use --quantize int8")
        return "int8"
    if quantize == "int4":
        return stored if stored in FOUR_BIT_SOURCES else "Q4_1"
    if quantize == "int8":
        return "Q8_0"
    if isinstance(source, StackedRows) and stored is None and all(part.block_type for part in source.parts):
        return tuple(part.block_type for part in source.parts)  # each part as its file holds it
    return held_as(stored, source.float_storage, source_quantization)


def held_as(block_type: str | None, float_storage: bool, source_quantization: str | None) -> str:
    """The block type our kernels hold a matrix in by default: the file's own where they read
    it (block_type), float weights as Q4_1 where the checkpoint came from 4-bit blocks, the
    rest (floats, types the kernels do not read: Q2_K, Q3_K, the IQ types) as Q8_0."""
    if block_type is not None:
        return block_type
    return "Q4_1" if float_storage and source_quantization in FOUR_BIT_SOURCES else "Q8_0"


def layer_matrix_modes(
    checkpoint: Checkpoint, quantize: str, choose: Callable[[StoredMatrix, str, str | None, str], Mode]
) -> dict[str, Mode]:
    """How each of the layers' matrices will be packed, by name (nothing is read), as
    `choose` says: matrix_mode for PyTorch's kernels (int4, int8), block_mode for llama-chat's."""
    return {
        name: choose(weight, quantize, checkpoint.source_quantization, name)
        for name, weight in checkpoint.tensors.items()
        if isinstance(weight, StoredMatrix) and name not in ("tok_embeddings.weight", "output.weight")
    }


def block_types(modes: dict[str, Mode]) -> tuple[str, ...]:
    """What the layers' matrices are packed as, each kind once, sorted: ("Q4_K", "Q6_K")."""
    kinds = {kind for mode in modes.values() for kind in ((mode,) if isinstance(mode, str) else mode)}
    return tuple(sorted(kinds))
