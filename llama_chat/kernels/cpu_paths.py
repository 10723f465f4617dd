"""How a packed model multiplies on this CPU, decided by measuring, not assuming.

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
Where llama-chat's own kernels are built (native.py), the probe times each variant this
CPU runs on a layer of 4-bit blocks at the model's widths, a single token, a 16-token step
and a 256-token prompt chunk, against PyTorch's int4 kernel and dequantised products on the
same steps, and uses the family with the smaller sum of times a token. LLAMA_CHAT_KERNELS
(ours or aten) and LLAMA_CHAT_KERNEL_VARIANT (portable, avx2, avx512-vnni, avx512-amx) force
the family and the variant.
A short probe times the candidates at the model's own widths, on one thread, and the
result is kept per CPU model, PyTorch version and shape in the cache folder.
LLAMA_CHAT_DTYPE, LLAMA_CHAT_KERNEL_DTYPE (or --dtype and --kernel-dtype) and
LLAMA_CHAT_KERNEL_ROWS force them, each arriving as a field of KernelOptions. choose_backend is
where the back-end is chosen, dense weights among them.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import Counter
from collections.abc import Callable

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.gguf_blocks import int4_groups
from llama_chat.checkpoints.stored import Int4Groups, StoredMatrix, TensorMatrix
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.device import resolve_dtype
from llama_chat.engine.runners import PREFILL_CHUNK
from llama_chat.errors import DeviceError
from llama_chat.kernels import native
from llama_chat.kernels.backend import WeightBackend
from llama_chat.kernels.block_backend import BlockKernels
from llama_chat.kernels.block_linear import BlockLinear
from llama_chat.kernels.dense_backend import DenseWeights
from llama_chat.kernels.packed import PackedLinear, Scratch, int4_layout
from llama_chat.kernels.probe_times import Probe, Timing, remembered
from llama_chat.kernels.pytorch_backend import PyTorchKernels
from llama_chat.kernels.quantize import Mode, packs
from llama_chat.kernels.weights_record import dtype_name
from llama_chat.options import KernelFamily, KernelOptions

CANDIDATES = (torch.bfloat16, torch.float32)
PROBE_ROWS = 64  # prompt-step rows the matmul dtype is timed at
PROBE_MAX_OUT = 2048  # output rows timed, at most: the ratio, not the whole layer, is wanted (a probe's time goes with it)
STEP_ROWS = (16, 256)  # a chat turn's step and a long prompt's, timed on both paths


# What measure_dtypes and measure_rows time; a kept entry must have them all.
DTYPE_TIMES = frozenset(Timing(kind, rows, d) for kind, rows in (("prompt steps", PROBE_ROWS), ("kernels", 1))
                        for d in CANDIDATES)
ROW_TIMES = frozenset(Timing(kind, rows) for kind in ("kernel", "dequantise") for rows in STEP_ROWS)


def forced_dtype(dtype: torch.dtype | None, what: str) -> torch.dtype | None:
    """A dtype the options force (None: auto), one PyTorch's packed kernels run."""
    if dtype is not None and dtype not in CANDIDATES:
        raise DeviceError(f"{what} {dtype_name(dtype)} is not one the packed cpu path runs: use auto, bfloat16 "
                          "or float32")
    return dtype


def fastest_of(calls: dict[Timing, Callable[[], object]], budget: float = 0.4) -> dict[Timing, float]:
    """Each call's fastest time, taking turns between them after a warm-up of each, for
    about `budget` seconds in all: a busy moment on the machine then slows every
    candidate alike, and the fastest of several runs is the one it left alone."""
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, float("inf"))
    started = time.perf_counter()
    rounds = 0
    while rounds < 3 or (time.perf_counter() - started < budget and rounds < 50):
        for name, call in calls.items():
            begin = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - begin)
        rounds += 1
    return best


def one_thread(measure: Callable[[], dict[Timing, float]]) -> dict[Timing, float]:
    """Times taken on one thread: what separates the candidates is how each core computes
    them, and a single thread does not wait on a second one the machine is busy elsewhere with."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure()
    finally:
        torch.set_num_threads(threads)


def probe_widths(args: ModelArgs) -> tuple[int, int]:
    """The probe layer's input and output widths: the model's, the outputs capped."""
    return args.dim, min(2 * args.hidden_dim, PROBE_MAX_OUT)


def probe_layer(
    args: ModelArgs, mode: str, kernel_dtype: torch.dtype, matmul_dtype: torch.dtype = torch.float32
) -> PackedLinear:
    """A packed layer of random weights at the model's feed-forward widths."""
    in_features, out_features = probe_widths(args)
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(0))
    return PackedLinear(TensorMatrix.of(weight), mode, Scratch(), kernel_dtype, matmul_dtype=matmul_dtype)


def measure_dtypes(args: ModelArgs, mode: str) -> dict[Timing, float]:
    """Seconds per call of a prompt step's matrix product and of a packed single-token
    kernel, in each candidate dtype."""
    calls = {}
    for dtype in CANDIDATES:
        layer = probe_layer(args, mode, dtype)
        rows = torch.randn(PROBE_ROWS, args.dim).to(dtype)
        dense = layer.dequantize(dtype).clone()
        calls[Timing("prompt steps", PROBE_ROWS, dtype)] = lambda rows=rows, dense=dense: rows @ dense.t()
        calls[Timing("kernels", 1, dtype)] = lambda layer=layer, one=rows[:1].clone(): layer(one)
    return one_thread(lambda: fastest_of(calls))


