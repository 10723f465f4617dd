"""Measure llama-chat and Hugging Face transformers on the same GGUF weights, in one run.

    .venv/bin/python benchmarks/compare_with_transformers.py [--model FILE.gguf] [--repeats 3]

Both get the same 512-token prompt (prefill) and then decode 128 tokens greedily,
ignoring end-of-turn tokens, on the same number of threads. transformers is a test
dependency (`scripts/setup test`), not one of the app's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.cli.arguments import positive_int
from llama_chat.cli.bench import random_prompt
from llama_chat.cli.bench import run as run_llama_chat
from llama_chat.default_model import require_default_model
from llama_chat.engine.device import flush_denormals
from llama_chat.environment import kernel_options
from llama_chat.options import LoadOptions


@torch.inference_mode()
def measure_transformers(model: LlamaForCausalLM, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) with transformers' own KV cache, greedy."""
    started = time.perf_counter()
    output = model(torch.tensor([prompt]), use_cache=True)
    prefill_seconds = time.perf_counter() - started
    cache, token = output.past_key_values, output.logits[:, -1].argmax(-1, keepdim=True)
    started = time.perf_counter()
    for _ in range(new_tokens - 1):
        output = model(token, past_key_values=cache, use_cache=True)
        cache, token = output.past_key_values, output.logits[:, -1].argmax(-1, keepdim=True)
    decode_seconds = time.perf_counter() - started
    return len(prompt) / prefill_seconds, (new_tokens - 1) / decode_seconds


def transformers_row(path: Path, dtype: torch.dtype, prompt_tokens: int, new_tokens: int, repeats: int) -> dict:
    model = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    prompt = random_prompt(model.config.vocab_size, prompt_tokens)  # the prompt llama-chat's bench gets
    measure_transformers(model, prompt, 8)  # warm-up at full size, as llama-chat's bench does
    runs = [measure_transformers(model, prompt, new_tokens) for _ in range(repeats)]
    return {
        "name": f"transformers {str(dtype).removeprefix('torch.')}",
        "prefill": statistics.median(r[0] for r in runs),
        "decode": statistics.median(r[1] for r in runs),
    }


def llama_chat_row(path: Path, prompt_tokens: int, new_tokens: int, repeats: int, **options) -> dict:
    model = llama_chat.load(path, LoadOptions(kernels=kernel_options()), device="cpu", **options)
    model.runner.compile(wait=True)  # as `llama-chat bench` does: built once, then kept
    result = run_llama_chat(model, prompt_tokens, new_tokens, repeats)
    return {
        "name": f"llama-chat {model.describe_weights()}; decode step {result['decode_step']}",
        "prefill": result["prefill_tokens_per_second"],
        "decode": result["decode_tokens_per_second"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the default model)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=512)
    parser.add_argument("--new-tokens", type=positive_int, default=128)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=2)
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    torch.set_num_threads(options.threads)
    flush_denormals()  # as the command line does; it holds for every row measured here
    path = options.model or require_default_model()
    common = (options.prompt_tokens, options.new_tokens, options.repeats)
    rows = [
        llama_chat_row(path, *common),
        llama_chat_row(path, *common, dtype="float32"),
        transformers_row(path, torch.float32, *common),
        transformers_row(path, torch.bfloat16, *common),
    ]
    best_prefill = max(r["prefill"] for r in rows[2:])
    transformers_float32 = rows[2]
    print(f"{path.name}, {options.threads} threads, prefill {options.prompt_tokens} tokens, "
          f"decode {options.new_tokens} tokens, median of {options.repeats}")
    print(f"{'':60} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for row in rows:
        print(f"{row['name']:60} {row['prefill']:14.1f} {row['decode']:13.1f}")
    fast = rows[0]
    print(f"llama-chat (default) vs best transformers prefill: {fast['prefill'] / best_prefill:.2f}x")
    print(f"llama-chat (default) vs transformers float32 decode: {fast['decode'] / transformers_float32['decode']:.2f}x")


if __name__ == "__main__":
    main()
