"""Which dtypes a packed model computes in on this CPU, decided by measuring, not assuming.

Two choices matter, and CPUs differ on both by up to a hundred times:
- the compute dtype: activations, the KV cache, and the matrix products of prompt steps
  (bfloat16 is several times faster than float32 with AMX or AVX-512-BF16 and about ten
  times slower where it is emulated, on AVX2);
- the kernel dtype: what the packed int4/int8 kernels take for single-token steps.
A short probe times both candidates of each at the model's own widths, and the choice is
kept per CPU model, PyTorch version and shape in the cache folder. LLAMA_CHAT_DTYPE and
LLAMA_CHAT_KERNEL_DTYPE (or --dtype and --kernel-dtype) force either one.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelArgs
from .device import DTYPES
from .errors import DeviceError
from .packed import GROUP, pack_int4
from .weights import cache_root

CANDIDATES = (torch.bfloat16, torch.float32)
PROBE_ROWS = 64  # prompt-step rows the compute dtype is timed at
PROBE_MAX_OUT = 4096  # output rows timed, at most: the ratio, not the whole layer, is wanted


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class CpuPaths:
    compute_dtype: torch.dtype
    kernel_dtype: torch.dtype
    reason: str  # how each was chosen, for people

    def describe(self) -> str:
        """"bfloat16 compute and kernels; measured here: ..." and the like."""
        if self.compute_dtype == self.kernel_dtype:
            dtypes = f"{dtype_name(self.compute_dtype)} compute and kernels"
        else:
            dtypes = f"{dtype_name(self.compute_dtype)} compute, {dtype_name(self.kernel_dtype)} kernels"
        return f"{dtypes}; {self.reason}"


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def forced_dtype(value: str | None, what: str) -> torch.dtype | None:
    """A dtype named on the command line or in the environment; None for auto."""
    name = (value or "auto").lower()
    if name == "auto":
        return None
    dtype = DTYPES.get(name)
    if dtype not in CANDIDATES:
        raise DeviceError(f"{what} {value!r} is not one the packed cpu path runs: use auto, bfloat16 or float32")
    return dtype


def fastest_of(calls: dict[str, Callable[[], object]], budget: float = 0.4) -> dict[str, float]:
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


def measure(args: ModelArgs, mode: str) -> dict[str, float]:
    """Seconds per call of each candidate, at the model's feed-forward widths, on one thread:
    what separates the candidates is how each core computes them, and a single thread does
    not wait on a second one that the machine is busy elsewhere with."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fastest_of(candidates(args, mode))
    finally:
        torch.set_num_threads(threads)


def candidates(args: ModelArgs, mode: str) -> dict[str, Callable[[], object]]:
    """The calls the probe times: a prompt step's product and a packed single-token kernel,
    in each candidate dtype."""
    generator = torch.Generator().manual_seed(0)
    out_features, in_features = min(2 * args.hidden_dim, PROBE_MAX_OUT), args.dim
    weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
    levels = torch.randint(0, 16, (out_features, in_features), generator=generator, dtype=torch.uint8)
    calls = {}
    for dtype in CANDIDATES:
        rows = torch.randn(PROBE_ROWS, in_features, generator=generator).to(dtype)
        dense = weight.to(dtype)
        calls[f"prompt steps {dtype_name(dtype)}"] = lambda rows=rows, dense=dense: rows @ dense.t()
        one = rows[:1].clone()
        if mode == "int4":
            packed = pack_int4(levels)
            scales_and_zeros = torch.rand(in_features // GROUP, out_features, 2, generator=generator).to(dtype)
            calls[f"kernels {dtype_name(dtype)}"] = lambda one=one, sz=scales_and_zeros: (
                torch.ops.aten._weight_int4pack_mm_for_cpu(one, packed, GROUP, sz)
            )
        else:
            int8 = (levels.to(torch.int8) - 8).contiguous()
            scales = torch.rand(out_features, generator=generator).to(dtype)
            calls[f"kernels {dtype_name(dtype)}"] = lambda one=one, scales=scales: (
                torch.ops.aten._weight_int8pack_mm(one, int8, scales)
            )
    return calls


def _faster(times: dict[str, float], kind: str) -> tuple[torch.dtype, str]:
    first, second = (times[f"{kind} {dtype_name(d)}"] for d in CANDIDATES)
    winner, loser = CANDIDATES if first <= second else reversed(CANDIDATES)
    ratio = max(first, second) / max(min(first, second), 1e-12)
    return winner, f"{kind} {ratio:.1f}x faster in {dtype_name(winner)} than {dtype_name(loser)}"


def _probe_file() -> Path | None:
    root = cache_root()
    return None if root is None else root / "cpu-paths.json"


def choose_cpu_paths(args: ModelArgs, mode: str, compute: str | None = None, kernel: str | None = None) -> CpuPaths:
    """The compute and kernel dtypes for a packed model of these shapes on this CPU."""
    forced_compute = forced_dtype(compute or os.environ.get("LLAMA_CHAT_DTYPE"), "dtype")
    forced_kernel = forced_dtype(kernel or os.environ.get("LLAMA_CHAT_KERNEL_DTYPE"), "kernel dtype")
    if forced_compute and forced_kernel:
        return CpuPaths(forced_compute, forced_kernel, "both forced")
    times = cached_measurement(args, mode)
    compute_dtype, compute_reason = (
        (forced_compute, "compute dtype forced") if forced_compute else _faster(times, "prompt steps")
    )
    kernel_dtype, kernel_reason = (forced_kernel, "kernel dtype forced") if forced_kernel else _faster(times, "kernels")
    return CpuPaths(compute_dtype, kernel_dtype, f"measured here: {compute_reason}, {kernel_reason}")


def cached_measurement(args: ModelArgs, mode: str) -> dict[str, float]:
    """measure(), remembered per CPU model, capability, PyTorch version and shape."""
    key = "|".join([
        cpu_model_name(), torch.backends.cpu.get_cpu_capability(), torch.__version__, mode, f"{args.dim}x{min(2 * args.hidden_dim, PROBE_MAX_OUT)}",
    ])
    path = _probe_file()
    known = {}
    if path is not None:
        try:
            known = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
    expected = {f"{kind} {dtype_name(dtype)}" for kind in ("prompt steps", "kernels") for dtype in CANDIDATES}
    entry = known.get(key) if isinstance(known, dict) else None
    if isinstance(entry, dict) and set(entry) == expected and all(isinstance(v, float) for v in entry.values()):
        return entry
    known = known if isinstance(known, dict) else {}
    times = measure(args, mode)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            known[key] = times
            path.write_text(json.dumps(known, indent=1), encoding="utf-8")
        except OSError:
            pass  # an unwritable cache only means measuring again next time
    return times
