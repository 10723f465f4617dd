"""Packed weights: GGUF's 4-bit blocks, the int4 kernel's layout, every cpu path against float32."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat import Llama
from llama_chat.checkpoints.gguf_blocks import int4_groups
from llama_chat.checkpoints.stored import Int4Groups, TensorMatrix
from llama_chat.cli.options import configure_folders
from llama_chat.engine.model import Transformer
from llama_chat.environment import kernel_options
from llama_chat.errors import LlamaChatError
from llama_chat.kernels.cpu_paths import choose_cpu_paths
from llama_chat.kernels.packed import (
    GROUP,
    Int8Table,
    PackedLinear,
    Scratch,
    int4_layout,
    int8_rows,
    pack_int4,
)
from llama_chat.kernels.probe_times import Timing

from .loading_helpers import options_from_environment
from .test_gguf import IDS, tiny_hf_model, write_gguf


@pytest.fixture(autouse=True)
def _pytorch_kernels(monkeypatch):
    """These tests cover the packing for PyTorch's kernels, what runs where llama-chat's
    own cannot be built (tests/test_kernels.py covers those)."""
    monkeypatch.setenv("LLAMA_CHAT_KERNELS", "aten")

CAPABILITIES = ["default", "avx2", "avx512"]


def random_blocks(qtype: QType, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Random raw blocks of a 4-bit GGUF type, with finite float16 scales."""
    block_bytes, block_weights = {QType.Q4_0: (18, 32), QType.Q4_1: (20, 32), QType.Q4_K: (144, 256)}[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, columns // block_weights * block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    for start in (0,) if qtype == QType.Q4_0 else (0, 2):
        scales = (rng.random(len(blocks)) * 0.1 + 0.001).astype(np.float16)
        blocks[:, start : start + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("qtype", [QType.Q4_0, QType.Q4_1, QType.Q4_K])
def test_four_bit_blocks_become_exact_int4_groups(qtype):
    raw = random_blocks(qtype, 6, 512)
    groups = int4_groups(raw, qtype.name, 512)
    expected = gguf.quants.dequantize(raw, qtype).reshape(6, 512)
    assert groups.levels.dtype == torch.uint8 and int(groups.levels.max()) <= 15
    assert np.array_equal(groups.dequantize().numpy(), expected)


def exact_groups(rows: int, columns: int, seed: int = 0) -> Int4Groups:
    generator = torch.Generator().manual_seed(seed)
    levels = torch.randint(0, 16, (rows, columns), generator=generator, dtype=torch.uint8)
    scales = (torch.rand(rows, columns // GROUP, generator=generator) * 0.1 + 0.01).bfloat16().float()
    zeros = (torch.randn(rows, columns // GROUP, generator=generator) * 0.1).bfloat16().float()
    return Int4Groups(levels, scales, zeros)


class GroupsMatrix(TensorMatrix):
    """A stored matrix whose rows come as exact 4-bit groups, as a Q4 GGUF file's do."""

    four_bit = True

    def __init__(self, groups: Int4Groups) -> None:
        super().__init__(tuple(groups.levels.shape), lambda start, stop: Int4Groups(
            groups.levels[start:stop], groups.scales[start:stop], groups.zeros[start:stop]), 0)


LAYOUT_CHECK = """
import torch
from llama_chat.kernels.packed import int4_layout, pack_int4
layout = int4_layout()
levels = torch.randint(0, 16, (192, 96), dtype=torch.uint8)
unpacked = layout.unpack_transposed(pack_int4(levels), torch.empty(96, 192)).t()
print(torch.backends.cpu.get_cpu_capability(), layout.block, layout.pairs, torch.equal(unpacked, levels.float()))
"""


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_int4_layout_is_read_off_each_cpu_capability(capability):
    # ATEN_CPU_CAPABILITY picks the kernels PyTorch dispatches to, so each layout the
    # kernel has can be checked on any machine that has at least that capability.
    result = subprocess.run([sys.executable, "-c", LAYOUT_CHECK], capture_output=True, text=True,
                            env={**os.environ, "ATEN_CPU_CAPABILITY": capability})
    assert result.returncode == 0, result.stderr
    reported, block, pairs, round_trip = result.stdout.split()
    if reported.lower() != capability:
        assert capability == "avx512"  # this CPU lacks it; PyTorch fell back to a lesser one
    assert round_trip == "True" and int(block) in (32, 64)


@pytest.mark.parametrize("kernel_dtype", [torch.bfloat16, torch.float32])
def test_int4_groups_pack_without_loss_on_both_paths(kernel_dtype):
    groups = exact_groups(128, 96)
    layer = PackedLinear(GroupsMatrix(groups), "int4", Scratch(), kernel_dtype)
    weight = groups.dequantize()
    torch.testing.assert_close(layer.dequantize(torch.float32), weight, atol=0, rtol=0)
    x = torch.randn(1, 96)
    exact = x.double() @ weight.double().t()
    one_row = layer(x).double()  # the packed kernel
    tolerance = 1e-4 if kernel_dtype == torch.float32 else 2e-2
    assert (one_row - exact).abs().max() <= tolerance * exact.abs().max()
    many = layer(torch.cat([x, torch.randn(4, 96)])).double()[:1]  # the dequantised matrix
    assert (many - exact).abs().max() <= 1e-5 * exact.abs().max()


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_layer_in_another_dtype_computes_as_one_packed_in_it(mode):
    weight = torch.randn(64, 96)
    packed_once = PackedLinear(TensorMatrix.of(weight), mode, Scratch(), torch.float32).in_dtype(torch.bfloat16)
    packed_in_it = PackedLinear(TensorMatrix.of(weight), mode, Scratch(), torch.bfloat16,
                                matmul_dtype=torch.bfloat16)
    assert packed_once.kernel_dtype == packed_once.matmul_dtype == torch.bfloat16
    x = torch.randn(5, 96)
    for rows in (x[:1], x):  # the packed kernel, and the dequantised matrix
        expected = packed_in_it(rows).double()  # the same products, within bfloat16's rounding
        assert (packed_once(rows).double() - expected).abs().max() <= 2e-2 * expected.abs().max()


@pytest.mark.parametrize("seed", range(5))
def test_int8_rows_stay_within_half_a_step(seed):
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(seed))
    for scale_dtype in (torch.bfloat16, torch.float32):
        levels, scales = int8_rows(weight, scale_dtype)
        assert scales.dtype == scale_dtype
        step = weight.abs().amax(dim=1, keepdim=True) / 127
        error = (levels.float() * scales.float()[:, None] - weight).abs()
        assert (error <= 0.5 * step * (1 + 2**-7)).all()
        assert error.mean() < 0.3 * step.mean()


def test_head_logits_are_float32_not_rounded_to_the_activation_dtype():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 64, generator=generator)
    table = Int8Table(TensorMatrix.of(weight), Scratch())
    x = (torch.randn(1, 64, generator=generator) * 4).bfloat16()
    logits = table.logits(x)
    exact = x.double() @ table.rows(torch.arange(300), torch.float64).t()
    assert logits.dtype == torch.float32
    assert (logits.double() - exact).abs().max() <= 1e-5 * exact.abs().max()
    assert not torch.equal(logits, logits.bfloat16().float())  # not on bfloat16's grid
    # Each weight within half a step of its group of 32.
    step = weight.view(300, -1, GROUP).abs().amax(-1, keepdim=True) / 127
    stored = table.rows(torch.arange(300), torch.float32).view(300, -1, GROUP)
    assert ((stored - weight.view(300, -1, GROUP)).abs() <= 0.5 * step * (1 + 1e-6)).all()


def test_a_q8_0_table_is_held_exactly():
    """GGUF Q8_0: levels -127..127 (the largest magnitude of a group at 127) times a float16 scale."""
    generator = torch.Generator().manual_seed(1)
    levels = torch.randint(-126, 127, (40, 96), generator=generator)
    levels[:, ::GROUP] = 127 * torch.randint(0, 2, (40, 3), generator=generator) * 2 - 127
    scales = (torch.rand(40, 3, generator=generator) * 0.01).half().float()
    weight = (levels.view(40, 3, GROUP) * scales[..., None]).view(40, 96)
    table = Int8Table(TensorMatrix.of(weight), Scratch())
    assert torch.equal(table.rows(torch.arange(40), torch.float32), weight)
    assert torch.equal(table.levels.long(), levels)


def dense_reference(model: Llama) -> Llama:
    """A float32 model whose weights are exactly what the packed model multiplies by."""
    packed = model.transformer
    reference = Transformer(model.args)
    state = {}
    for name, module in packed.named_modules():
        if isinstance(module, PackedLinear):
            state[name + ".weight"] = module.dequantize(torch.float32).clone()
    for name, parameter in packed.named_parameters():
        state[name] = parameter.float()
    table = packed.tok_embeddings.table
    state["tok_embeddings.weight"] = table.rows(torch.arange(table.vocab_size), torch.float32)
    state["output.weight"] = packed.output.table.rows(torch.arange(table.vocab_size), torch.float32)
    reference.load_state_dict(state, strict=True)
    return Llama(reference, model.tokenizer)


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("q4") / "q4.gguf", tiny_hf_model(seed=3), qtype=QType.Q4_1)


@pytest.mark.parametrize("quantize", ["int4", "int8"])
@pytest.mark.parametrize("matmul", ["bfloat16", "float32"])
@pytest.mark.parametrize("kernel", ["bfloat16", "float32"])
@pytest.mark.parametrize("kernel_rows", ["1", "512"])
def test_every_path_matches_float32_with_the_same_weights(q4_file, quantize, matmul, kernel, kernel_rows,
                                                           monkeypatch):
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_ROWS", kernel_rows)  # the prompt step dequantises, or not
    model = llama_chat.load(q4_file, options_from_environment(), device="cpu", quantize=quantize, dtype=matmul,
                            kernel_dtype=kernel)
    assert model.weights.packing == quantize and model.dtype == torch.float32  # activations and cache
    assert model.transformer.layers[0].feed_forward.w13.matmul_dtype == getattr(torch, matmul)
    reference = dense_reference(model).logits(IDS)
    cache = model.new_cache(64)
    prompt = model.runner(cache, IDS[:12])  # a prompt step: dequantised matrices or the kernels
    steps = [model.runner(cache, [token]) for token in IDS[12:]]  # single tokens: packed kernels
    logits = torch.stack([prompt, *steps])
    assert logits.dtype == torch.float32
    # float32 throughout agrees to float32 rounding; bfloat16 products to their own.
    tolerance = 1e-4 if (matmul, kernel) == ("float32", "float32") else 0.02
    assert (logits - reference[11:]).abs().max() <= tolerance * reference.abs().max()
    assert (logits.argmax(-1) == reference[11:].argmax(-1)).float().mean() >= 0.85


def test_a_four_bit_file_packs_into_int4_and_keeps_its_levels(q4_file):
    model = llama_chat.load(q4_file, options_from_environment(), device="cpu", dtype="bfloat16", kernel_dtype="float32")
    exact = llama_chat.load(q4_file, options_from_environment(), device="cpu", dtype="float32", quantize="none")
    assert model.weights.packing == "int4"
    wqkv = exact.transformer.layers[0].attention.wqkv.weight
    packed = model.transformer.layers[0].attention.wqkv.dequantize(torch.float32)
    torch.testing.assert_close(packed, wqkv, atol=1e-6, rtol=0)


def test_forced_paths_skip_the_probe_and_say_so(monkeypatch):
    from llama_chat.kernels import cpu_probe

    def no_measuring(*_):
        raise AssertionError("measured although every choice was forced")

    monkeypatch.setattr(cpu_probe, "measure_dtypes", no_measuring)
    monkeypatch.setattr(cpu_probe, "measure_rows", no_measuring)
    monkeypatch.setenv("LLAMA_CHAT_DTYPE", "float32")
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_DTYPE", "bfloat16")
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_ROWS", "7")
    paths = choose_cpu_paths(tiny_args_for_probe(), "int4", kernel_options())
    assert (paths.matmul_dtype, paths.kernel_dtype, paths.kernel_rows) == (torch.float32, torch.bfloat16, 7)
    assert "forced" in paths.describe()
    with pytest.raises(LlamaChatError, match="float16"):
        choose_cpu_paths(tiny_args_for_probe(), "int4", replace(kernel_options(), matmul_dtype=torch.float16))
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_ROWS", "0")
    with pytest.raises(LlamaChatError, match="LLAMA_CHAT_KERNEL_ROWS"):
        choose_cpu_paths(tiny_args_for_probe(), "int4", kernel_options())


def tiny_args_for_probe():
    from .conftest import tiny_args

    return tiny_args(dim=64, n_heads=4, hidden_dim=96)


def test_the_probe_is_measured_once_and_its_choices_follow_the_times(monkeypatch, tmp_path, capsys):
    from llama_chat.kernels import cpu_probe

    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path))
    configure_folders()
    calls = []

    def fake_dtypes(args, mode):
        calls.append(mode)
        # Per call: a 64-row prompt step, and one row through the packed kernel.
        return {Timing("prompt steps", 64, torch.bfloat16): 3.0, Timing("prompt steps", 64, torch.float32): 1.0,
                Timing("kernels", 1, torch.bfloat16): 0.1, Timing("kernels", 1, torch.float32): 0.9}

    def fake_rows(args, mode, compute, kernel):
        calls.append((compute, kernel))
        # kernel: 0.1 s a row; dequantise and multiply: 2.0 s and 0.02 s a row.
        return {Timing("kernel", 16): 1.6, Timing("kernel", 256): 25.6, Timing("dequantise", 16): 2.32,
                Timing("dequantise", 256): 7.12}

    monkeypatch.setattr(cpu_probe, "measure_dtypes", fake_dtypes)
    monkeypatch.setattr(cpu_probe, "measure_rows", fake_rows)
    first = choose_cpu_paths(tiny_args_for_probe(), "int4")
    second = choose_cpu_paths(tiny_args_for_probe(), "int4")
    assert calls == ["int4", (torch.float32, torch.bfloat16)]  # the second came from the cache file
    assert first == second
    assert (first.matmul_dtype, first.kernel_dtype) == (torch.float32, torch.bfloat16)
    assert first.kernel_rows == 25  # the lines cross at 2.0 / (0.1 - 0.02) rows
    assert "3.0x faster in float32" in first.describe() and "9.0x faster in bfloat16" in first.describe()
    capsys.readouterr()
    (tmp_path / "cpu-paths.json").write_text("{not json")
    choose_cpu_paths(tiny_args_for_probe(), "int4")
    assert len(calls) == 4  # a damaged cache is measured again, not an error, with one line
    err = capsys.readouterr().err
    assert "cpu-paths.json did not read back (" in err and "measuring again" in err and err.count("\n") == 1
    assert json.loads((tmp_path / "cpu-paths.json").read_text())
    assert [path.name for path in tmp_path.iterdir()] == ["cpu-paths.json"]  # nothing half-written left


def test_probe_times_are_kept_as_readable_records_and_old_entries_measured_again(monkeypatch, tmp_path):
    from llama_chat.kernels import probe_times
    from llama_chat.kernels.probe_times import Probe, remembered

    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path))
    configure_folders()
    probe = Probe("rows", "int4", (64, 192), ("float32", "bfloat16"))
    times = {Timing("kernel", 16): 1.5, Timing("prompt steps", 64, torch.bfloat16): 0.25}
    calls = []

    def measure():
        calls.append(1)
        return times

    table = tmp_path / probe_times.PROBE_FILE
    table.write_text(json.dumps({probe.label(): {"kernel 16": 1.5, "prompt steps bfloat16": 0.25}}))  # the old form
    assert remembered(probe, measure, frozenset(times)) == times and len(calls) == 1
    assert json.loads(table.read_text()) == {probe.label(): [
        {"path": "kernel", "rows": 16, "seconds": 1.5},
        {"path": "prompt steps", "rows": 64, "seconds": 0.25, "dtype": "bfloat16"},
    ]}
    assert remembered(probe, measure, frozenset(times)) == times and len(calls) == 1  # read back, typed


