"""A long conversation saved and reopened in a new process: with its cache, and without
(read again). Times /save at two lengths, the file sizes against the cache's own size, and
the next turn's first token as its statistics line reports it (and the whole process).

    .venv/bin/python benchmarks/resume.py --model FILE.gguf [--tokens 1000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.chat.cache_file import cache_path
from llama_chat.chat.session import Session
from llama_chat.engine.device import cpu_model_name
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.environment import kernel_options
from llama_chat.options import LoadOptions

from fidelity import TEXT  # noqa: E402 (a sibling script)


def long_message(model: llama_chat.Llama, tokens: int) -> str:
    """Text of about `tokens` tokens: the fidelity text repeated with numbered parts."""
    parts, count, number = [], 0, 0
    while count < tokens:
        number += 1
        part = f"Part {number}. {TEXT}"
        parts.append(part)
        count += len(model.tokenizer.encode(part))
    return "\n".join(parts)[: int(len("\n".join(parts)) * tokens / count)]


def reopen(model_path: str, conversation: Path) -> tuple[str, float]:
    """The statistics line of one more turn in a new process, and the process's seconds."""
    command = [sys.executable, "-m", "llama_chat", "-m", model_path, "--open", str(conversation), "-p",
               "Summarise that in one line.", "--max-tokens", "4", "--temperature", "0", "--stats"]
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, check=True)
    return finished.stderr.strip().splitlines()[-1], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=1000)
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = LoadOptions(kernels=kernel_options())
    model = llama_chat.load(options.model, environment)
    print(f"{cpu_model_name()} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; "
          f"{model.name}: {model.describe_weights()}")
    session = Session(model, SamplingSettings(temperature=0, max_tokens=16), model_path=options.model)
    args = model.args
    own_bytes = 2 * args.n_layers * args.n_kv_heads * args.head_dim * model.cache_dtype.itemsize
    with tempfile.TemporaryDirectory() as folder:
        conversation = Path(folder) / "c.json"
        for target in (options.tokens, 2 * options.tokens):
            session.send(long_message(model, target - len(session.cache))).run()
            started = time.perf_counter()
            _, cached = session.save(conversation)
            seconds = time.perf_counter() - started
            size = cache_path(conversation).stat().st_size
            print(f"/save of {len(session.transcript.ids)} tokens: {seconds:.3f} s; cache file {size / 1e6:.1f} MB for "
                  f"{cached} positions (their own size {cached * own_bytes / 1e6:.1f} MB); conversation file "
                  f"{conversation.stat().st_size / 1e3:.0f} KB")
            line, whole = reopen(options.model, conversation)
            print(f"  reopened with its cache: {line} (process {whole:.1f} s)")
            kept = cache_path(conversation).read_bytes()
            cache_path(conversation).unlink()
            line, whole = reopen(options.model, conversation)
            print(f"  reopened without it:     {line} (process {whole:.1f} s)")
            cache_path(conversation).write_bytes(kept)


if __name__ == "__main__":
    main()
