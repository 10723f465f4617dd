"""The probe: short timings, on this CPU, of the ways a packed model can multiply, at the
model's own widths; cpu_paths.py chooses from them.

Each candidate is timed on one thread, the fastest of several turns taken in rotation, and
the times are kept per CPU model, PyTorch version and shape in the cache folder
(probe_times.py), so a later load reads them instead of measuring again. Timed: the
dtype of prompt steps' products and of PyTorch's packed kernels, how a short and a long
step run through the packed kernel and by dequantising, and each variant of llama-chat's
kernels on 4-bit blocks against PyTorch's int4 kernel on a single token, a 16-token step
and a 256-token prompt chunk.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from llama_chat.checkpoints.gguf_blocks import int4_groups
from llama_chat.checkpoints.stored import Int4Groups, StoredMatrix, TensorMatrix
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.runners import PREFILL_CHUNK
from llama_chat.kernels import native
from llama_chat.kernels.block_linear import BlockLinear
from llama_chat.kernels.native_files import build_key
from llama_chat.kernels.packed import PackedLinear, Scratch, int4_layout
from llama_chat.kernels.probe_times import Probe, Timing, remembered
from llama_chat.kernels.weights_record import dtype_name

CANDIDATES = (torch.bfloat16, torch.float32)
PROBE_ROWS = 64  # prompt-step rows the matmul dtype is timed at
PROBE_MAX_OUT = 2048  # output rows timed, at most: the ratio, not the whole layer, is wanted (a probe's time goes with it)
STEP_ROWS = (16, 256)  # a chat turn's step and a long prompt's, timed on both paths


# What measure_dtypes and measure_rows time; a kept entry must have them all.
DTYPE_TIMES = frozenset(Timing(kind, rows, d) for kind, rows in (("prompt steps", PROBE_ROWS), ("kernels", 1))
                        for d in CANDIDATES)
ROW_TIMES = frozenset(Timing(kind, rows) for kind in ("kernel", "dequantise") for rows in STEP_ROWS)


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


def dtype_times(args: ModelArgs, mode: str) -> dict[Timing, float]:
    """measure_dtypes' times for `mode` at the model's widths, measured once a machine."""
    return remembered(Probe("dtypes", mode, probe_widths(args)), lambda: measure_dtypes(args, mode), DTYPE_TIMES)


def row_times(args: ModelArgs, mode: str, matmul: torch.dtype, kernel: torch.dtype) -> dict[Timing, float]:
    """measure_rows' times in these dtypes, measured once a machine."""
    probe = Probe("rows", mode, probe_widths(args), (dtype_name(matmul), dtype_name(kernel)))
    return remembered(probe, lambda: measure_rows(args, mode, matmul, kernel), ROW_TIMES)


def native_times(args: ModelArgs, variants: list[str]) -> dict[Timing, float]:
    """measure_native's times for these variants, measured once a machine and build."""
    timed = frozenset(Timing(v, rows) for v in ["aten", *variants] for rows in VARIANT_TIMES_ROWS)
    probe = Probe("native", build_key(), probe_widths(args), tuple(variants))
    return remembered(probe, lambda: measure_native(args, variants), timed)
