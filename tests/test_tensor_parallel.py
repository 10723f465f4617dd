"""Tensor parallelism: ranks spawned here with gloo, on tiny random models."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat.errors import LlamaChatError
from llama_chat.kernels import native
from llama_chat.parallel.sharding import Shard, check_divisible

from . import parallel_ranks
from .loading_helpers import options_from_environment
from .terminal import Terminal
from .test_gguf import tiny_hf_model, write_gguf

ROOT = Path(__file__).resolve().parent.parent


def rendezvous_store() -> dist.TCPStore:
    """A store the ranks meet at, as torchrun's agent holds one for its workers: listening
    on its port before any rank is told of it (a port found free and let go could be taken
    before the ranks bound it). Keep it until the ranks are done."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """6 key/value heads and a feed-forward width of 192: splits over 2 and 3 ranks."""
    model = tiny_hf_model(seed=5, hidden_size=96, intermediate_size=192, num_attention_heads=6,
                          num_key_value_heads=6)
    return write_gguf(tmp_path_factory.mktemp("tp") / "tiny.gguf", model, qtype=QType.F32)


@pytest.fixture(scope="module")
def alone(model_file):
    return parallel_ranks.run_alone(str(model_file))


@pytest.mark.parametrize("world", [2, 3])
def test_a_group_reproduces_one_process(model_file, alone, world, tmp_path):
    store = rendezvous_store()
    mp.start_processes(parallel_ranks.run, args=(world, store.port, str(model_file), str(tmp_path)),
                       nprocs=world, start_method="spawn")
    group = torch.load(tmp_path / "rank0.pt")
    assert torch.allclose(group["logits"], alone["logits"], atol=1e-4, rtol=0)
    assert group["greedy"] == alone["greedy"] and len(group["greedy"]) == 20
    assert group["turns"] == alone["turns"] and all(group["turns"])  # a cached conversation of 3 turns
    assert group["failed_load"].startswith("rank 0: ") and "missing.gguf" in group["failed_load"]
    assert group["greedy_after_failed_load"] == alone["greedy"]
    # Each rank holds only its share: whole key/value-head groups and a slice of the width.
    full = alone["shapes"]
    for rank in range(world):
        shapes = group["shapes"] if rank == 0 else torch.load(tmp_path / f"shapes-{rank}.pt")
        assert shapes["layers.0.attention.wqkv.weight"] == [(6 + 2 * 6) * 16 // world, 96]
        assert shapes["layers.0.attention.wo.inner.weight"] == [96, 96 // world]
        assert shapes["layers.0.feed_forward.w13.weight"] == [2 * 192 // world, 96]
        assert shapes["layers.0.feed_forward.w2.inner.weight"] == [96, 192 // world]
        assert shapes["tok_embeddings.weight"] == full["tok_embeddings.weight"]  # replicated


def test_shards_put_together_are_the_whole_model(model_file):
    whole = llama_chat.load(model_file, device="cpu", dtype="float32").transformer.state_dict()
    shards = [llama_chat.load(model_file, device="cpu", dtype="float32", shard=Shard(r, 2)).transformer.state_dict()
              for r in range(2)]
    q, kv = 6 * 16 // 2, 6 * 16 // 2
    for name in ("layers.1.attention.wqkv.weight",):
        parts = [s[name] for s in shards]
        rebuilt = torch.cat([torch.cat([p[:q] for p in parts]), torch.cat([p[q : q + kv] for p in parts]),
                             torch.cat([p[q + kv :] for p in parts])])
        assert torch.equal(rebuilt, whole[name])
    assert torch.equal(torch.cat([s["layers.1.attention.wo.inner.weight"] for s in shards], 1),
                       whole["layers.1.attention.wo.weight"])
    gate_up = [s["layers.1.feed_forward.w13.weight"] for s in shards]
    assert torch.equal(torch.cat([g[:96] for g in gate_up] + [g[96:] for g in gate_up]),
                       whole["layers.1.feed_forward.w13.weight"])
    assert torch.equal(torch.cat([s["layers.1.feed_forward.w2.inner.weight"] for s in shards], 1),
                       whole["layers.1.feed_forward.w2.weight"])


def test_what_does_not_divide_is_named():
    args = llama_chat.ModelArgs(dim=96, n_layers=1, n_heads=6, n_kv_heads=2, vocab_size=10, hidden_dim=192)
    with pytest.raises(LlamaChatError, match="2 key/value heads do not divide among 3 ranks"):
        check_divisible(args, 3)
    with pytest.raises(LlamaChatError, match="feed-forward width 192 does not split into 4"):
        check_divisible(llama_chat.ModelArgs(dim=96, n_layers=1, n_heads=8, n_kv_heads=8, vocab_size=10,
                                             hidden_dim=192), 4)


def run_group(world: int, out: Path, paths: list[Path], settings: dict[Path, dict] | None = None) -> list[dict]:
    """What rank 0 of a group of `world` ranks saw, loading each of `paths` in turn (see run_loads)."""
    settings = {str(path): value for path, value in (settings or {}).items()}
    store = rendezvous_store()
    arguments = (world, store.port, str(out), [str(p) for p in paths], settings)
    mp.start_processes(parallel_ranks.run_loads, args=arguments, nprocs=world, start_method="spawn")
    return torch.load(out / "rank0.pt")


def logits_gap(group: dict, alone: dict) -> float:
    return float((group["logits"] - alone["logits"]).abs().max())


def greedy_tokens(observed: dict) -> int:
    """Tokens of the greedy reply (its last piece may be the detokenizer's flush, no token)."""
    return sum(token is not None for token in observed["greedy"])


@pytest.fixture(scope="module")
def grouped_file(tmp_path_factory):
    """The default model's head layout (SmolLM2-135M: 9 query heads sharing 3 key/value heads)
    at a head size of 16, with a feed-forward width of 3 slices of 64."""
    model = tiny_hf_model(seed=8, hidden_size=144, intermediate_size=192, num_attention_heads=9,
                          num_key_value_heads=3)
    return write_gguf(tmp_path_factory.mktemp("tp-grouped") / "grouped.gguf", model, qtype=QType.F32)


def test_grouped_key_value_heads_split_over_three_ranks(grouped_file, tmp_path):
    """Each rank takes one key/value head with the 3 query heads that share it. Float32 on
    both sides: only the order of the all-reduced partial sums differs, a few float32
    roundings of logits of standard deviation 1 (measured: 3e-6), so 1e-4 leaves room for
    other CPUs' summation orders, while a misplaced head moves them by a large part of that."""
    [group] = run_group(3, tmp_path, [grouped_file])
    alone = parallel_ranks.run_alone_with(str(grouped_file), parallel_ranks.FLOAT32)
    assert group["error"] is None and group["quantization"] == alone["quantization"] == "none"
    assert logits_gap(group, alone) < 1e-4 < float(alone["logits"].std())
    assert group["greedy"] == alone["greedy"] and greedy_tokens(group) == 20
    assert group["turns"] == alone["turns"] and all(group["turns"])
    for rank in range(3):
        shapes = group["shapes"] if rank == 0 else torch.load(tmp_path / f"shapes-{rank}.pt")[str(grouped_file)]
        assert shapes["layers.1.attention.wqkv.weight"] == [(3 + 2 * 1) * 16, 144]  # 3 query heads, 1 k, 1 v
        assert shapes["layers.1.attention.wo.inner.weight"] == [144, 3 * 16]
        assert shapes["layers.1.feed_forward.w13.weight"] == [2 * 64, 144]
        assert shapes["layers.1.feed_forward.w2.inner.weight"] == [144, 64]


@pytest.fixture(scope="module")
def packable_model():
    """Widths that split over 2 ranks into whole blocks of 32 (and whole int4 blocks of 64
    rows): 4 query heads of 32 sharing 2 key/value heads, and a feed-forward width of 256."""
    return tiny_hf_model(seed=9, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                         num_key_value_heads=2)


def test_packed_weights_split_over_two_ranks_on_pytorch_kernels(packable_model, tmp_path, monkeypatch):
    """int4 groups and int8 rows on PyTorch's kernels, each /load-ed in turn over 2 ranks.

    int4 groups of 32 split on whole groups: every rank holds exactly the one process's
    weights, so only the order of float32 sums differs (measured: 2e-6 on logits of std 1;
    1e-4 allows other CPUs' kernels). int8 keeps one scale per row, and a rank's row of wo
    and w2 is half a row: its scale is its half's, so those weights differ from the one
    process's by up to one int8 step. What holds there: the group is nearer the one process
    than int8 itself is to float32 (measured: 0.05 against 0.09 on logits of std 1), and
    the greedy reply is the same."""
    monkeypatch.setenv("LLAMA_CHAT_KERNELS", "aten")
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_ROWS", "512")  # every step through the packed kernels
    modes = {quantize: {"quantize": quantize, "dtype": "float32", "kernel_dtype": "float32"}
             for quantize in ("int4", "int8")}
    paths = {quantize: write_gguf(tmp_path / f"{quantize}.gguf", packable_model) for quantize in modes}
    int4, int8 = run_group(2, tmp_path, list(paths.values()), {paths[q]: modes[q] for q in modes})
    alone = {quantize: parallel_ranks.run_alone_with(str(paths[quantize]), modes[quantize]) for quantize in modes}
    exact = parallel_ranks.run_alone_with(str(paths["int8"]), parallel_ranks.FLOAT32)
    assert int4["error"] is None and int4["quantization"] == alone["int4"]["quantization"] == "int4"
    assert logits_gap(int4, alone["int4"]) < 1e-4 < logits_gap(alone["int4"], exact)
    assert int4["greedy"] == alone["int4"]["greedy"] and greedy_tokens(int4) == 20
    assert int4["turns"] == alone["int4"]["turns"]
    assert int8["error"] is None and int8["quantization"] == alone["int8"]["quantization"] == "int8"
    assert logits_gap(int8, alone["int8"]) < logits_gap(alone["int8"], exact)
    assert int8["greedy"] == alone["int8"]["greedy"] and greedy_tokens(int8) == 20


@pytest.mark.needs_kernels
def test_gguf_blocks_split_over_two_ranks_on_our_kernels(packable_model, tmp_path, monkeypatch):
    """Q4_0 and Q8_0 files as their blocks, and int4 and int8 packing of a float32 file (Q4_1
    and Q8_0 blocks), each /load-ed in turn over 2 ranks on llama-chat's kernels. Blocks hold
    32 weights of a row, and every rank's rows and columns are whole blocks, so each rank
    holds the one process's own blocks (wo and w2 too: a column range keeps the file's
    blocks). Prompt steps quantise activations in groups of 32 to 16 bits, so sums in
    another order can move a level: measured up to 2e-4 on logits of std 1. 2e-3 leaves
    room, and is 20 times below how far 16-bit activations move them from float32 (0.04)."""
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_VARIANT", native.runnable_variants()[-1])
    cases = {"Q4_0": ("auto", QType.Q4_0), "Q8_0": ("auto", QType.Q8_0), "Q4_1": ("int4", QType.F32),
             "int8-Q8_0": ("int8", QType.F32)}
    paths = {name: write_gguf(tmp_path / f"{name}.gguf", packable_model, qtype=qtype)
             for name, (_, qtype) in cases.items()}
    settings = {paths[name]: {"quantize": quantize} for name, (quantize, _) in cases.items()}
    group = run_group(2, tmp_path, list(paths.values()), settings)
    for seen, (name, path) in zip(group, paths.items()):
        alone = parallel_ranks.run_alone_with(str(path), settings[path])
        assert seen["error"] is None and seen["quantization"] == alone["quantization"] == name.split("-")[-1]
        assert logits_gap(seen, alone) < 2e-3, name
        assert seen["greedy"] == alone["greedy"] and greedy_tokens(seen) == 20
        assert seen["turns"] == alone["turns"]


@pytest.mark.needs_kernels
def test_widths_that_leave_part_blocks_are_refused_for_int4_on_our_kernels(model_file, monkeypatch):
    """6 heads of 16 over 2 ranks: a rank's wo is 48 columns wide, not whole groups of 32, so
    int4 is refused (the whole model packs)."""
    monkeypatch.setenv("LLAMA_CHAT_KERNEL_VARIANT", native.runnable_variants()[-1])
    with pytest.raises(LlamaChatError) as refused:
        llama_chat.load(model_file, options_from_environment(), device="cpu", quantize="int4", shard=Shard(1, 2))
    assert str(refused.value) == ("layers.0.attention.wo.weight (48 columns) does not split into groups of 32; "
                                  "use --quantize int8")
    assert llama_chat.load(model_file, options_from_environment(), device="cpu", quantize="int4").weights.packing == "Q4_1"


def test_widths_that_leave_part_blocks_are_refused_for_int4_on_pytorch_kernels(model_file, monkeypatch):
    """The same on PyTorch's kernels, where wqkv's 144 rows per rank, not whole int4 blocks
    of rows on some CPUs, may be what is named first."""
    monkeypatch.setenv("LLAMA_CHAT_KERNELS", "aten")
    with pytest.raises(LlamaChatError) as refused:
        llama_chat.load(model_file, options_from_environment(), device="cpu", quantize="int4", dtype="float32",
                        kernel_dtype="float32", shard=Shard(1, 2))
    assert re.fullmatch(r"layers\.0\.attention\.(wqkv\.weight \(144 x 96\)|wo\.weight \(96 x 48\)) does not split "
                        r"into this CPU's int4 blocks; use --quantize int8", str(refused.value)), refused.value


def test_a_load_failing_on_one_rank_leaves_every_rank_its_model(model_file, alone, tmp_path):
    """/load of a file that loads on ranks 0 and 2 but fails on rank 1: no rank takes it (0
    and 2 drop what they loaded), the error names rank 1, and the group answers as before;
    a later /load of the same weights under another name loads on every rank."""
    other = tiny_hf_model(seed=6, hidden_size=96, intermediate_size=192, num_attention_heads=6,
                          num_key_value_heads=6)
    refused = write_gguf(tmp_path / parallel_ranks.refused_name(1), other, qtype=QType.F32)
    accepted = write_gguf(tmp_path / "accepted.gguf", other, qtype=QType.F32)
    first, after_failure, later = run_group(3, tmp_path, [model_file, refused, accepted])
    assert first["error"] is None and first["greedy"] == alone["greedy"]
    assert after_failure["error"] == f"rank 1: {refused.name}: refused on this rank by the test"
    assert torch.allclose(after_failure["logits"], alone["logits"], atol=1e-4, rtol=0)
    assert after_failure["greedy"] == alone["greedy"] and after_failure["turns"] == alone["turns"]
    other_alone = parallel_ranks.run_alone(str(accepted))
    assert other_alone["greedy"] != alone["greedy"]  # the refused model would have answered otherwise
    assert later["error"] is None and later["greedy"] == other_alone["greedy"]
    assert torch.allclose(later["logits"], other_alone["logits"], atol=1e-4, rtol=0)
    for rank in (1, 2):  # rank 2 did load the refused file (and dropped it); rank 1 did not
        assert (str(refused) in torch.load(tmp_path / f"shapes-{rank}.pt")) == (rank == 2)


def chat_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "llama_chat", *arguments]


