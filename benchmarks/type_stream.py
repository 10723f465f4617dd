"""A single token through matrices of one block type at a time, from memory and from the
last-level cache: how fast each type's tiles stream, as a share of the read bandwidth
measured in the same run.

Decode reads every weight once a token, so a type whose tiles stream below the machine's
read bandwidth holds decode below it on every model that uses the type. Each type gets
random blocks (sane float16 fields) of 4096 x 4096, copied until they fill 384 MB, read
round after round; the same matrix cut to 8 MB and read again and again shows whether the
arithmetic (in cache) or the reading (from memory) is what holds it. Three rounds, the
best of each kept, the bandwidth measured between them.

    .venv/bin/python benchmarks/type_stream.py [--variant avx512-vnni] [--types Q4_0,Q4_K,Q5_K,Q6_K]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

from llama_chat.kernels import native, native_state  # noqa: E402
from llama_chat.kernels.machine_limits import read_bandwidth_gb_per_second  # noqa: E402

COLUMNS = ROWS = 4096
IN_MEMORY = 384 << 20
IN_CACHE = 8 << 20
HALF_AT = {"Q6_K": 208}  # where a block's float16 d lies (0 for the others)
TWO_HALVES = ("Q4_1", "Q5_1", "Q4_K", "Q5_K")  # d and m (or dmin)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def tiles_of(block_type: str) -> torch.Tensor:
    """Random blocks of `block_type`, ROWS x COLUMNS, in the kernels' layout."""
    from llama_chat.kernels.block_linear import BLOCK_TYPES, arranged_bytes

    weights, size = GGML_QUANT_SIZES[GGMLQuantizationType[block_type]]
    blocks = torch.randint(0, 256, (ROWS, COLUMNS // weights, size), dtype=torch.uint8)
    half = torch.tensor([0x2000], dtype=torch.int16).view(torch.uint8)  # 2^-7: no infinities, no subnormals
    at = HALF_AT.get(block_type, 0)
    for field in range(2 if block_type in TWO_HALVES else 1):
        blocks[:, :, at + 2 * field : at + 2 * field + 2] = half
    tiles = torch.empty(ROWS // 16, arranged_bytes(block_type, COLUMNS), dtype=torch.uint8)
    torch.ops.llama_chat.arrange_blocks(blocks.view(ROWS, -1), BLOCK_TYPES[block_type], tiles)
    return tiles


def rate(block_type: str, matrices: list[torch.Tensor], variant: int, x: torch.Tensor) -> float:
    """GB/s of tiles one token reads through `matrices`, over at least 256 MB."""
    from llama_chat.kernels.block_linear import BLOCK_TYPES

    def call(tiles: torch.Tensor) -> torch.Tensor:
        return torch.ops.llama_chat.block_linear(x, tiles, BLOCK_TYPES[block_type], len(tiles) * 16, variant, 16)

    for tiles in matrices[:3]:
        call(tiles)
    size = sum(tiles.numel() for tiles in matrices)
    rounds = max(1, (256 << 20) // size)
    start = time.perf_counter()
    for _ in range(rounds):
        for tiles in matrices:
            call(tiles)
    return rounds * size / (time.perf_counter() - start) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", help="a kernel variant (default: the best this CPU runs)")
    parser.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q5_K,Q6_K")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    status = native_state.load_or_build(wait=True)
    if not status.loaded:
        print(f"llama-chat's kernels are not in use: {status.detail}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    variant_name = args.variant or native.runnable_variants()[-1]
    variant = native.variant_number(variant_name)
    types = args.types.split(",")
    x = torch.randn(1, COLUMNS)
    held = {}
    for block_type in types:
        tiles = tiles_of(block_type)
        held[block_type] = ([tiles.clone() for _ in range(max(2, IN_MEMORY // tiles.numel()))],
                            [tiles[: max(1, IN_CACHE // tiles.shape[1])].clone()])
    best, bandwidth = {}, 0.0
    for _ in range(3):
        bandwidth = max(bandwidth, read_bandwidth_gb_per_second())
        for block_type, (memory, cache) in held.items():
            now = (rate(block_type, memory, variant, x), rate(block_type, cache, variant, x))
            best[block_type] = tuple(max(a, b) for a, b in zip(best.get(block_type, (0.0, 0.0)), now))
    print(f"{cpu_model()}, get_cpu_capability() {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} threads, variant {variant_name}; read bandwidth {bandwidth:.1f} GB/s")
    print("| type | from memory | share of the read bandwidth | from an 8 MB matrix in cache |")
    print("| --- | --- | --- | --- |")
    for block_type, (memory, cache) in best.items():
        print(f"| {block_type} | {memory:.1f} GB/s | {100 * memory / bandwidth:.0f}% | {cache:.1f} GB/s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
