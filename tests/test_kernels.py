"""llama-chat's own kernels (kernels/csrc) against float32 references, in every variant
this CPU can run, with gguf's own dequantisation as the oracle for the blocks; the float
quantisers; the build, its cache and the fallback to PyTorch's kernels."""

import os
import re
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from gguf import quants

import llama_chat
from llama_chat import environment
from llama_chat.checkpoints.stored import StackedRows, TensorMatrix
from llama_chat.cli.options import configure_folders
from llama_chat.environment import kernel_options
from llama_chat.kernels import native, native_build, native_files, native_state
from llama_chat.kernels.block_linear import (
    BLOCK_TYPES,
    BlockEmbedding,
    BlockLinear,
    StackedBlockLinear,
    arranged_bytes,
    q4_1_blocks,
    q8_0_blocks,
    untile_rows,
)
from llama_chat.kernels.library_layout import library_layout
from llama_chat.kernels.quantize import block_mode, block_types
from llama_chat.kernels.weights_record import WeightsRecord

from .block_layout_reference import BLOCK_SIZES, TILE_HALVES, TILE_ROWS, tile_rows
from .conftest import tiny_args
from .loading_helpers import file_blocks, options_from_environment
from .test_gguf import tiny_hf_model, write_gguf

TYPES = list(BLOCK_TYPES)
# Where each type keeps float16 fields, and a spread for them that gives weights near 0.1.
HALVES = {"Q4_0": [(0, 0.01)], "Q4_1": [(0, 0.01), (2, 0.1)], "Q5_0": [(0, 0.005)], "Q5_1": [(0, 0.005), (2, 0.1)],
          "Q8_0": [(0, 0.001)], "Q4_K": [(0, 0.001), (2, 0.001)], "Q5_K": [(0, 0.001), (2, 0.001)],
          "Q6_K": [(208, 0.0005)]}


def variants():
    # Every variant this CPU runs: an AVX-512 machine also runs the AVX2 and portable code.
    return native.runnable_variants()


