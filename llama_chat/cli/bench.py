"""`llama-chat bench`: load time, prefill and decode speed, and peak memory of a model here."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from llama_chat.cli.arguments import add_model_arguments, positive_int
from llama_chat.cli.loaders import OptionsLoader
from llama_chat.cli.options import draft_options, load_options
from llama_chat.default_model import require_default_model
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.device import cpu_model_name
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.engine.speculation import DraftModel, Speculation, check_same_vocabulary
from llama_chat.environment import group_timeout
from llama_chat.errors import UsageError
from llama_chat.kernels import native, native_state
from llama_chat.kernels.block_linear import BlockLinear
from llama_chat.kernels.machine_limits import (
    PROMPT_INSTRUCTIONS,
    STEP_TOKENS,
    bfloat16_matrix_gflops,
    exact_prompt_peak_gops,
    int8_matrix_gops,
    matrix_step_gflops,
    read_bandwidth_gb_per_second,
)
from llama_chat.llama import Llama
from llama_chat.loading import model_memory_bytes
from llama_chat.options import DraftLength, LoadOptions
from llama_chat.parallel.group_runner import run_in_group
from llama_chat.process_memory import memory_now_mb, memory_report, peak_memory_mb

# Shapes of known models, for benchmarking random weights without any files.
SHAPES = {
    "smollm2-135m": ModelArgs(
        dim=576, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152, hidden_dim=1536,
        rope_theta=100000.0, max_seq_len=8192, tie_embeddings=True,
    ),
}


def random_prompt(vocab_size: int, length: int) -> list[int]:
    """The benchmark prompt: the same random ids for any program given the same vocabulary."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


def measure(model: Llama, prompt_tokens: int, new_tokens: int) -> dict:
    """One run: prefill a prompt of random ids, then decode greedily, ignoring stop tokens."""
    prompt = random_prompt(model.args.vocab_size, prompt_tokens)
    cache = model.new_cache(prompt_tokens + new_tokens + 1)
    generation = model.generate(
        prompt, SamplingSettings(temperature=0, max_tokens=new_tokens), cache=cache, stop_ids=()
    )
    for _ in generation:
        pass
    stats = generation.stats
    return {
        "prefill_tokens_per_second": stats.prefill_tokens_per_second,
        "decode_tokens_per_second": stats.decode_tokens_per_second,
        "time_to_first_token": stats.time_to_first_token,
    }


def chat_turn_first_token(model: Llama, cached_tokens: int = 200, turn_tokens: int = 20) -> float:
    """Seconds to the first token of a chat turn of `turn_tokens` new tokens after
    `cached_tokens` already in the cache: what a person waits for on every turn."""
    cached_tokens = min(cached_tokens, model.args.max_seq_len - turn_tokens - 2)
    prompt = random_prompt(model.args.vocab_size, cached_tokens + turn_tokens)
    cache = model.new_cache(len(prompt) + 2)
    model.runner(cache, prompt[:cached_tokens])
    generation = model.generate(prompt, SamplingSettings(temperature=0, max_tokens=1), cache=cache, stop_ids=())
    for _ in generation:
        pass
    return generation.stats.time_to_first_token


# What speculation is measured on: a reply that repeats a paragraph of its prompt (700
# characters), as a reply quoting, correcting or editing text does.
PARAGRAPH = (
    "The old lighthouse stood on the northern cliff for two hundred years, guiding fishing boats through fog "
    "and storm. Its keeper, a quiet man named Elias Marsh, climbed the one hundred and twelve spiral stairs every "
    "evening to light the lamp, and in a leather logbook he wrote down the weather, the ships that passed, and the "
    "birds that rested on the iron railing. When the harbour board replaced the lamp with an automatic beacon in "
    "1962, Elias stayed on as caretaker, painting the walls white each spring and mending the shutters after the "
    "winter gales. Visitors who climbed to the gallery found him there most afternoons, pointing out the wrecks "
    "below the waterline and naming every island on the horizon."
)
SPECULATION_TOKENS = 256  # the longest reply measured (the paragraph is about 150 tokens)
ECHO_REQUEST = f"Repeat the following paragraph exactly, word for word, and nothing else:\n\n{PARAGRAPH}"