def test_a_probe_file_nested_past_parsing_is_measured_again(monkeypatch, tmp_path, capsys):
    from llama_chat.kernels import probe_times
    from llama_chat.kernels.probe_times import Probe, remembered

    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path))
    configure_folders()
    table = tmp_path / probe_times.PROBE_FILE
    table.write_text("[" * 200_000 + "]" * 200_000)  # json alone would end in RecursionError
    times = {Timing("kernel", 16): 1.5}
    assert remembered(Probe("rows", "int4", (64, 192)), lambda: times, frozenset(times)) == times
    err = capsys.readouterr().err
    assert "nested more than" in err and "measuring again" in err and err.count("\n") == 1
    assert json.loads(table.read_text())  # written anew


def test_real_probe_times_every_candidate():
    from llama_chat.kernels.cpu_probe import measure_dtypes, measure_rows

    mode = "int4" if int4_layout() else "int8"
    times = measure_dtypes(tiny_args_for_probe(), mode)
    times.update(measure_rows(tiny_args_for_probe(), mode, torch.float32, torch.bfloat16))
    assert set(times) == {Timing("prompt steps", 64, torch.bfloat16), Timing("prompt steps", 64, torch.float32),
                          Timing("kernels", 1, torch.bfloat16), Timing("kernels", 1, torch.float32),
                          Timing("kernel", 16), Timing("kernel", 256), Timing("dequantise", 16),
                          Timing("dequantise", 256)}
    assert all(0 < t < 1 for t in times.values())