def random_blocks(block_type: str, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Random bytes [rows, bytes a row] with sane float16 scales where the type keeps them."""
    generator = np.random.default_rng(seed)
    qtype = QType[block_type]
    weights, size = quants.GGML_QUANT_SIZES[qtype]
    raw = generator.integers(0, 256, size=(rows, columns // weights, size), dtype=np.uint8)
    for offset, spread in HALVES[block_type]:
        halves = (generator.standard_normal((rows, columns // weights)) * spread).astype(np.float16)
        raw[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(rows, columns // weights, 2)
    return raw.reshape(rows, -1)


def stored_blocks(block_type: str, rows: int, columns: int, seed: int) -> TensorMatrix:
    """A matrix as a file would hold it in `block_type`, its blocks handed out as stored."""
    raw = random_blocks(block_type, rows, columns, seed=seed)
    stored = TensorMatrix.of(torch.from_numpy(quants.dequantize(raw, QType[block_type]).reshape(rows, columns)))
    stored.block_type = block_type
    stored.blocks = lambda start, stop: torch.from_numpy(raw[start:stop])
    return stored


def reference(raw: np.ndarray, block_type: str, x: torch.Tensor) -> torch.Tensor:
    weight = torch.from_numpy(quants.dequantize(raw, QType[block_type]).astype(np.float64))
    return x.double() @ weight.reshape(raw.shape[0], -1).t()


def arranged(blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """Blocks [rows, bytes a row] in the kernels' layout (tiles of 16 rows), as the
    library's arrange_blocks writes it."""
    columns = blocks.shape[1] // BLOCK_SIZES[block_type][1] * BLOCK_SIZES[block_type][0]
    out = torch.full((-(-len(blocks) // TILE_ROWS), arranged_bytes(block_type, columns)), 0xAB, dtype=torch.uint8)
    torch.ops.llama_chat.arrange_blocks(blocks, BLOCK_TYPES[block_type], out)
    return out


def run(x, raw, block_type, variant, bits):
    """The operator on raw blocks [rows, bytes a row], arranged by the library."""
    return torch.ops.llama_chat.block_linear(
        x, arranged(torch.from_numpy(raw), block_type), BLOCK_TYPES[block_type], raw.shape[0],
        native.variant_number(variant), bits,
    )


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("rows", [1, 5, 16, 37, 3205])
def test_the_library_arranges_blocks_as_the_reference_does_byte_for_byte(block_type, rows):
    """Every byte random (fields too: arranging moves bytes, never reads them as numbers);
    3205 rows split over threads into several pieces and end in a padded tile."""
    columns = 1024 if rows == 3205 else 512
    weights, size = BLOCK_SIZES[block_type]
    generator = torch.Generator().manual_seed(rows)
    blocks = torch.randint(0, 256, (rows, columns // weights * size), dtype=torch.uint8, generator=generator)
    got = arranged(blocks, block_type)
    assert torch.equal(got, tile_rows(blocks, block_type))
    assert torch.equal(untile_rows(got, block_type, rows), blocks)


def four_q4_0_rows(**changes):
    """Arguments for 4 rows of 2 Q4_0 blocks (one tile of 2 units, 576 bytes), with changes."""
    call = dict(blocks=torch.zeros(4, 36, dtype=torch.uint8), block_type=BLOCK_TYPES["Q4_0"],
                arranged=torch.zeros(576, dtype=torch.uint8))
    call.update(changes)
    return call


@pytest.mark.needs_kernels
@pytest.mark.parametrize("call, message", [
    (four_q4_0_rows(blocks=torch.zeros(4, 35, dtype=torch.uint8)), "35 bytes is not whole blocks of 18"),
    (four_q4_0_rows(arranged=torch.zeros(575, dtype=torch.uint8)), "575 bytes, not the 576 of 4 rows"),
    (four_q4_0_rows(blocks=torch.zeros(4, 36, dtype=torch.int8)), "blocks must be contiguous uint8"),
    (four_q4_0_rows(blocks=torch.zeros(36, 4, dtype=torch.uint8).t()), "blocks must be contiguous uint8"),
    (four_q4_0_rows(arranged=torch.zeros(576, dtype=torch.int16)), "arranged must be contiguous uint8"),
    (four_q4_0_rows(block_type=9), "unsupported block type 9"),  # Q8_1
])
def test_arranging_refuses_what_it_cannot_lay_out(call, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.llama_chat.arrange_blocks(**call)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 7, 16])
@pytest.mark.parametrize("bits", [8, 16])
def test_quantised_activations_stay_within_their_rounding(block_type, rows, bits):
    """Multi-token kernels: each activation, rounded in groups of 32 to levels of the
    group's largest magnitude / 127 (8 bits) or / 32385 (16 bits, as two int8 halves),
    moves by at most half a level, so each output is within the sum of |weight| times
    that; and every variant gives the portable one's result up to float rounding."""
    columns = 768 if block_type in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0") else 512
    raw = random_blocks(block_type, 21, columns, seed=2)
    x = torch.randn(rows, columns, generator=torch.Generator().manual_seed(3))
    exact = reference(raw, block_type, x)
    weight = torch.from_numpy(quants.dequantize(raw, QType[block_type]).astype(np.float64)).reshape(21, columns)
    top = 127 if bits == 8 else 32385
    half_level = (x.double().view(rows, -1, 32).abs().amax(-1, keepdim=True) / top / 2).expand(-1, -1, 32)
    bound = half_level.reshape(rows, columns) @ weight.abs().t()
    portable = run(x, raw, block_type, "portable", bits).double()
    assert ((portable - exact).abs() <= bound * 1.001 + 1e-5 * exact.abs().max()).all()
    for variant in variants():
        got = run(x, raw, block_type, variant, bits).double()
        assert ((got - portable).abs().max() / exact.abs().max()) < 1e-5, variant


def one_thread(call):
    """call() on one thread: a single token then runs its first tiles four at a time (the
    AVX-512 path that shares broadcasts), whose count would otherwise depend on the threads."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        return call()
    finally:
        torch.set_num_threads(before)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", ["Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("tokens", [1, 3, 7, 16])
@pytest.mark.parametrize("bits", [8, 16])
def test_tiles_match_gguf_dequantisation_in_every_variant(block_type, tokens, bits):
    """Tiles in each variant against x @ W^T, W as gguf dequantises the same blocks: 101 rows
    (7 tiles, four of them run together for a single token, the last padded), 3 units wide;
    each output within half an activation level times the row's |weights|."""
    columns = 3 * BLOCK_SIZES[block_type][0]
    raw = random_blocks(block_type, 101, columns, seed=tokens)
    x = torch.randn(tokens, columns, generator=torch.Generator().manual_seed(bits))
    exact = reference(raw, block_type, x)
    weight = torch.from_numpy(quants.dequantize(raw, QType[block_type]).astype(np.float64)).reshape(101, columns)
    top = 127 if bits == 8 else 32385
    half_level = (x.double().view(tokens, -1, 32).abs().amax(-1, keepdim=True) / top / 2).expand(-1, -1, 32)
    bound = half_level.reshape(tokens, columns) @ weight.abs().t()
    for variant in variants():
        got = one_thread(lambda: run(x, raw, block_type, variant, bits)).double()
        assert got.shape == (tokens, 101)
        assert ((got - exact).abs() <= bound * 1.001 + 1e-5 * exact.abs().max()).all(), variant


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", [name for name in TYPES if name != "Q8_0"])  # Q8_0's: signed, below
@pytest.mark.parametrize("bits", [8, 16])
def test_tiled_levels_at_their_largest_do_not_overflow_the_products(block_type, bits):
    """Every level at its type's top (all level bits set: 15, Q5's 31, Q6_K's 63) against
    activations at +-127 (16 bits: high halves of +-127): the largest products AVX2 adds in
    16 bits (2 * 31 * 127 = 7874 a pair for 5-bit levels, four pairs at a time) are exact in
    every variant, where a saturated sum would be off by half."""
    rows, columns = 32, 512
    weights, size = BLOCK_SIZES[block_type]
    raw = random_blocks(block_type, rows, columns, seed=3).reshape(rows, -1, size)
    fields = np.zeros(size, dtype=bool)
    for offset, _ in HALVES[block_type]:
        fields[offset : offset + 2] = True
    raw[:, :, ~fields] = 0xFF  # levels, their high bits and (K types) the byte scales all ones
    raw = raw.reshape(rows, -1)
    x = torch.ones(2, columns)
    x[1] = -1
    exact = reference(raw, block_type, x)
    for variant in variants():
        got = run(x, raw, block_type, variant, bits).double()
        assert ((got - exact).abs().max() / exact.abs().max()) < 1e-5, variant


def amx_variant() -> str:
    if "avx512-amx" not in variants():
        pytest.skip("this CPU (or its system) gives no AMX tiles: the avx512-amx variant cannot run here")
    return "avx512-amx"


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("tokens", [33, 47, 64])
@pytest.mark.parametrize("rows", [101, 90])
def test_a_prompts_tokens_on_the_tile_unit_match_gguf_dequantisation(block_type, tokens, rows):
    """More than 32 tokens on the avx512-amx variant: the tile unit in split bfloat16. 101
    or 90 rows (the last tile padded, alone or the second of a pair of tiles: its results go
    through a scratch, never past y), 288 columns
    (9 groups: two passes over the columns), a last block of fewer than 16 tokens. Each output
    within 2^-15 of |x| |w| summed along its row (the split keeps 16 bits of each operand),
    and closer to the float64 product than the integer kernels' 16-bit activations come."""
    variant = amx_variant()
    columns = 288 if block_type not in ("Q4_K", "Q6_K") else 512
    raw = random_blocks(block_type, rows, columns, seed=tokens)
    x = torch.randn(tokens, columns, generator=torch.Generator().manual_seed(tokens))
    exact = reference(raw, block_type, x)
    weight = torch.from_numpy(quants.dequantize(raw, QType[block_type]).astype(np.float64)).reshape(rows, columns)
    bound = x.double().abs() @ weight.abs().t() * 2**-15
    got = run(x, raw, block_type, variant, 16).double()
    assert got.shape == (tokens, rows) and ((got - exact).abs() <= bound).all()
    integer = run(x, raw, block_type, "avx512-vnni", 16).double()
    assert (got - exact).abs().max() < (integer - exact).abs().max()


@pytest.mark.needs_kernels
def test_a_tokens_result_on_the_tile_unit_does_not_depend_on_the_tokens_beside_it():
    """The first 40 of 100 tokens give the same bits alone as in the longer step, and on one
    thread as on several (a thread's share of tiles, a block's pairing)."""
    variant = amx_variant()
    raw = random_blocks("Q4_K", 48, 512, seed=1)
    x = torch.randn(100, 512, generator=torch.Generator().manual_seed(0))
    whole = run(x, raw, "Q4_K", variant, 16)
    assert torch.equal(run(x[:40], raw, "Q4_K", variant, 16), whole[:40])
    assert torch.equal(one_thread(lambda: run(x, raw, "Q4_K", variant, 16)), whole)


Q8_0_EXTREMES = [[127] * 32, [-127] * 32, [-128] * 32, [127, -127] * 16, [-128, 127] * 16]


@pytest.mark.needs_kernels
@pytest.mark.parametrize("bits", [8, 16])
def test_q8_0_levels_at_their_extremes_do_not_overflow_the_products(bits):
    """Q8_0 blocks of levels at 127 and -127, all -128 (an int8 gguf reads, if no quantiser
    writes it), and signs alternating, against activations at +-127 (16 bits: high halves of
    +-127), tokens alternating with the levels' signs so that every product is positive:
    a pair of products reaches 2 * 128 * 127 = 32512 in AVX2's 16 bits, and the tiles' biased
    levels (q + 128) meet the largest sums; exact in every variant, on one thread too (four
    tiles at once)."""
    rows, columns = 80, 512
    raw = random_blocks("Q8_0", rows, columns, seed=6).reshape(rows, -1, 34)
    extremes = np.array(Q8_0_EXTREMES, dtype=np.int8).view(np.uint8)
    pattern = (np.arange(rows)[:, None] + np.arange(columns // 32)[None, :]) % len(extremes)
    raw[:, :, 2:] = extremes[pattern]
    raw = raw.reshape(rows, -1)
    x = torch.ones(4, columns)
    x[1] = -1
    x[2, 1::2] = -1  # alternating as [127, -127] blocks are
    x[3, 0::2] = -1  # alternating as [-128, 127] blocks are
    exact = reference(raw, "Q8_0", x)
    for variant in variants():
        for first, last in [(0, 4), (0, 1), (1, 2), (2, 3), (3, 4)]:  # four tokens, then each alone
            got = one_thread(lambda: run(x[first:last], raw, "Q8_0", variant, bits)).double()
            expected = exact[first:last]
            assert ((got - expected).abs().max() / expected.abs().max()) < 1e-5, (variant, first)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", TYPES)
def test_tiles_hold_the_file_blocks_at_their_size(block_type):
    """37 rows: two whole tiles and one padded with zero rows. Tiles are the blocks' bytes
    rearranged, but Q4_K's and Q5_K's hold each 6-bit scale in a byte (4 bytes a block more)."""
    raw = torch.from_numpy(random_blocks(block_type, 37, 512, seed=5))
    tiles = tile_rows(raw, block_type)
    growth = {"Q4_K": 148 / 144, "Q5_K": 180 / 176}.get(block_type, 1)
    assert tiles.shape == (3, 16 * raw.shape[1] * growth) == (3, arranged_bytes(block_type, 512))
    assert torch.equal(untile_rows(tiles, block_type, 37), raw)
    assert not untile_rows(tiles, block_type, 48)[37:].any()


@pytest.mark.needs_kernels
def test_the_library_reports_the_layout_its_header_documents():
    """What Python reads of the library instead of copying it: the layout the reference
    writes out, gguf's block sizes, and the variants' names in their numbering."""
    layout = library_layout()
    assert layout.tile_rows == TILE_ROWS
    assert native.variant_names() == ("portable", "avx2", "avx512-vnni", "avx512-amx")
    assert sorted(layout.types) == sorted(BLOCK_TYPES.values())
    for name, number in BLOCK_TYPES.items():
        kind = layout.types[number]
        assert (kind.block_weights, kind.block_bytes) == BLOCK_SIZES[name]
        assert (kind.halves, kind.halves_at) == TILE_HALVES[name]


@pytest.mark.needs_kernels
def test_the_variants_seen_on_this_cpu_include_the_portable_one():
    assert variants()[0] == "portable"
    with pytest.raises(RuntimeError, match="unknown kernel variant"):
        torch.ops.llama_chat.block_linear(torch.zeros(1, 256), torch.zeros(1, 2880, dtype=torch.uint8), 13, 1, 7, 16)


def q5_k_weight(rows: int, columns: int) -> torch.Tensor:
    """Zero Q5_K blocks of `rows` rows (padded to a tile of 16) in the kernels' layout."""
    return torch.zeros(-(-rows // 16) * columns // 256 * 2880, dtype=torch.uint8)


def block_linear(x, weight, block_type=BLOCK_TYPES["Q5_K"], out_features=4, variant=0, bits=16):
    return torch.ops.llama_chat.block_linear(x, weight, block_type, out_features, variant, bits)


def one_row(**changes):
    """A row of 256 against 4 rows of Q5_K, with `changes` to the operator's arguments."""
    return block_linear(torch.zeros(1, 256), q5_k_weight(4, 256), **changes)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("call, message", [
    # Bytes that do not make the rows said: the kernels would read past the weight's end.
    (lambda: block_linear(torch.zeros(1, 512), q5_k_weight(4, 512)[:-1]),
     "weight holds 5759 bytes, not the 5760 of 4 rows of 512 in tiles of 16"),
    (lambda: block_linear(torch.zeros(1, 512), q5_k_weight(4, 512), out_features=17),
     "weight holds 5760 bytes, not the 11520 of 17 rows of 512 in tiles of 16"),
    (lambda: block_linear(torch.zeros(2, 32), torch.zeros(287, dtype=torch.uint8), BLOCK_TYPES["Q4_0"], 16, bits=16),
     "weight holds 287 bytes, not the 288 of 16 rows of 32 in tiles of 16"),
    (lambda: block_linear(torch.zeros(1, 48), torch.zeros(544, dtype=torch.uint8), BLOCK_TYPES["Q8_0"], 16, bits=16),
     "width 48 is not whole blocks of 32 weights"),
    (lambda: block_linear(torch.zeros(2, 128), torch.zeros(0, dtype=torch.uint8), BLOCK_TYPES["Q4_K"], 16, bits=16),
     "width 128 is not whole blocks of 256 weights"),
    # Width 0 divided the row count by zero: a crash of the process (SIGFPE), not an error.
    (lambda: block_linear(torch.zeros(3, 0), q5_k_weight(4, 0)), "width 0 is not whole blocks of 256 weights"),
    (lambda: one_row(block_type=9), "unsupported block type 9"),
    (lambda: one_row(block_type=-1), "unsupported block type -1"),
    # Beyond int, its cast would wrap onto Q5_K, the weight's own type.
    (lambda: one_row(block_type=(1 << 32) + 13), "unsupported block type 4294967309"),
    (lambda: one_row(bits=0), "activation_bits must be 8 or 16, not 0"),
    (lambda: one_row(bits=32), "activation_bits must be 8 or 16, not 32"),
    (lambda: one_row(bits=-8), "activation_bits must be 8 or 16, not -8"),
    (lambda: block_linear(torch.zeros(1, 256), torch.zeros(0, dtype=torch.uint8), out_features=-4),
     "out_features is negative: -4"),
    (lambda: block_linear(torch.zeros(()), q5_k_weight(4, 256)), "x must have a dimension to multiply along"),
    (lambda: block_linear(torch.zeros(1, 256, dtype=torch.float64), q5_k_weight(4, 256)),
     "x must be contiguous float32"),
    (lambda: block_linear(torch.zeros(256, 2).t(), q5_k_weight(4, 256)), "x must be contiguous float32"),
    (lambda: block_linear(torch.zeros(1, 256), q5_k_weight(4, 256).to(torch.int8)), "weight must be contiguous uint8"),
    (lambda: one_row(variant=4), "unknown kernel variant 4"),
    (lambda: one_row(variant=-1), "unknown kernel variant -1"),
], ids=["a byte short", "more rows than bytes", "a tile a byte short", "width not whole blocks",
        "width not whole K blocks", "width 0", "Q8_1", "negative type", "type beyond int", "0 bits", "32 bits",
        "negative bits", "negative rows", "no dimension", "float64", "not contiguous", "int8 weight",
        "variant 4", "variant -1"])
def test_the_operator_refuses_inputs_it_cannot_multiply(call, message):
    with pytest.raises(RuntimeError, match=f"^llama_chat: {re.escape(message)}"):
        call()


@pytest.mark.needs_kernels
def test_the_operator_runs_exactly_the_variants_it_reports():
    """Each variant number runs where supported_variants has its bit, and is refused by
    name of the cause where it does not (on a CPU without AVX-512, say)."""
    supported = torch.ops.llama_chat.supported_variants()
    for number, name in enumerate(native.variant_names()):
        if supported >> number & 1:
            assert torch.equal(one_row(variant=number), torch.zeros(1, 4)), name
        else:
            with pytest.raises(RuntimeError, match=f"this CPU cannot run kernel variant {number}"):
                one_row(variant=number)
    runnable = [name for number, name in enumerate(native.variant_names()) if supported >> number & 1]
    assert native.runnable_variants() == runnable


NAMES = "use portable, avx2, avx512-vnni, avx512-amx, or unset it"


@pytest.mark.needs_kernels
@pytest.mark.parametrize("forced, message", [
    ("avx9", f"LLAMA_CHAT_KERNEL_VARIANT='avx9' names no kernel variant: {NAMES}"),
    ("AVX2", f"LLAMA_CHAT_KERNEL_VARIANT='AVX2' names no kernel variant: {NAMES}"),
    ("", f"LLAMA_CHAT_KERNEL_VARIANT='' names no kernel variant: {NAMES}"),
    ("avx512-vnni", "LLAMA_CHAT_KERNEL_VARIANT='avx512-vnni': this CPU cannot run it; it runs portable, avx2"),
])
def test_a_forced_variant_that_cannot_run_is_one_line_at_the_command_line(tmp_path, monkeypatch, capsys, forced,
                                                                          message):
    """An unknown name, an empty one, or a variant this CPU lacks (the library is made to
    report an AVX2 machine's variants): one line on stderr, exit 1, no reply."""
    from llama_chat.cli import main

    model = write_gguf(tmp_path / "q8_0.gguf", tiny_hf_model(seed=5), qtype=QType.Q8_0)
    monkeypatch.setattr(native, "runnable_variants", lambda: ["portable", "avx2"])
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_VARIANT", forced)
    assert main(["-m", str(model), "-p", "hello", "--max-tokens", "2", "--compile", "off"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"llama-chat: {message}\n"


def test_a_forced_variant_without_the_kernels_is_one_line_not_a_quiet_fallback(tmp_path, monkeypatch, capsys):
    from llama_chat.cli import main

    model = write_gguf(tmp_path / "q8_0.gguf", tiny_hf_model(seed=5), qtype=QType.Q8_0)
    monkeypatch.setenv("LLAMA_CHAT_KERNELS_DIR", str(tmp_path / "none-built"))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_VARIANT", "avx2")
    assert main(["-m", str(model), "-p", "hello", "--max-tokens", "2", "--compile", "off"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "llama-chat: LLAMA_CHAT_KERNEL_VARIANT='avx2', but llama-chat's kernels are not in use: "
        "no C++ compiler (no-such-compiler) found; install g++ or clang to build llama-chat's kernels\n"
    )
    monkeypatch.setenv("LLAMA_CHAT_KERNELS", "aten")  # asked for, PyTorch's kernels run whatever variant is named
    assert main(["-m", str(model), "-p", "hello", "--max-tokens", "2", "--compile", "off"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


@pytest.mark.parametrize("quantise, qtype, tolerance", [(q8_0_blocks, QType.Q8_0, 1 / 254), (q4_1_blocks, QType.Q4_1, 1 / 30)])
def test_float_weights_quantise_into_blocks_gguf_reads(quantise, qtype, tolerance):
    """Q8_0 and Q4_1 written from float32: gguf's dequantisation gives each weight back
    within half a step (plus float16 rounding of the scales)."""
    weight = torch.randn(9, 96, generator=torch.Generator().manual_seed(4))
    raw = quantise(weight).numpy()
    back = torch.from_numpy(quants.dequantize(raw, qtype).reshape(9, 96))
    groups = weight.view(9, -1, 32)
    spread = (groups.amax(-1) - groups.amin(-1)) if qtype == QType.Q4_1 else groups.abs().amax(-1) * 2
    error = (back - weight).abs().view(9, -1, 32).amax(-1)
    assert (error <= spread * tolerance * 1.01 + 1e-3 * spread).all()


@pytest.mark.needs_kernels
def test_block_linear_keeps_file_blocks_byte_for_byte_and_quantises_floats():
    stored = stored_blocks("Q6_K", 16, 256, 0)
    raw = stored.blocks(0, 16)
    layer = BlockLinear(stored, "Q6_K", native.variant_number("portable"))
    assert torch.equal(file_blocks(layer), raw)
    assert layer.blocks.numel() == raw.numel()  # the file's size: rows rearranged, nothing added
    weight = torch.randn(15, 256)
    floats = BlockLinear(TensorMatrix.of(weight), "Q8_0", native.variant_number("portable"))
    assert floats.blocks.shape == (1, 16 * 256 // 32 * 34)  # a tile of 15 rows and one of zeros
    assert torch.equal(file_blocks(floats), q8_0_blocks(weight))
    x = torch.randn(1, 4, 256)
    assert layer(x).shape == (1, 4, 16)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("block_type", TYPES)
def test_an_embedding_looks_up_each_tokens_row_from_the_arranged_blocks(block_type):
    """37 rows (a tile or row group padded), looked up in any order and repeated: each the
    file's row as gguf dequantises it, through the tiles or row groups it was arranged into."""
    stored = stored_blocks(block_type, 37, 512, seed=8)
    table = BlockLinear(stored, block_type, native.variant_number("portable"))
    ids = torch.tensor([36, 0, 17, 17, 5, 32, 15, 16])
    got = BlockEmbedding(table)(ids.view(2, 4))
    assert got.shape == (2, 4, 512) and got.dtype == torch.float32
    assert torch.equal(got.view(8, 512), stored.dense()[ids].float())


@pytest.mark.needs_kernels
def test_stacked_matrices_of_different_types_each_keep_their_own():
    """q and k in Q4_K beside v in Q6_K (as a Q4_K_M file has them): packed as they are,
    none widened to Q8_0, and the product that of the dequantised stack."""
    parts = [stored_blocks("Q4_K", 32, 256, 7), stored_blocks("Q4_K", 16, 256, 8), stored_blocks("Q6_K", 16, 256, 9)]
    stacked = StackedRows(parts)
    assert block_mode(stacked, "auto", None, "wqkv") == ("Q4_K", "Q4_K", "Q6_K")
    assert block_types({"wqkv": ("Q4_K", "Q4_K", "Q6_K"), "w2": "Q6_K"}) == ("Q4_K", "Q6_K")
    assert WeightsRecord(packed=True, block_types=("Q4_K", "Q6_K")).packing == "Q4_K and Q6_K"
    layer = StackedBlockLinear(stacked, native.variant_number(variants()[-1]))
    assert [(part.block_type, part.out_features) for part in layer.parts] == [("Q4_K", 48), ("Q6_K", 16)]
    x = torch.randn(3, 256)
    exact = x.double() @ torch.cat([p.rows(0, p.shape[0]) for p in parts]).double().t()
    assert ((layer(x).double() - exact).abs().max() / exact.abs().max()) < 1e-3


@pytest.mark.needs_kernels
def test_a_gguf_model_runs_on_the_kernels_in_each_variant(tmp_path, monkeypatch):
    """A tiny Q4_1 model through each variant: the same greedy tokens as the float32 model
    over a prompt step and single tokens."""
    path = write_gguf(tmp_path / "q4_1.gguf", tiny_hf_model(seed=5), qtype=QType.Q4_1)
    exact = llama_chat.load(path, device="cpu", dtype="float32")
    ids = list(range(3, 23))
    expected = exact.logits(ids)
    for variant in variants():
        monkeypatch.setenv("LLAMA_CHAT_KERNEL_VARIANT", variant)
        fast = llama_chat.load(path, options_from_environment(), device="cpu")
        assert fast.weights.packing == "Q4_1" and f"{variant} kernels" in fast.weights.note
        assert isinstance(fast.transformer.output, BlockLinear)  # the untied head, as the file holds it
        cache = fast.new_cache(64)
        first = fast.runner(cache, ids[:12])
        singles = [fast.runner(cache, [token]) for token in ids[12:]]
        got = torch.stack([first, *singles])
        assert torch.allclose(got, expected[11:], atol=0.05 * float(expected.abs().max())), variant


@pytest.mark.needs_kernels
@pytest.mark.parametrize("qtype, tied", [(QType.Q5_0, False), (QType.Q5_1, False), (QType.Q8_0, True)],
                         ids=["Q5_0", "Q5_1", "Q8_0-tied"])
def test_a_gguf_files_five_and_eight_bit_matrices_are_held_in_their_own_type(tmp_path, monkeypatch, qtype, tied):
    """A tiny model that gguf's quantiser wrote as Q5_0 (Q5_1, Q8_0 with its embedding tied
    to the head): every matrix, the embedding and the head too, is held in tiles of the
    file's blocks at the file's size (not widened to Q8_0; a tied
    table once, both the embedding and the head), and each variant's logits over a prompt
    step and single tokens are the float model's."""
    path = write_gguf(tmp_path / f"{qtype.name}.gguf", tiny_hf_model(seed=7, tie_word_embeddings=tied), qtype=qtype)
    exact = llama_chat.load(path, device="cpu", dtype="float32")
    ids = list(range(3, 23))
    expected = exact.logits(ids)
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert ("output.weight" in stored) != tied

    def held_as_stored(layer, name):  # the file's bytes, rows padded to a whole tile (the table's 268 to 272)
        file_rows = torch.from_numpy(np.array(stored[name].data)).view(torch.uint8).view(layer.out_features, -1)
        padded_rows = -(-layer.out_features // TILE_ROWS) * TILE_ROWS
        return layer.block_type == qtype.name and torch.equal(file_blocks(layer), file_rows) \
            and layer.blocks.numel() == padded_rows * file_rows.shape[1]

    for variant in variants():
        monkeypatch.setenv("LLAMA_CHAT_KERNEL_VARIANT", variant)
        fast = llama_chat.load(path, options_from_environment(), device="cpu")
        assert fast.weights.packing == qtype.name and f"{variant} kernels" in fast.weights.note
        w2 = fast.transformer.layers[1].feed_forward.w2
        assert isinstance(w2, BlockLinear) and held_as_stored(w2, "blk.1.ffn_down.weight")
        table = fast.transformer.tok_embeddings.table
        assert held_as_stored(table, "token_embd.weight")
        assert (fast.transformer.output is table) == tied
        if not tied:
            assert held_as_stored(fast.transformer.output, "output.weight")
        cache = fast.new_cache(64)
        first = fast.runner(cache, ids[:12])
        singles = [fast.runner(cache, [token]) for token in ids[12:]]
        got = torch.stack([first, *singles])
        # measured: within 0.08% of the largest logit (16-bit activations on exact weights)
        assert torch.allclose(got, expected[11:], atol=0.01 * float(expected.abs().max())), variant


def test_without_a_compiler_the_aten_kernels_run_and_say_why(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CHAT_KERNELS_DIR", str(tmp_path / "none-built"))
    monkeypatch.setenv("CXX", "no-such-compiler")
    configure_folders()
    state = native_state.load_or_build(kernel_options(), wait=True)
    assert not state.loaded and state.wanting  # worth a line at start-up
    assert state.detail == "no C++ compiler (no-such-compiler) found; install g++ or clang to build llama-chat's kernels"
    from llama_chat.kernels.cpu_paths import choose_native

    variant, reason = choose_native(tiny_args(), kernel_options())
    assert variant is None and "no C++ compiler" in reason
    monkeypatch.setenv("LLAMA_CHAT_KERNELS", "aten")
    assert not native_state.status(kernel_options()).wanting  # off by choice: nothing to say at start-up


def test_a_chat_without_a_compiler_answers_on_pytorch_kernels_with_one_line(tmp_path):
    """A one-shot chat on a Q4_1 file, with no compiler to be found (an empty PATH) and
    nothing built: it answers, on PyTorch's kernels, and one line says why."""
    path = write_gguf(tmp_path / "q4_1.gguf", tiny_hf_model(seed=5), qtype=QType.Q4_1)
    (tmp_path / "no-programs").mkdir()
    variables = {**os.environ, "PATH": str(tmp_path / "no-programs"), "LLAMA_CHAT_CACHE": str(tmp_path / "cache"),
                 "LLAMA_CHAT_KERNELS_DIR": str(tmp_path / "kernels")}
    for inherited in ("CXX", "LLAMA_CHAT_KERNELS", environment.LOADED_LIBRARY):
        variables.pop(inherited, None)
    command = [sys.executable, "-m", "llama_chat", "--model", str(path), "-p", "hi", "--max-tokens", "4",
               "--temperature", "0"]  # greedy: a sampled end-of-turn token would leave no reply to see
    result = subprocess.run(command, env=variables, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the reply
    assert result.stderr.splitlines() == [
        "llama-chat: PyTorch's kernels run: no C++ compiler (c++) found; install g++ or clang to build llama-chat's kernels"
    ]
    assert "Traceback" not in result.stdout


def test_the_status_query_builds_and_loads_nothing(tmp_path, monkeypatch):
    """Asked where nothing is built, the status says so (or why nothing can be), and no
    build starts: only load_or_build starts one."""
    monkeypatch.setenv("LLAMA_CHAT_KERNELS_DIR", str(tmp_path / "kernels"))
    configure_folders()
    native_build._started_build.cache_clear()
    monkeypatch.setattr(native, "loaded", lambda: False)  # as in a process that has loaded no build
    state = native_state.status()
    assert not state.loaded and state.detail == (native_build.missing_tools() or "not built yet")
    assert native_build.started_build() is None and not (tmp_path / "kernels").exists()


def test_a_failed_build_is_one_line_and_remembered(tmp_path, monkeypatch):
    """A compiler that fails: one line naming the failure, recorded so later runs do not
    build again; the aten kernels run meanwhile."""
    compiler = tmp_path / "broken-c++"
    compiler.write_text("#!/bin/sh\necho 'error: this compiler is broken' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("LLAMA_CHAT_KERNELS_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("CXX", str(compiler))
    configure_folders()
    first = native_state.load_or_build(wait=True)
    assert not first.loaded and first.detail.startswith("build failed: ") and first.wanting
    assert "\n" not in first.detail
    again = native_state.load_or_build(wait=True)
    assert again.detail.startswith("build failed: ") and "to try again now" in again.detail and again.wanting
    # A day later it is tried again (and fails again, with this compiler).
    marker = next((tmp_path / "kernels").glob("*/build-failed.txt"))
    old = marker.stat().st_mtime - native_files.RETRY_FAILED_BUILD_SECONDS - 1
    os.utime(marker, (old, old))
    native_build._started_build.cache_clear()
    retried = native_state.load_or_build(wait=True)
    assert retried.detail.startswith("build failed: ") and marker.stat().st_mtime > old + 3600


@pytest.mark.needs_kernels
def test_a_damaged_build_is_removed_and_built_again(kernels_dir, tmp_path):
    """A truncated library in the kernels folder (loading it would kill the process): one
    line says so, and a new build replaces it (in a new process: this one has loaded the
    good build already)."""
    build = next(folder for folder in kernels_dir.iterdir() if native_files.library_file(folder).exists())
    shutil.copytree(build, tmp_path / build.name)
    library = native_files.library_file(tmp_path / build.name)
    library.write_bytes(library.read_bytes()[:4096])
    variables = {**os.environ, "LLAMA_CHAT_KERNELS_DIR": str(tmp_path)}
    variables.pop(environment.LOADED_LIBRARY, None)
    script = ("from llama_chat.cli.options import configure_folders; from llama_chat.kernels import native_state; "
              "configure_folders(); s = native_state.load_or_build(wait=True); print(s.loaded, s.detail)")
    result = subprocess.run([sys.executable, "-c", script], env=variables, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"True {library.name} was not the file its build wrote, and was removed; built again; " \
        f"variants here: {', '.join(native.runnable_variants())}\n"
    assert library.stat().st_size > 4096


@pytest.mark.needs_kernels
def test_a_gguf_file_keeps_its_blocks_and_is_read_once_in_bounded_pieces(tmp_path, monkeypatch):
    """Each matrix of a Q4_1 file is held as the file's bytes (q and k rows reordered for
    the half-split rotary layout, nothing else), read in pieces of at most a chunk."""
    from llama_chat.checkpoints import gguf_tensors as gguf_reader
    from llama_chat.kernels import block_linear

    path = write_gguf(tmp_path / "q4_1.gguf", tiny_hf_model(seed=6), qtype=QType.Q4_1)
    reads = []
    original = gguf_reader.GGUFMatrix.blocks

    def recording(self, start, stop):
        reads.append((self.tensor.name, start, stop, self.shape[1]))
        return original(self, start, stop)

    monkeypatch.setattr(gguf_reader.GGUFMatrix, "blocks", recording)
    monkeypatch.setattr(block_linear, "CHUNK_WEIGHTS", 2048)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    assert all(stop - start <= max(2048 // columns, 1) * 2 + 16 for _, start, stop, columns in reads)
    w2 = model.transformer.layers[1].feed_forward.w2
    info = gguf.GGUFReader(path).tensors
    stored = next(t for t in info if t.name == "blk.1.ffn_down.weight")
    assert torch.equal(file_blocks(w2), torch.from_numpy(np.array(stored.data)).view(torch.uint8).view(w2.out_features, -1))


@pytest.mark.needs_kernels
def test_a_child_process_loads_the_library_its_parent_loaded(tmp_path):
    """The decode step's compiler unpickles the model in a child process: it loads the file
    its parent loaded, even with no build of the sources on disk for its own key."""
    assert native.load_built()
    child = environment.child_environment(LLAMA_CHAT_KERNELS_DIR=str(tmp_path / "nothing-built"))
    imports = ("from llama_chat.cli.options import configure_folders; from llama_chat.kernels import native; "
               "import torch; configure_folders()")
    code = f"{imports}; print(native.load_built(), torch.ops.llama_chat.supported_variants() > 0)"
    result = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.split() == ["True", "True"]
    del child[environment.LOADED_LIBRARY]
    alone = subprocess.run([sys.executable, "-c", f"{imports}; print(native.load_built())"], env=child,
                           capture_output=True, text=True, check=True)
    assert alone.stdout.split() == ["False"]


def test_the_probe_times_one_matrix_of_random_blocks_on_both_families():
    """The probe's layer is random Q4_1 blocks read as a file's: our kernels and PyTorch's
    packed ones multiply the same weights as gguf's own dequantisation gives them."""
    from llama_chat.kernels.cpu_probe import RandomBlocks
    from llama_chat.kernels.packed import PackedLinear, Scratch, int4_layout

    source = RandomBlocks(64, 128)
    weights = torch.from_numpy(quants.dequantize(source.blocks(0, 64).numpy(), QType.Q4_1)).view(64, 128)
    assert torch.isfinite(weights).all() and weights.std() > 0
    x = torch.randn(5, 128, dtype=torch.float64)
    expected = (x @ weights.double().t()).float()
    largest = float(expected.abs().max())
    native.load_built()
    for variant in variants():
        ours = BlockLinear(source, "Q4_1", native.variant_number(variant))(x.float())
        assert torch.allclose(ours, expected, atol=1e-3 * largest), variant
    # int4 keeps the levels; int8 rows (where PyTorch has no int4 kernel) round them again
    mode, within = ("int4", 1e-3) if int4_layout() is not None else ("int8", 2e-2)
    theirs = PackedLinear(source, mode, Scratch(), torch.float32, kernel_rows=1)
    assert torch.allclose(theirs(x[:1].float()), expected[:1], atol=within * largest)  # the packed kernel
    assert torch.allclose(theirs(x.float()), expected, atol=within * largest)  # dequantised and multiplied
