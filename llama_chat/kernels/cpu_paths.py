"""How a packed model multiplies on this CPU, decided from measurements, not assumed
(cpu_probe.py measures; this module chooses).

Activations, the KV cache and the logits stay float32 (bfloat16 activations were
measured to flip near-tied greedy tokens of the default model against float32); only
what goes into a matrix product is rounded to the dtype measured fastest for it. Three
choices matter, and CPUs differ on them by up to a hundred times:
- the matmul dtype of prompt steps' dequantised products (bfloat16 is several times
  faster than float32 with AMX or AVX-512-BF16 and tens of times slower where it is
  emulated, on AVX2);
- the kernel dtype: what the packed int4/int8 kernels take (the kernels of one PyTorch
  build can be a hundred times slower in one dtype than in the other);
- up to how many tokens a step runs the packed kernels rather than dequantising each
  weight and multiplying (a chat turn of 20 tokens is faster one way, a long prompt the other).
Where llama-chat's own kernels are loaded (native.py), the variant with the smaller sum of
times a token on the probe's steps runs, unless PyTorch's int4 kernel measured faster.
LLAMA_CHAT_KERNELS (ours or aten) and LLAMA_CHAT_KERNEL_VARIANT (portable, avx2,
avx512-vnni, avx512-amx) force the family and the variant; LLAMA_CHAT_DTYPE,
LLAMA_CHAT_KERNEL_DTYPE (or --dtype and --kernel-dtype) and LLAMA_CHAT_KERNEL_ROWS force the
rest, each arriving as a field of KernelOptions. choose_backend is where the back-end is
chosen, dense weights among them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.device import resolve_dtype
from llama_chat.engine.runners import PREFILL_CHUNK
from llama_chat.errors import DeviceError
from llama_chat.kernels import native, native_state
from llama_chat.kernels.backend import WeightBackend
from llama_chat.kernels.block_backend import BlockKernels
from llama_chat.kernels.cpu_probe import (
    CANDIDATES, PROBE_ROWS, STEP_ROWS, VARIANT_TIMES_ROWS, dtype_times, native_times, row_times,
)
from llama_chat.kernels.dense_backend import DenseWeights
from llama_chat.kernels.probe_times import Timing
from llama_chat.kernels.pytorch_backend import PyTorchKernels
from llama_chat.kernels.quantize import Mode, packs
from llama_chat.kernels.weights_record import dtype_name
from llama_chat.options import KernelFamily, KernelOptions


def forced_dtype(dtype: torch.dtype | None, what: str) -> torch.dtype | None:
    """A dtype the options force (None: auto), one PyTorch's packed kernels run."""
    if dtype is not None and dtype not in CANDIDATES:
        raise DeviceError(f"{what} {dtype_name(dtype)} is not one the packed cpu path runs: use auto, bfloat16 "
                          "or float32")
    return dtype


def kernel_rows(times: dict[Timing, float]) -> int:
    """The most rows a step may have for the packed kernel to beat dequantising and
    multiplying, from straight lines through each one's times at the two step sizes."""
    short, long = STEP_ROWS

    def line(kind: str) -> tuple[float, float]:
        slope = (times[Timing(kind, long)] - times[Timing(kind, short)]) / (long - short)
        return times[Timing(kind, short)] - slope * short, slope

    kernel_start, kernel_slope = line("kernel")
    dense_start, dense_slope = line("dequantise")
    if kernel_slope <= dense_slope:
        return PREFILL_CHUNK if kernel_start <= dense_start else 1
    crossing = (dense_start - kernel_start) / (kernel_slope - dense_slope)
    return int(min(PREFILL_CHUNK, max(1, round(crossing, 6))))


def _faster(times: dict[Timing, float], kind: str, rows: int) -> tuple[torch.dtype, str]:
    first, second = (times[Timing(kind, rows, d)] for d in CANDIDATES)
    winner, loser = CANDIDATES if first <= second else reversed(CANDIDATES)
    ratio = max(first, second) / max(min(first, second), 1e-12)
    return winner, f"{kind} {ratio:.1f}x faster in {dtype_name(winner)} than {dtype_name(loser)}"