def measure_speculation(model: Llama, text: str, new_tokens: int, repeats: int, draft: Llama | None = None) -> dict:
    """Decode speed of the greedy reply to a chat message `text`, without speculation, with
    prompt lookup (auto) and with a draft model if given: each run in turn, so that the
    machine's drift falls on all alike; the median of each, and whether its reply was the
    same as without speculation."""
    prompt = model.chat_format.encode([{"role": "user", "content": text}])
    settings = SamplingSettings(temperature=0, max_tokens=new_tokens)
    ways = {"without": Speculation(lookup=DraftLength(0)), "lookup": Speculation()}
    if draft is not None:
        ways["draft"] = Speculation(draft=DraftModel(draft))
    runs: dict[str, list] = {name: [] for name in ways}
    for _ in range(repeats + 1):  # the first round warms every path up and is not counted
        for name, speculation in ways.items():
            cache = model.new_cache(min(model.args.max_seq_len, len(prompt) + new_tokens + 1))
            generation = model.generate(prompt, settings, cache=cache, speculation=speculation)
            for _ in generation:
                pass
            runs[name].append(generation)
    plain = runs["without"][-1].tokens
    return {
        name: {
            "decode_tokens_per_second": statistics.median(g.stats.decode_tokens_per_second for g in done[1:]),
            "generated_tokens": done[-1].stats.generated_tokens,
            "drafted_tokens": done[-1].stats.drafted_tokens,
            "accepted_tokens": done[-1].stats.accepted_tokens,
            "same_reply": all(g.tokens == plain for g in done),
        }
        for name, done in runs.items()
    }


def speculation_line(results: dict) -> str:
    """One line: each way's decode speed against none, its acceptance and whether the reply held."""
    base = results["without"]["decode_tokens_per_second"]
    parts = [f"without {base:.1f} tok/s"]
    for name, label in (("lookup", "prompt lookup"), ("draft", "draft model")):
        if name in results:
            run = results[name]
            rate = run["decode_tokens_per_second"]
            kept = f"accepted {run['accepted_tokens']} of {run['drafted_tokens']} drafted"
            same = "same reply" if run["same_reply"] else "A DIFFERENT REPLY"
            parts.append(f"{label} {rate:.1f} tok/s ({rate / base:.2f}x; {kept}; {same})")
    return "; ".join(parts)


def operator_calls_per_token(model: Llama) -> int:
    """PyTorch operators one decode step calls (top level only; what runs inside a fused
    compiled kernel calls none): the fixed cost per token that compiling removes."""
    cache = model.new_cache(16)
    model.runner(cache, random_prompt(model.args.vocab_size, 8))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        model.runner(cache, [1])
    return sum(1 for event in profile.events() if event.cpu_parent is None and event.name.startswith("aten::"))