def test_the_command_line_gives_the_same_reply_with_tp(model_file):
    common = ["-m", str(model_file), "--dtype", "float32", "--temperature", "0", "--max-tokens", "16",
              "-p", "hello there"]
    replies = [subprocess.run(chat_command(*common, "--tp", str(n)), capture_output=True, text=True, timeout=120)
               for n in (1, 2)]
    assert [r.returncode for r in replies] == [0, 0], replies[1].stderr
    assert replies[0].stdout == replies[1].stdout and replies[0].stdout.strip()


def test_two_hosts_on_the_loopback_interface(model_file):
    """torchrun with two nodes of one process each, as two hosts would run it, meeting at a
    store this test holds (is_host=false: neither node binds a port of its own to meet)."""
    store = rendezvous_store()
    common = ["-m", str(model_file), "--dtype", "float32", "--temperature", "0", "--max-tokens", "16",
              "-p", "hello there"]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", "two-hosts",
             "--rdzv-conf", "is_host=false", "-m", "llama_chat", *common],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    alone = subprocess.run(chat_command(*common), capture_output=True, text=True, timeout=120)
    # The rendezvous decides which node is rank 0: that one prints the reply, the other nothing.
    assert sorted(stdout for stdout, _ in outputs) == ["", alone.stdout] and alone.stdout.strip()


