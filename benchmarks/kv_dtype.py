"""What the KV cache's dtype and the attention over it do to fidelity and speed: float32,
bfloat16 and float16 caches under llama-chat's attention kernel, and float32 and float16
under PyTorch's attention (how every step attended before the kernel, and the reference).

Fidelity is teacher-forced, as benchmarks/fidelity.py measures it: the text is fed one
token at a time (so every earlier position is read from the cache), and each position's
greedy choice and next-token distribution are compared with those of PyTorch's attention
over a float32 cache (agreement, largest logit difference, mean KL divergence). Speed is
single-token decode after `--context` cached positions, where the cache is read most.

    .venv/bin/python benchmarks/kv_dtype.py [--model F] [--context 1024] [--repeats 3] [--positions 256]
        [--cases float16 ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.cache import KVCache
from llama_chat.engine.device import cpu_model_name, flush_denormals
from llama_chat.environment import kernel_options
from llama_chat.kernels.machine_limits import read_bandwidth_gb_per_second
from llama_chat.options import LoadOptions

from fidelity import TEXT  # noqa: E402 (a sibling script)

# name: (--kv-dtype, whether llama-chat's kernel attends); the first is the reference.
CASES = {
    "float32-pytorch": ("float32", False),
    "float16-pytorch": ("float16", False),
    "float32": ("float32", True),
    "bfloat16": ("bfloat16", True),
    "float16": ("float16", True),
}


def teacher_forced_logits(model: llama_chat.Llama, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(len(ids) + 1)
    return torch.stack([model.runner(cache, [token]) for token in ids])


def filled_cache(model: llama_chat.Llama, context: int, steps: int = 32) -> KVCache:
    """A cache holding `context` positions, with room for `steps` more."""
    cache = model.new_cache(context + steps + 1)
    model.runner(cache, [(31 * i) % 1000 + 10 for i in range(context)])
    return cache


def decode_seconds(model: llama_chat.Llama, cache: KVCache, context: int, steps: int = 32) -> float:
    """Median seconds of a single-token step after `context` cached positions."""
    cache.trim(context)
    times = []
    for index in range(steps):
        started = time.perf_counter()
        model.runner(cache, [(17 * index) % 1000 + 10])
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--positions", type=int, default=256, help="positions of text fed for fidelity")
    parser.add_argument("--cases", nargs="+", choices=list(CASES)[1:], default=list(CASES)[1:],
                        help=f"caches measured beside the reference, {next(iter(CASES))} (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = LoadOptions(kernels=kernel_options())
    torch.set_num_threads(options.threads)
    flush_denormals()
    path = options.model or str(download_model(DEFAULT_MODEL))
    models = {}
    cases = {name: CASES[name] for name in [next(iter(CASES)), *options.cases]}
    for name, (kv_dtype, kernel) in cases.items():
        model = llama_chat.load(path, environment, kv_dtype=kv_dtype)
        if not kernel:
            for layer in model.transformer.layers:
                layer.attention.cache_attention = None
        model.runner.compile()  # all built at once, in the background
        models[name] = model
    for model in models.values():
        model.runner.compile(wait=True)
    reference_name = next(iter(cases))
    ids = models[reference_name].tokenizer.encode(TEXT)[: options.positions]
    reference = teacher_forced_logits(models[reference_name], ids)
    seconds = {name: [] for name in cases}
    caches = {name: filled_cache(model, options.context) for name, model in models.items()}
    for _ in range(options.repeats):  # in turn, so that the machine's drift falls on all alike
        for name, model in models.items():
            seconds[name].append(decode_seconds(model, caches[name], options.context))
    first = models[reference_name]
    print(f"{cpu_model_name()} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; "
          f"read bandwidth {read_bandwidth_gb_per_second():.1f} GB/s; {first.name}: "
          f"{first.describe_weights()}; decode step {first.runner.status.describe()}")
    reference_log = torch.log_softmax(reference, dim=-1)
    for name, model in models.items():
        logits = reference if name == reference_name else teacher_forced_logits(model, ids)
        agreement = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
        difference = float((logits - reference).abs().max())
        log_probabilities = torch.log_softmax(logits, dim=-1)
        divergence = float((reference_log.exp() * (reference_log - log_probabilities)).sum(-1).mean())
        bytes_a_token = 2 * model.args.n_layers * model.args.n_kv_heads * model.args.head_dim * model.cache_dtype.itemsize
        attention = "kernel" if model.transformer.layers[0].attention.cache_attention is not None else "PyTorch"
        step = statistics.median(seconds[name])
        print(f"{name:15} cache ({attention} attends): agreement {agreement:.3f} over {len(ids)} positions, "
              f"logits within {difference:.3f}, KL {divergence:.2e}; {bytes_a_token / 1024:.1f} KB a token; "
              f"decode after {options.context}: {step * 1000:.2f} ms ({1 / step:.1f} tok/s)")


if __name__ == "__main__":
    main()