def measure_rows(args: ModelArgs, mode: str, matmul: torch.dtype, kernel: torch.dtype) -> dict[Timing, float]:
    """Seconds for a short and a long step through the packed kernel, and through
    dequantising and multiplying."""
    layer = probe_layer(args, mode, kernel, matmul)

    def forward(rows: torch.Tensor, kernel_rows: int) -> torch.Tensor:
        layer.kernel_rows = kernel_rows
        return layer(rows)

    calls = {}
    for count in STEP_ROWS:
        rows = torch.randn(count, args.dim)
        calls[Timing("kernel", count)] = lambda rows=rows: forward(rows, PREFILL_CHUNK)
        calls[Timing("dequantise", count)] = lambda rows=rows: forward(rows, 0)
    return one_thread(lambda: fastest_of(calls))


def kernel_rows(row_times: dict[Timing, float]) -> int:
    """The most rows a step may have for the packed kernel to beat dequantising and
    multiplying, from straight lines through each one's times at the two step sizes."""
    short, long = STEP_ROWS

    def line(kind: str) -> tuple[float, float]:
        slope = (row_times[Timing(kind, long)] - row_times[Timing(kind, short)]) / (long - short)
        return row_times[Timing(kind, short)] - slope * short, slope

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


# A single token, a chat turn's step and a prompt's chunk, for each variant of ours (the
# avx512-amx variant differs from avx512-vnni on prompt chunks only).
VARIANT_TIMES_ROWS = (1, 16, 256)


class RandomBlocks(StoredMatrix):
    """Random Q4_1 blocks held in memory, read as a file's: both families' probe layers take
    their levels as they are (quantising random floats for them took three quarters of the
    probe, 4.4 of 5.8 s at an 8 B model's widths on an AMD EPYC)."""

    four_bit = True
    float_storage = False
    block_type = "Q4_1"

    def __init__(self, out_features: int, in_features: int) -> None:
        self.shape = (out_features, in_features)
        generator = torch.Generator().manual_seed(0)
        blocks = torch.randint(0, 256, (out_features, in_features // 32, 20), dtype=torch.uint8, generator=generator)
        blocks[..., :4] = torch.tensor([0x00, 0x20, 0x00, 0xAC], dtype=torch.uint8)  # float16 d 2^-7, m -2^-4
        self.raw = blocks.view(out_features, -1)

    def blocks(self, start: int, stop: int) -> torch.Tensor:
        return self.raw[start:stop]

    def rows(self, start: int, stop: int) -> Int4Groups:
        return int4_groups(self.raw[start:stop].numpy(), self.block_type, self.shape[1])


def measure_native(args: ModelArgs, variants: list[str]) -> dict[Timing, float]:
    """Seconds for each step of VARIANT_TIMES_ROWS tokens through each variant of ours (4-bit
    blocks), and through PyTorch's int4 kernel (each dtype; the steps dequantise)."""
    in_features, out_features = probe_widths(args)
    source = RandomBlocks(out_features, in_features)
    inputs = {rows: torch.randn(rows, in_features) for rows in VARIANT_TIMES_ROWS}
    blocks = BlockLinear(source, "Q4_1", native.variant_number(variants[0]))
    calls = {}
    for variant in variants:
        layer = copy.copy(blocks)  # the same blocks, through another variant
        layer.variant = native.variant_number(variant)
        for rows, x in inputs.items():
            calls[Timing(variant, rows)] = lambda layer=layer, x=x: layer(x)
    mode = "int4" if in_features % 32 == 0 and int4_layout() is not None else "int8"
    packed = PackedLinear(source, mode, Scratch(), CANDIDATES[0], matmul_dtype=CANDIDATES[0])
    for dtype in CANDIDATES:
        aten = packed.in_dtype(dtype)
        for rows, x in inputs.items():
            calls[Timing("aten", rows, dtype)] = lambda aten=aten, x=x: aten(x)
    times = one_thread(lambda: fastest_of(calls))
    for rows in VARIANT_TIMES_ROWS:  # PyTorch's path in its faster dtype for each step
        times[Timing("aten", rows)] = min(times.pop(Timing("aten", rows, d)) for d in CANDIDATES)
    return times


def choose_native(args: ModelArgs, kernels: KernelOptions = KernelOptions()) -> tuple[str | None, str]:
    """The variant of llama-chat's kernels to run, or None for PyTorch's, and why."""
    family = kernels.family
    # Set, even empty, it forces: a name that is none is refused, not taken for auto.
    forced = kernels.variant
    state = native.status(kernels=kernels)
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
    timed = frozenset(Timing(v, rows) for v in ["aten", *variants] for rows in VARIANT_TIMES_ROWS)
    probe = Probe("native", native.build_key(), probe_widths(args), tuple(variants))
    times = remembered(probe, lambda: measure_native(args, variants), timed)

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
    dtype_times = remembered(Probe("dtypes", mode, probe_widths(args)), lambda: measure_dtypes(args, mode),
                             DTYPE_TIMES)
    matmul_dtype, matmul_reason = (
        (forced_matmul, "matmul dtype forced") if forced_matmul else _faster(dtype_times, "prompt steps", PROBE_ROWS)
    )
    kernel_dtype, kernel_reason = (
        (forced_kernel, "kernel dtype forced") if forced_kernel else _faster(dtype_times, "kernels", 1)
    )
    if forced_rows:
        rows = forced_rows
    else:
        probe = Probe("rows", mode, probe_widths(args), (dtype_name(matmul_dtype), dtype_name(kernel_dtype)))
        row_times = remembered(probe, lambda: measure_rows(args, mode, matmul_dtype, kernel_dtype), ROW_TIMES)
        rows = kernel_rows(row_times)
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