def choose_native(args: ModelArgs, kernels: KernelOptions = KernelOptions()) -> tuple[str | None, str]:
    """The variant of llama-chat's kernels to run, or None for PyTorch's, and why; the build
    on disk is loaded first, or one started for later runs (native_state.load_or_build)."""
    family = kernels.family
    # Set, even empty, it forces: a name that is none is refused, not taken for auto.
    forced = kernels.variant
    state = native_state.load_or_build(kernels)
    if not state.loaded:
        # A forced variant asks for our kernels as LLAMA_CHAT_KERNELS=ours does (aten, asked for, wins).
        if family is KernelFamily.OURS or (forced is not None and family is KernelFamily.AUTO):
            asked = ("LLAMA_CHAT_KERNELS=ours" if family is KernelFamily.OURS
                     else f"LLAMA_CHAT_KERNEL_VARIANT={forced!r}")
            raise DeviceError(f"{asked}, but llama-chat's kernels are not in use: {state.detail}")
        return None, f"llama-chat's kernels: {state.detail}"
    # The names are the loaded library's: without it there are none to check against.
    if forced is not None and forced not in native.variant_names():
        raise DeviceError(f"LLAMA_CHAT_KERNEL_VARIANT={forced!r} names no kernel variant: use "
                          f"{', '.join(native.variant_names())}, or unset it")
    variants = native.runnable_variants()
    if forced is not None:
        if forced not in variants:
            raise DeviceError(f"LLAMA_CHAT_KERNEL_VARIANT={forced!r}: this CPU cannot run it; it runs "
                              f"{', '.join(variants)}")
        variants = [forced]
    elif len(variants) > 1:
        variants = variants[1:]  # the portable code is timed only where it is all there is (seconds a step)
    times = native_times(args, variants)

    def cost(path: str) -> float:  # each step by its time a token, weighed alike
        return sum(times[Timing(path, rows)] / rows for rows in VARIANT_TIMES_ROWS)

    best = min(variants, key=cost)
    single, step, prompt = (times[Timing("aten", rows)] / max(times[Timing(best, rows)], 1e-12)
                            for rows in VARIANT_TIMES_ROWS)
    how = "forced" if forced is not None else "measured fastest here"
    speeds = (f"a single token {single:.1f}x, a 16-token step {step:.1f}x and a 256-token prompt chunk {prompt:.1f}x "
              "PyTorch's kernels")
    if family is KernelFamily.OURS or cost(best) <= cost("aten"):
        return best, f"{best} {how}: {speeds}"
    return None, f"PyTorch's kernels: llama-chat's {best} ran {speeds}"


def native_paths(variant: str, reason: str, bits: int = 16) -> BlockKernels:
    """llama-chat's kernels in `variant` (they take float32 in and out); `bits` (16 or 8)
    sets how several tokens' activations are quantised."""
    return BlockKernels(variant, bits, reason)


def choose_cpu_paths(args: ModelArgs, mode: str, kernels: KernelOptions = KernelOptions()) -> PyTorchKernels:
    """The matmul and kernel dtypes, and the kernel's row limit, for a model packed for
    PyTorch's kernels with these shapes on this CPU (each measured unless `kernels` forces it)."""
    forced_matmul = forced_dtype(kernels.matmul_dtype, "dtype")
    forced_kernel = forced_dtype(kernels.kernel_dtype, "kernel dtype")
    forced_rows = kernels.kernel_rows
    if forced_matmul and forced_kernel and forced_rows:
        return PyTorchKernels(forced_matmul, forced_kernel, forced_rows, "forced")
    measured = dtype_times(args, mode)
    matmul_dtype, matmul_reason = (
        (forced_matmul, "matmul dtype forced") if forced_matmul else _faster(measured, "prompt steps", PROBE_ROWS)
    )
    kernel_dtype, kernel_reason = (
        (forced_kernel, "kernel dtype forced") if forced_kernel else _faster(measured, "kernels", 1)
    )
    if forced_rows:
        rows = forced_rows
    else:
        rows = kernel_rows(row_times(args, mode, matmul_dtype, kernel_dtype))
    return PyTorchKernels(matmul_dtype, kernel_dtype, rows, f"measured here: {matmul_reason}, {kernel_reason}")


def choose_backend(
    checkpoint: Checkpoint, quantize: str, device: torch.device, dtype: str | None,
    kernels: KernelOptions = KernelOptions(),
) -> tuple[WeightBackend, dict[str, Mode]]:
    """The back-end the model runs on, and its plan for the layers' matrices: dense weights
    in `dtype` where they are not packed (quantize.packs), else llama-chat's kernels where
    choose_native picks a variant, else PyTorch's, measured for the packing most of the
    matrices get."""
    if not packs(quantize, device, dtype):
        return DenseWeights(device, resolve_dtype(dtype, device)), {}
    variant, native_reason = choose_native(checkpoint.args, kernels)
    if variant is not None:
        modes = BlockKernels.plan(checkpoint, quantize)
        return native_paths(variant, native_reason, kernels.activation_bits), modes
    modes = PyTorchKernels.plan(checkpoint, quantize)
    most_used = Counter(modes.values()).most_common(1)[0][0]
    paths = choose_cpu_paths(checkpoint.args, most_used, kernels)
    return dataclasses.replace(paths, reason=f"{paths.reason}; {native_reason}"), modes