def run(model: Llama, prompt_tokens: int, new_tokens: int, repeats: int) -> dict:
    # Warm-up at full size: the first calls page the weights in and pick matrix kernels.
    measure(model, prompt_tokens, 8)
    runs = [measure(model, prompt_tokens, new_tokens) for _ in range(repeats)]
    result = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    result["chat_turn_first_token"] = statistics.median(chat_turn_first_token(model) for _ in range(repeats))
    # The peak of loading, prompts and replies, what a peer's load and runs are measured by: the
    # profiler and the speculation runs below add what no chat holds (Gemma 3 270M: 104 MB).
    result["peak_memory_mb"] = peak_memory_mb()
    result.update(
        model=model.name,
        device=str(model.device),
        dtype=str(model.dtype).removeprefix("torch."),
        weights=model.describe_weights(),
        decode_step=model.runner.status.describe(),
        operator_calls_per_token=operator_calls_per_token(model),
        cpu=cpu_model_name(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch=torch.__version__,
        quantization=model.weights.packing,
        threads=torch.get_num_threads(),
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        repeats=repeats,
    )
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat bench", description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("--random-shapes", choices=sorted(SHAPES),
                        help="measure random weights with a known model's shapes instead")
    parser.add_argument("--threads", type=positive_int, help="CPU threads (default: PyTorch's choice)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=512)
    parser.add_argument("--new-tokens", type=positive_int, default=128)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--compile", default="wait", choices=("wait", "off"),
                        help="measure the compiled decode step, built first if need be (default), or the eager one")
    parser.add_argument("--draft", metavar="MODEL",
                        help="also measure speculation with this draft model (loaded in the default weights mode)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    flags = parser.parse_args(argv)
    if flags.threads:
        torch.set_num_threads(flags.threads)
    if flags.tp > 1 and flags.random_shapes:
        raise UsageError("--tp needs weights from a file: give --model instead of --random-shapes")
    options = load_options(flags)
    return run_in_group(flags.tp, ["bench", *argv], lambda shard: OptionsLoader(options, shard),
                        lambda loader: measure_and_report(flags, options, loader), group_timeout())


def weight_bytes_a_token(model: Llama) -> int:
    """Bytes of weights a decode step reads: all the model holds but an untied embedding
    table (one row of it is read) and the rotary tables (one row of each)."""
    total = model_memory_bytes(model)
    total -= sum(t.numel() * t.element_size() for name, t in model.transformer.named_buffers(recurse=False)
                 if name.startswith("rope_"))
    embedding, head = model.transformer.tok_embeddings, model.transformer.output
    table = getattr(embedding, "table", None)
    if table is not None and table not in (head, getattr(head, "table", None)):
        total -= sum(t.numel() * t.element_size() for t in table.buffers())
    return total


def layer_matrices(model: Llama) -> list[torch.nn.Module]:
    """The layers' matrices, what prefill multiplies: a stack's parts, not the stack."""
    return [m for m in model.transformer.layers.modules()
            if hasattr(m, "out_features") and next(m.children(), None) is None]


def add_machine_limits(result: dict, model: Llama) -> None:
    """This machine's read bandwidth and matrix rates (PyTorch's int8 and bfloat16, and the
    model's largest matrix on a prompt chunk), measured now, and the share of each that
    decode and prefill reach."""
    bandwidth, gops, bfloat16_gflops = read_bandwidth_gb_per_second(), int8_matrix_gops(), bfloat16_matrix_gflops()
    variant = kernel_variant(model)
    exact_peak = exact_prompt_peak_gops(variant) if variant else None
    bytes_a_token = weight_bytes_a_token(model)
    matrices = layer_matrices(model)
    largest = max(matrices, key=lambda m: m.in_features * m.out_features)
    matrix_gflops = matrix_step_gflops(largest, model.dtype)
    prefill_gflops = result["prefill_tokens_per_second"] * 2 * sum(m.in_features * m.out_features for m in matrices) / 1e9
    result.update(
        read_bandwidth_gb_per_second=bandwidth,
        int8_gops=gops,
        bfloat16_gflops=bfloat16_gflops,
        matrix_step_gflops=matrix_gflops,
        weight_bytes_a_token=bytes_a_token,
        decode_share_of_bandwidth=result["decode_tokens_per_second"] * bytes_a_token / 1e9 / bandwidth,
        prefill_share_of_int8_rate=prefill_gflops / gops,
        prefill_share_of_bfloat16_rate=prefill_gflops / bfloat16_gflops,
        prefill_share_of_matrix_rate=prefill_gflops / matrix_gflops,
        kernel_variant=variant,
        exact_prompt_peak_gops=exact_peak,
        prefill_share_of_exact_peak=prefill_gflops / exact_peak if exact_peak else None,
    )


def kernel_variant(model: Llama) -> str | None:
    """The variant of llama-chat's kernels the model's matrices run; None on PyTorch's."""
    layer = next((m for m in model.transformer.modules() if isinstance(m, BlockLinear)), None)
    return None if layer is None else native.variant_names()[layer.variant]


def load_and_compile(flags: argparse.Namespace, loader: Callable[[str], Llama]) -> tuple[Llama, dict]:
    """The model measured, loaded and its decode step compiled as --compile says; what the
    load and the compile took, in time and memory."""
    memory_before = peak_memory_mb()
    own_before = (memory_now_mb() or (0.0, 0.0))[1]
    started = time.perf_counter()
    if flags.random_shapes:
        model = Llama.random(SHAPES[flags.random_shapes], device=flags.device, dtype=flags.dtype)
        model.name = f"random weights, {flags.random_shapes} shapes"
    else:
        model = loader(flags.model or require_default_model())
    load_seconds = time.perf_counter() - started
    memory_after_load = peak_memory_mb()
    started = time.perf_counter()
    if flags.compile == "wait":
        model.runner.compile(wait=True)
    return model, {
        "load_seconds": load_seconds,
        "compile_seconds": time.perf_counter() - started,
        "memory_before_load_mb": memory_before,
        "peak_memory_after_load_mb": memory_after_load,
        "own_memory_before_load_mb": own_before,
    }


def add_speculation(result: dict, model: Llama, flags: argparse.Namespace) -> None:
    """Decode speed with speculation (a draft model too, with --draft), where the model's
    context holds the reply measured."""
    draft = None
    if flags.draft:
        draft = OptionsLoader(draft_options(flags))(flags.draft)
        check_same_vocabulary(model, draft)
        if flags.compile == "wait":
            draft.runner.compile(wait=True)
    echo_prompt = model.chat_format.encode([{"role": "user", "content": ECHO_REQUEST}])
    if len(echo_prompt) + SPECULATION_TOKENS < model.args.max_seq_len:
        result["speculation"] = measure_speculation(model, ECHO_REQUEST, SPECULATION_TOKENS, flags.repeats, draft)


def add_memory(result: dict, model: Llama) -> None:
    """What is resident now and of it the process's own (not mapped files' shared pages),
    and what the model holds."""
    resident_now, own_now = memory_now_mb() or (0.0, 0.0)
    result.update(
        resident_memory_mb=resident_now,
        own_memory_mb=own_now,
        model_memory_mb=model_memory_bytes(model) / 2**20,
    )


def measure_and_report(flags: argparse.Namespace, options: LoadOptions, loader: Callable[[str], Llama]) -> int:
    # A first build is measured with the kernels it makes.
    kernels = native_state.load_or_build(options.kernels, wait=True)
    model, loading = load_and_compile(flags, loader)
    group = model.runner.group
    peers = group.peers if group is not None else None  # the other ranks, under --tp
    result = run(model, flags.prompt_tokens, flags.new_tokens, flags.repeats)
    add_speculation(result, model, flags)
    result.update(loading)
    add_memory(result, model)
    result.update(
        tensor_parallel=flags.tp if peers is not None else 1,
        kernels=kernels.detail if not kernels.loaded else "built",
    )
    add_machine_limits(result, model)
    if peers is not None:
        result["memory_mb_per_rank"] = [memory_report(), *peers.memory_mb()]
    if flags.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 0


def print_report(result: dict) -> None:
    """The measurements for people, a few lines."""
    print(f"{result['model']} on {result['device']}: {result['weights']}")
    print(f"{result['cpu']} ({result['cpu_capability']}), torch {result['torch']}, {result['threads']} threads, "
          f"median of {result['repeats']}")
    print(f"load: {result['load_seconds']:.2f} s; decode step {result['decode_step']}, ready "
          f"{result['compile_seconds']:.1f} s after loading; {result['operator_calls_per_token']} operator calls "
          "a token")
    print(f"prefill ({result['prompt_tokens']} tokens): {result['prefill_tokens_per_second']:.1f} tok/s")
    print(f"decode ({result['new_tokens']} tokens): {result['decode_tokens_per_second']:.1f} tok/s")
    if "speculation" in result:
        print(f"decode with speculation, a reply repeating a {len(PARAGRAPH)}-character paragraph: "
              f"{speculation_line(result['speculation'])}")
    print(f"time to first token: {result['time_to_first_token'] * 1000:.0f} ms after the "
          f"{result['prompt_tokens']}-token prompt; {result['chat_turn_first_token'] * 1000:.0f} ms for a "
          "20-token chat turn after 200 cached")
    print(f"this machine now: memory read {result['read_bandwidth_gb_per_second']:.1f} GB/s; decode reads "
          f"{result['weight_bytes_a_token'] / 1e6:.0f} MB a token, {result['decode_share_of_bandwidth']:.0%} of that "
          "bandwidth")
    print(f"matrix products now, {STEP_TOKENS}-token steps: PyTorch's int8 {result['int8_gops']:.0f} GOPS and bfloat16 "
          f"{result['bfloat16_gflops']:.0f} GFLOPS, this model's largest matrix {result['matrix_step_gflops']:.0f}; "
          f"prefill at {result['prefill_share_of_int8_rate']:.0%}, {result['prefill_share_of_bfloat16_rate']:.0%} and "
          f"{result['prefill_share_of_matrix_rate']:.0%} of them")
    if result["exact_prompt_peak_gops"]:
        instruction = PROMPT_INSTRUCTIONS[result["kernel_variant"]][0]
        print(f"the exact prompt kernels' peak now ({instruction} alone, two byte products a weight): "
              f"{result['exact_prompt_peak_gops']:.0f} GOPS; prefill at {result['prefill_share_of_exact_peak']:.0%} of it")
    print(f"memory: model {result['model_memory_mb']:.0f} MB; peak {result['peak_memory_mb']:.0f} MB (load, prompts "
          "and replies), "
          f"{result['memory_before_load_mb']:.0f} MB before loading, "
          f"{result['peak_memory_after_load_mb']:.0f} MB right after; now {result['resident_memory_mb']:.0f} MB "
          f"resident, {result['own_memory_mb']:.0f} MB of it the process's own "
          f"({result['own_memory_before_load_mb']:.0f} MB before loading; the rest is mapped files, shared between "
          "processes and reclaimable)")
    if "memory_mb_per_rank" in result:
        ranks = ", ".join(f"rank {rank} {peak:.0f} MB peak, {own:.0f} MB own"
                          for rank, (peak, own) in enumerate(result["memory_mb_per_rank"]))
        print(f"tensor parallel over {result['tensor_parallel']} ranks (rank 0's model share above): {ranks}")
