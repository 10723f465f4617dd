"""Weight-only quantisation for CPU decoding, through PyTorch's packed-weight kernels.

Decoding one token reads every weight once, so its speed is bounded by bytes of weights:
4-bit weights are read about 8 times faster than float32 ones. Prefill is the opposite:
many tokens per weight, bound by matrix throughput, which bfloat16 (AMX on recent x86)
delivers and the packed kernels do not. A QuantizedLinear therefore keeps its weight
twice: packed (int4 in groups of 32 along the input, or int8 per output row) for
single-token steps, and as a bfloat16 matrix for multi-token steps.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .errors import LlamaChatError

MODES = ("none", "int8", "int4")
INT4_GROUP = 32  # as in GGUF's Q4_0/Q4_1 blocks, so those weights repack exactly


def int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int8_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def bfloat16_at_least(values: torch.Tensor) -> torch.Tensor:
    """The nearest bfloat16 not below each float32 value."""
    rounded = values.to(torch.bfloat16)
    too_small = rounded.float() < values
    return torch.where(too_small, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)


class QuantizedLinear(nn.Module):
    """y = x W^T with W packed to `mode` for single tokens, and kept in bfloat16 for more."""

    def __init__(self, weight: torch.Tensor, mode: str, keep_dense: bool = True) -> None:
        super().__init__()
        self.mode = mode
        self.out_features, self.in_features = weight.shape
        if mode == "int4":
            self._pack_int4(weight.float())
        elif mode == "int8":
            self._pack_int8(weight)
        else:
            raise ValueError(f"unknown quantisation {mode!r}")
        # A bfloat16 weight is kept as it is, not copied.
        self.dense = weight.to(torch.bfloat16) if keep_dense else None

    def _pack_int4(self, weight: torch.Tensor) -> None:
        # Asymmetric groups: w = (q - 8) * scale + zero, with q in 0..15 per group of 32.
        groups = weight.view(self.out_features, -1, INT4_GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp_min(1e-12)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.view(self.out_features, -1), 1)
        zero = low + 8 * scale
        self.scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(torch.bfloat16)

    def _pack_int8(self, weight: torch.Tensor) -> None:
        # Symmetric, one scale per output row; a few thousand rows at a time, so that the
        # float32 temporaries of a large output head stay small.
        self.packed = torch.empty(weight.shape, dtype=torch.int8)
        self.scales = torch.empty(self.out_features, dtype=torch.bfloat16)
        for start in range(0, self.out_features, 4096):
            rows = weight[start : start + 4096].float()
            scale = bfloat16_at_least((rows.abs().amax(dim=1) / 127).clamp_min(1e-12))
            # Rounded against the bfloat16 scale the kernel multiplies by, so each weight
            # is within half a step of what it was, and the largest one is not clamped.
            self.packed[start : start + 4096] = torch.round(rows / scale.float()[:, None]).clamp_(-127, 127)
            self.scales[start : start + 4096] = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.numel() != x.shape[-1]:
            return F.linear(x, self.dense)
        flat = x.reshape(-1, self.in_features)
        if self.mode == "int4":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, INT4_GROUP, self.scales_and_zeros)
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.packed, self.scales)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.mode}, dense copy: {self.dense is not None}"


def check_quantization(mode: str, device: torch.device, in_features: int) -> None:
    if mode not in MODES:
        raise LlamaChatError(f"unknown quantisation {mode!r}: use none, int8 or int4")
    if mode == "none":
        return
    if device.type != "cpu":
        raise LlamaChatError(f"--quantize {mode} runs on the cpu only; on {device.type} use --quantize none")
    available = int4_available() if mode == "int4" else int8_available()
    if not available:
        raise LlamaChatError(f"this PyTorch has no {mode} weight kernels; use --quantize none")
    if mode == "int4" and in_features % INT4_GROUP:
        raise LlamaChatError(f"int4 needs layer widths divisible by {INT4_GROUP}; use --quantize int8")


def quantize_transformer(transformer: nn.Module, mode: str) -> None:
    """Replace every projection and the output head by QuantizedLinear, in place.

    The output head is never packed below int8: its errors go straight into the logits
    (llama.cpp's 4-bit mixes keep it at 6 or 8 bits too). It gets no dense copy, since
    generation only ever asks it for one position.
    """
    for block in transformer.layers:
        for owner, name in ((block.attention, "wqkv"), (block.attention, "wo"),
                            (block.feed_forward, "w13"), (block.feed_forward, "w2")):
            setattr(owner, name, QuantizedLinear(getattr(owner, name).weight.detach(), mode))
        return_freed_memory()
    transformer.output = QuantizedLinear(transformer.output.weight.detach(), "int8", keep_dense=False)
    return_freed_memory()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


def return_freed_memory() -> None:
    """Give the memory freed by packing back to the system.

    glibc's malloc keeps freed blocks of up to 32 MB for reuse, so the float32 and int32
    temporaries of packing one matrix after another stay resident, used by nothing: for
    the default model, trimming after each block lowers the peak from 930-990 MB to
    780-810 MB (three loads each).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# GGUF types of at most 4 bits a weight: their values fit int4 groups of 32 with no loss
# worth measuring (Q4_0 and Q4_1 exactly; K-quants' sub-blocks are 32 wide too).
FOUR_BIT_SOURCES = ("Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS")


def choose_quantization(
    requested: str, device: torch.device, source_quantization: str | None, in_features: int | None = None
) -> str:
    """The packing to run with: `auto` means int4 for 4-bit sources and int8 otherwise on
    the cpu (the two agree with float32 on most greedy tokens), none elsewhere; int8 too
    when a layer's input width (`in_features`, if known) does not split into int4 groups."""
    if requested != "auto":
        return requested
    if device.type != "cpu" or not (int4_available() and int8_available()):
        return "none"
    fits_int4 = in_features is None or in_features % INT4_GROUP == 0
    return "int4" if source_quantization in FOUR_BIT_SOURCES and fits_int4 else "int8"