def test_int4_refusals_name_the_matrix(tmp_path):
    from .conftest import tiny_args

    model = Llama.random(tiny_args(dim=48, hidden_dim=80))
    with pytest.raises(LlamaChatError, match="int4"):
        weight = TensorMatrix.of(model.transformer.layers[0].feed_forward.w2.weight.detach())
        from llama_chat.kernels.quantize import matrix_mode

        matrix_mode(weight, "int4", None, "layers.0.feed_forward.w2.weight")


def test_pack_int4_of_row_ranges_joins_to_the_whole():
    levels = torch.randint(0, 16, (256, 64), dtype=torch.uint8)
    block = int4_layout().block
    parts = [pack_int4(levels[start : start + block]) for start in range(0, 256, block)]
    assert torch.equal(torch.cat(parts), pack_int4(levels))


def test_a_load_reads_each_matrix_once_a_bounded_block_of_rows_at_a_time(q4_file, monkeypatch):
    from llama_chat.checkpoints.gguf_tensors import GGUFMatrix
    from llama_chat.kernels import packed

    monkeypatch.setattr(packed, "CHUNK_WEIGHTS", 4096)
    reads = []
    original = GGUFMatrix.rows

    def recording(self, start, stop):
        reads.append((self.tensor.name, start, stop, self.shape[1]))
        return original(self, start, stop)

    monkeypatch.setattr(GGUFMatrix, "rows", recording)
    model = llama_chat.load(q4_file, options_from_environment(), device="cpu")
    # No read holds more than one block of rows: never a dense copy of a matrix, let alone the model.
    alignment = max(int4_layout().block, model.args.head_dim)  # the fewest rows a read may take
    assert all(stop - start <= max(alignment, 4096 // columns) for _, start, stop, columns in reads)
    covered = {}
    for name, start, stop, _ in reads:
        covered.setdefault(name, []).append((start, stop))
    for name, spans in covered.items():
        spans.sort()
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])), name  # once, in order
    assert len(covered) == 2 + 7 * model.args.n_layers  # embedding, head and every layer matrix


def test_a_file_wide_four_bit_hint_never_packs_another_type_to_int4(q4_file, tmp_path):
    # A Q4_1 file (the layers' most common type) with one Q8_0 matrix: that one keeps
    # its 8 bits; only float weights take the file's 4-bit hint.
    from .test_gguf import copy_gguf

    stored = next(t for t in gguf.GGUFReader(q4_file).tensors if t.name == "blk.0.ffn_down.weight")
    values = gguf.quants.dequantize(stored.data, stored.tensor_type)
    replacement = (gguf.quants.quantize(values, QType.Q8_0), QType.Q8_0)
    mixed = copy_gguf(q4_file, tmp_path / "mixed.gguf", {"blk.0.ffn_down.weight": replacement})
    model = llama_chat.load(mixed, options_from_environment(), device="cpu")
    assert model.weights.packing == "int4 and int8"
    assert model.transformer.layers[0].feed_forward.w2.mode == "int8"
    assert model.transformer.layers[0].feed_forward.w13.mode == "int4"
    assert model.transformer.layers[1].feed_forward.w2.mode == "int4"