def parallel_chat(model_file, max_tokens: int = 8) -> Terminal:
    # Greedy: this model's greedy replies run to max_tokens (sampled ones may stop at once).
    command = chat_command("-m", str(model_file), "--dtype", "float32", "--tp", "2", "--temperature", "0",
                           "--max-tokens", str(max_tokens))
    chat = Terminal(command, {"LLAMA_CHAT_TP_TIMEOUT": "20"})
    assert chat.read_until(b"Ctrl-D leaves", 120), chat.text()
    return chat


def ended(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def test_a_parallel_chat_answers_and_leaves_cleanly(model_file):
    chat = parallel_chat(model_file)
    [worker] = chat.children()
    chat.type(b"hello\r")
    assert chat.read_until(b"tok/s", 60), chat.text()  # the reply's statistics line
    assert chat.read_prompt(30, after=chat.output.index(b"tok/s")), chat.text()
    chat.type(b"\x04")  # Ctrl-D
    assert chat.exit_code(30) == 0
    assert ended(worker)


def unread_bytes(pid: int) -> int:
    """Bytes sent to process `pid` over TCP that it has not read yet."""
    links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    inodes = {link.removeprefix("socket:[").removesuffix("]") for link in links if link.startswith("socket:[")}
    waiting = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()  # ... tx_queue:rx_queue (hex) at 4, the socket's inode at 9
            if fields[9] in inodes:
                waiting += int(fields[4].split(":")[1], 16)
    return waiting


def stopped(pid: int) -> bool:
    """Whether every thread of process `pid` has stopped (SIGSTOP)."""
    states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in Path(f"/proc/{pid}/task").iterdir()]
    return set(states) == {"T"}


