"""A long conversation saved and reopened in a new process: with its cache, and without
(read again). Times /save at two lengths, the file sizes against the cache's own size, and
the next turn's first token as its statistics line reports it (and the whole process).
With --history, the conversation is kept in the history instead and reopened by
`--resume ID`: a recent one (its cache kept) and an old one (its cache dropped).

    .venv/bin/python benchmarks/resume.py --model FILE.gguf [--tokens 1000] [--history]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.chat.cache_file import cache_path
from llama_chat.chat.history_db import HistoryDatabase
from llama_chat.chat.history_keeper import HistoryKeeper
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


def reopen(model_path: str, conversation: Path | None, state: Path | None = None) -> tuple[str, float]:
    """The statistics line of one more turn in a new process, and the process's seconds:
    the conversation file opened, or (state: its XDG_STATE_HOME) the history's first resumed."""
    which = ["--open", str(conversation), "--no-history"] if state is None else ["--resume", "1"]
    command = [sys.executable, "-m", "llama_chat", "-m", model_path, *which, "-p",
               "Summarise that in one line.", "--max-tokens", "4", "--temperature", "0", "--stats"]
    environment = dict(os.environ, **({} if state is None else {"XDG_STATE_HOME": str(state)}))
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
    return finished.stderr.strip().splitlines()[-1], time.perf_counter() - started


def kept_and_resumed(model_path: str, session: Session, keeper: HistoryKeeper, state: Path) -> None:
    """Keep the conversation in a history of its own, then resume it with and without its cache."""
    started = time.perf_counter()
    keeper.keep(session)
    print(f"kept {len(session.transcript.ids)} tokens in the history: {time.perf_counter() - started:.3f} s")
    cache = keeper.cache_path(keeper.conversation_id)
    line, whole = reopen(model_path, None, state)
    print(f"  a recent conversation, --resume ID: {line} (process {whole:.1f} s)")
    kept = cache.read_bytes()
    cache.unlink()
    line, whole = reopen(model_path, None, state)
    print(f"  an old one, read again:            {line} (process {whole:.1f} s)")
    cache.write_bytes(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--history", action="store_true", help="keep it in the history and --resume it")
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
        keeper = None
        for target in (options.tokens, 2 * options.tokens):
            session.send(long_message(model, target - len(session.cache))).run()
            if options.history:
                state = Path(folder)
                keeper = keeper or HistoryKeeper(HistoryDatabase.open(state / "llama-chat" / "history.sqlite3"),
                                                 state / "llama-chat" / "caches")
                kept_and_resumed(options.model, session, keeper, state)
                continue
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
