"""What this machine can do, measured on the threads PyTorch uses: the rate a streaming
read of memory runs at (decode reads every weight once a token, so tokens a second are at
most this over the bytes of the weights) and the rate of int8 matrix products (what
prompt steps' integer products could reach at best)."""

from __future__ import annotations

import time

import torch

READ_BYTES = 512 * 2**20  # larger than any CPU cache, so the read comes from memory
INT8_SHAPE = (256, 2048, 8192)  # rows, inner, outer: a 256-token step through a 1 B layer


def _fastest(call, repeats: int = 3) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def read_bandwidth_gb_per_second() -> float:
    """GB/s of a float32 sum over READ_BYTES (written first, so every page is real)."""
    values = torch.ones(READ_BYTES // 4)
    seconds = _fastest(values.sum)
    return READ_BYTES / seconds / 1e9


def int8_matrix_gops() -> float:
    """Billions of int8 multiply-adds x 2 a second, by torch._int_mm at INT8_SHAPE."""
    rows, inner, outer = INT8_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (rows, inner), dtype=torch.int8, generator=generator)
    b = torch.randint(-127, 128, (inner, outer), dtype=torch.int8, generator=generator)
    seconds = _fastest(lambda: torch._int_mm(a, b))
    return 2 * rows * inner * outer / seconds / 1e9