def test_ctrl_c_stops_a_parallel_reply_and_the_ranks_stay_in_step(model_file):
    """Ctrl-C while rank 0 is inside a step that the other rank has not run: held until the
    step is done on both, then the reply stops; the next turn runs on both in step."""
    chat = parallel_chat(model_file, max_tokens=100)
    [worker] = chat.children()
    os.kill(worker, signal.SIGSTOP)  # the reply cannot end (nor a step finish) before the Ctrl-C
    try:
        assert chat.wait_for(lambda: stopped(worker), 30)
        unread = unread_bytes(worker)
        sent = len(chat.output)
        chat.type(b"tell me a long story\r")
        # Rank 0 has posted the first step (its command waits for the stopped rank): it is in the step.
        assert chat.wait_for(lambda: unread_bytes(worker) > unread, 30), chat.text()
        chat.type(b"\x03")  # Ctrl-C
    finally:
        os.kill(worker, signal.SIGCONT)
    assert chat.read_until(b"[interrupted]", 30, after=sent), chat.text()
    assert chat.read_prompt(30, after=chat.output.index(b"[interrupted]", sent)), chat.text()
    sent = len(chat.output)
    chat.type(b"and now?\r")  # the next turn runs on every rank from the same positions
    assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
    assert chat.read_prompt(30, after=chat.output.index(b"tok/s", sent)), chat.text()
    chat.type(b"/quit\r")
    assert chat.exit_code(30) == 0
    assert "Traceback" not in chat.text()


def test_a_killed_rank_ends_the_chat_with_one_line(model_file):
    chat = parallel_chat(model_file)
    [worker] = chat.children()
    os.kill(worker, signal.SIGKILL)
    assert chat.wait_for(lambda: ended(worker), 30)
    chat.type(b"hello\r")
    assert chat.exit_code(60) == 1
    assert "a rank of the tensor-parallel group stopped" in chat.text() and "Traceback" not in chat.text()


def test_bench_reports_memory_per_rank(model_file):
    bench = subprocess.run(
        chat_command("bench", "--model", str(model_file), "--dtype", "float32", "--tp", "2", "--repeats", "1",
                     "--prompt-tokens", "16", "--new-tokens", "4", "--json"),
        capture_output=True, text=True, timeout=120,
    )
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout.strip().splitlines()[-1])
    assert result["tensor_parallel"] == 2 and len(result["memory_mb_per_rank"]) == 2
    assert all(peak > 50 and 0 < own < peak for peak, own in result["memory_mb_per_rank"])
    assert result["decode_tokens_per_second"] > 0
