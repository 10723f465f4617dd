"""Decode with and without speculation, on two chat replies: one that repeats a paragraph
of its prompt, and an open-ended short story. Each way runs in turn, greedy, and its reply
is checked against the reply without speculation.

    .venv/bin/python benchmarks/speculation.py [--model F] [--quantize none --dtype float32]
        [--draft F] [--repeats 3] [--new-tokens 256]

Prints the CPU, PyTorch's capability level and the read bandwidth measured in the same
run, so that figures from different machines are never set side by side unnamed.
"""

from __future__ import annotations

import argparse
import json

import torch

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.cli.bench import ECHO_REQUEST, PARAGRAPH, measure_speculation, speculation_line
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.device import cpu_model_name, flush_denormals
from llama_chat.environment import kernel_options
from llama_chat.kernels.machine_limits import read_bandwidth_gb_per_second
from llama_chat.options import LoadOptions

STORY_REQUEST = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--quantize", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--draft", default=None, help="a draft model (default weights mode)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = LoadOptions(kernels=kernel_options())
    torch.set_num_threads(options.threads)
    flush_denormals()
    path = options.model or str(download_model(DEFAULT_MODEL))
    model = llama_chat.load(path, environment, quantize=options.quantize, dtype=options.dtype)
    model.runner.compile(wait=True)
    draft = None
    if options.draft:
        draft = llama_chat.load(options.draft, environment)
        draft.runner.compile(wait=True)
    results = {
        f"repeat a {len(PARAGRAPH)}-character paragraph": measure_speculation(
            model, ECHO_REQUEST, options.new_tokens, options.repeats, draft
        ),
        "a short story": measure_speculation(model, STORY_REQUEST, options.new_tokens, options.repeats, draft),
    }
    machine = {
        "cpu": cpu_model_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "read_bandwidth_gb_per_second": read_bandwidth_gb_per_second(),
        "model": f"{model.name}: {model.describe_weights()}; decode step {model.runner.status.describe()}",
        "draft": None if draft is None else f"{draft.name}: {draft.describe_weights()}",
    }
    if options.json:
        print(json.dumps({"machine": machine, "results": results}))
        return
    for key, value in machine.items():
        print(f"{key}: {value}")
    for reply, result in results.items():
        print(f"{reply}: {speculation_line(result)}")


if __name__ == "__main__":
    main()
