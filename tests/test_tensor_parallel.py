"""Tensor parallelism: ranks spawned here with gloo, on tiny random models."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat.errors import LlamaChatError
from llama_chat.parallel.sharding import Shard, check_divisible

from . import parallel_ranks
from .terminal import Terminal
from .test_gguf import tiny_hf_model, write_gguf

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
    mp.start_processes(parallel_ranks.run, args=(world, free_port(), str(model_file), str(tmp_path)),
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
    """torchrun with two nodes of one process each, as two hosts would run it."""
    port = free_port()
    common = ["-m", str(model_file), "--dtype", "float32", "--temperature", "0", "--max-tokens", "16",
              "-p", "hello there"]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
             "-m", "llama_chat", *common],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    alone = subprocess.run(chat_command(*common), capture_output=True, text=True, timeout=120)
    assert outputs[0][0] == alone.stdout and outputs[1][0] == ""


def parallel_chat(model_file, max_tokens: int = 8) -> Terminal:
    # Greedy: this model's greedy replies run to max_tokens (sampled ones may stop at once).
    command = chat_command("-m", str(model_file), "--dtype", "float32", "--tp", "2", "--temperature", "0",
                           "--max-tokens", str(max_tokens))
    chat = Terminal(command, {"LLAMA_CHAT_TP_TIMEOUT": "20"})
    assert chat.read_until(b"Ctrl-D leaves", 120), chat.text()
    return chat


def test_a_parallel_chat_answers_and_leaves_cleanly(model_file):
    chat = parallel_chat(model_file)
    [worker] = chat.children()
    chat.type(b"hello\r")
    assert chat.read_until(b"tok/s", 60), chat.text()  # the reply's statistics line
    chat.read_until(b"\0never", 1.0)  # the next prompt
    chat.type(b"\x04")  # Ctrl-D
    assert chat.exit_code(30) == 0
    assert not Path(f"/proc/{worker}").exists() or "zombie" in Path(f"/proc/{worker}/status").read_text()


def test_ctrl_c_stops_a_parallel_reply_and_the_ranks_stay_in_step(model_file):
    chat = parallel_chat(model_file, max_tokens=100)
    sent = len(chat.output)
    chat.type(b"tell me a long story\r")
    assert chat.read_until(b"\x1b[?2004l", 30, after=sent)  # the prompt has let go: the reply starts
    time.sleep(0.1)
    chat.type(b"\x03")  # Ctrl-C
    assert chat.read_until(b"[interrupted]", 30, after=sent), chat.text()
    chat.read_until(b"\0never", 1.0)
    sent = len(chat.output)
    chat.type(b"and now?\r")  # the next turn runs on every rank from the same positions
    assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
    chat.read_until(b"\0never", 1.0)
    chat.type(b"/quit\r")
    assert chat.exit_code(30) == 0
    assert "Traceback" not in chat.text()


def test_a_killed_rank_ends_the_chat_with_one_line(model_file):
    chat = parallel_chat(model_file)
    [worker] = chat.children()
    os.kill(worker, signal.SIGKILL)
    time.sleep(0.5)
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
