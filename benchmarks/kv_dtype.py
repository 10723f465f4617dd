"""What the KV cache's dtype does to fidelity and speed: float32 against bfloat16 and
float16 caches on one model.

Fidelity is teacher-forced, as benchmarks/fidelity.py measures it: the text is fed one
token at a time (so every earlier position is read from the cache), and each position's
greedy choice is compared with the float32 cache's. Speed is single-token decode after
`--context` cached positions, where the cache is read most.

    .venv/bin/python benchmarks/kv_dtype.py [--model F] [--context 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import llama_chat
from llama_chat.default_model import download_default_model
from llama_chat.engine.device import cpu_model_name, flush_denormals
from llama_chat.kernels.machine_limits import read_bandwidth_gb_per_second

from fidelity import TEXT  # noqa: E402 (a sibling script)

DTYPES = ("float32", "bfloat16", "float16")


def teacher_forced_logits(model: llama_chat.Llama, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(len(ids) + 1)
    return torch.stack([model.feed(cache, [token]) for token in ids])


def decode_seconds(model: llama_chat.Llama, context: int, steps: int = 32) -> float:
    """Median seconds of a single-token step after `context` cached positions."""
    cache = model.new_cache(context + steps + 1)
    model.feed(cache, [(31 * i) % 1000 + 10 for i in range(context)])
    times = []
    for index in range(steps):
        started = time.perf_counter()
        model.feed(cache, [(17 * index) % 1000 + 10])
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    flush_denormals()
    path = options.model or str(download_default_model())
    models = {name: llama_chat.load(path, kv_dtype=name) for name in DTYPES}
    for model in models.values():
        model.step.compile(wait=True)
    ids = models["float32"].tokenizer.encode(TEXT)[:256]
    reference = teacher_forced_logits(models["float32"], ids)
    seconds = {name: [] for name in DTYPES}
    for _ in range(options.repeats):  # in turn, so that the machine's drift falls on all alike
        for name, model in models.items():
            seconds[name].append(decode_seconds(model, options.context))
    print(f"{cpu_model_name()} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; "
          f"read bandwidth {read_bandwidth_gb_per_second():.1f} GB/s; {models['float32'].name}: "
          f"{models['float32'].describe_weights()}; decode step {models['float32'].step.describe()}")
    for name, model in models.items():
        logits = reference if name == "float32" else teacher_forced_logits(model, ids)
        agreement = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
        difference = float((logits - reference).abs().max())
        bytes_a_token = 2 * model.args.n_layers * model.args.n_kv_heads * model.args.head_dim * model.cache_dtype.itemsize
        step = statistics.median(seconds[name])
        print(f"{name:9} cache: agreement {agreement:.3f} over {len(ids)} positions, logits within {difference:.3f}; "
              f"{bytes_a_token / 1024:.1f} KB a token; decode after {options.context}: {step * 1000:.2f} ms "
              f"({1 / step:.1f} tok/s)")


if __name__ == "__main__":
    main()
