"""What a step of several tokens costs against a single token, on a model after 200
cached tokens: the price of a chat turn's step or a speculative verify step. Beside it, the
floor the exact kernels' integer products set on such a step: every weight of the layers and
the head times every token, two byte products each (16-bit activations), at the rate their
dot-product instruction alone reaches here now.

    .venv/bin/python benchmarks/step_cost.py [--model FILE.gguf] [--tokens 8] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import llama_chat
from llama_chat.cli.bench import kernel_variant, layer_matrices
from llama_chat.cli.options import configure_folders
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.device import flush_denormals
from llama_chat.environment import kernel_options
from llama_chat.kernels.machine_limits import exact_prompt_peak_gops
from llama_chat.options import LoadOptions


def step_seconds(model: llama_chat.Llama, tokens: int, repeats: int) -> float:
    """Median seconds of feeding `tokens` tokens after 200 (logits for each, as a verify step
    needs), the cache trimmed back each time."""
    cache = model.new_cache(512)
    model.runner(cache, [(17 * i) % 1000 + 10 for i in range(200)])
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        model.runner(cache, [(31 * i) % 1000 + 10 for i in range(tokens)], every_logits=True)  # as a verify step
        times.append(time.perf_counter() - started)
        cache.trim(200)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = LoadOptions(kernels=kernel_options())
    torch.set_num_threads(options.threads)
    flush_denormals()
    model = llama_chat.load(options.model or str(download_model(DEFAULT_MODEL)), environment)
    model.runner.compile(wait=True)
    single = step_seconds(model, 1, options.repeats)
    several = step_seconds(model, options.tokens, options.repeats)
    print(f"{model.name}: {model.describe_weights()}")
    print(f"1 token {single * 1000:.1f} ms; {options.tokens} tokens {several * 1000:.1f} ms: "
          f"{several / single:.2f}x a single token")
    variant = kernel_variant(model)
    torch.set_num_threads(options.threads)  # the steps' governor may have left fewer
    peak = exact_prompt_peak_gops(variant) if variant else None
    if peak:
        head = model.transformer.output
        weights = sum(m.in_features * m.out_features for m in [*layer_matrices(model), head])
        floor = 2 * options.tokens * weights / (peak * 1e9)
        print(f"{options.tokens} tokens' products alone at the exact kernels' peak now ({variant}, {peak:.0f} GOPS): "
              f"{floor * 1000:.1f} ms, {floor / single:.2f}x the single token measured")


if __name__ == "__main__":
    main()
