"""What this machine can do, measured on the threads PyTorch uses: the rate a streaming
read of memory runs at (decode reads every weight once a token, so tokens a second are at
most this over the bytes of the weights), the rates of PyTorch's int8 and bfloat16 matrix
products (on the CPU's tile unit where it has one: what prompt steps' products could reach),
and the peak of the dot-product instruction llama-chat's exact prompt kernels issue."""

from __future__ import annotations

import time

import torch

READ_BYTES = 512 * 2**20  # larger than any CPU cache, so the read comes from memory
INT8_SHAPE = (256, 2048, 8192)  # rows, inner, outer: a 256-token step through a 1 B layer
STEP_TOKENS = INT8_SHAPE[0]
# The instruction each variant's integer prompt kernels multiply with, and its byte
# products (vpdpbusd: 64 in a 512-bit register; vpmaddubsw: 32 in 256). The avx512-amx
# variant's prompt chunks run on the tile unit instead, and the portable one has no such
# instruction.
PROMPT_INSTRUCTIONS = {"avx512-vnni": ("vpdpbusd", 64), "avx2": ("vpmaddubsw", 32)}
DOT_ROUNDS = 10_000_000  # 120 million instructions a thread: some 40 ms at one a cycle


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


def _matrix_rate(a: torch.Tensor, b: torch.Tensor, product) -> float:
    """Billions of multiply-adds x 2 a second of product(a, b), a and b at INT8_SHAPE."""
    rows, inner, outer = INT8_SHAPE
    seconds = _fastest(lambda: product(a, b))
    return 2 * rows * inner * outer / seconds / 1e9


def int8_matrix_gops() -> float:
    """Billions of int8 multiply-adds x 2 a second, by torch._int_mm at INT8_SHAPE."""
    rows, inner, outer = INT8_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (rows, inner), dtype=torch.int8, generator=generator)
    b = torch.randint(-127, 128, (inner, outer), dtype=torch.int8, generator=generator)
    return _matrix_rate(a, b, torch._int_mm)


def bfloat16_matrix_gflops() -> float:
    """Billions of bfloat16 multiply-adds x 2 a second (float32 sums), by torch.mm at INT8_SHAPE."""
    rows, inner, outer = INT8_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=generator).bfloat16()
    b = torch.randn(inner, outer, generator=generator).bfloat16()
    return _matrix_rate(a, b, torch.mm)


def matrix_step_gflops(matrix: torch.nn.Module, dtype: torch.dtype) -> float:
    """Billions of multiply-adds x 2 a second of one of a model's matrices (any module with
    in_features and out_features) on a STEP_TOKENS-token step: a prompt chunk's rate."""
    x = torch.randn(STEP_TOKENS, matrix.in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.no_grad():
        seconds = _fastest(lambda: matrix(x))
    return 2 * STEP_TOKENS * matrix.in_features * matrix.out_features / seconds / 1e9


def exact_prompt_peak_gops(variant: str) -> float | None:
    """The most multiply-adds x 2 a second the exact prompt kernels of `variant` could reach
    here: their dot-product instruction alone, issued back to back on PyTorch's threads
    (llama-chat's kernels' `dot_product_rate`), each weight taking two byte products (the
    16-bit activation's two int8 halves). None for variants without one."""
    if variant not in PROMPT_INSTRUCTIONS:
        return None
    instruction, products = PROMPT_INSTRUCTIONS[variant]
    rate = max(torch.ops.llama_chat.dot_product_rate(instruction, DOT_ROUNDS) for _ in range(3))
    return 2 * rate * products / 2 / 1e9
