"""A model file's first load and a later one, whole processes timed from outside: llama-chat
(`-p hi --max-tokens 1`, as plain text with --raw and through the chat template) and
llama.cpp (llama-cpp-python: load, `eval` of "hi", one sample, its id printed), the file in
the page cache. Each is timed to its first token (the first byte on its stdout) and to its
end: a first load of llama-chat's writes its packed cache after the reply, before it exits.

The first load packs the file and builds its tokenizer (the packed cache and the kept
tokenizers emptied before it) and measures its kernels on the model's shapes; later ones
map the cache and read the kept tokenizer. llama.cpp keeps no cache: every load
repacks where its CPU back-end does (Q4_0 into interleaved rows here); it is also timed
with that repacking off, its weights used as mapped from the file.

    python benchmarks/first_load.py --model FILE.gguf --peer-python PYTHON --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from compare_speed import cpu_name

# argv: the file, the threads, and 1 to let llama.cpp repack weights for its CPU kernels (its
# default: extra buffer types) or 0 to keep them as mapped from the file.
LLAMA_CPP = """
import sys
import llama_cpp.llama_cpp as bindings
from llama_cpp import Llama
defaults = bindings.llama_model_default_params
def model_params():
    params = defaults()
    params.use_extra_bufts = sys.argv[3] == "1"
    return params
bindings.llama_model_default_params = model_params
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=int(sys.argv[2]), verbose=False)
llm.eval(llm.tokenize(b"hi"))
print(llm.sample(), flush=True)
"""


def timed(command: list[str], environment: dict[str, str]) -> tuple[float, float]:
    """Seconds to the process's first byte on stdout (its first token), and to its end."""
    os.sync()  # the last process's written files (a packed cache) are not this one's to flush
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: stderr never blocks the process
        with subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=errors) as process:
            process.stdout.read(1)
            first = time.perf_counter() - started
            process.communicate()
        ended = time.perf_counter() - started
        if process.returncode:
            errors.seek(0)
            raise SystemExit(f"{command[0]} failed: {errors.read().decode(errors='replace')[-2000:]}")
    return first, ended


def read_whole(path: Path) -> float:
    """Seconds to read the file once (from the page cache once it is there)."""
    buffer = bytearray(1 << 24)
    started = time.perf_counter()
    with open(path, "rb") as file:
        while file.readinto(buffer):
            pass
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", "-m", type=Path, required=True)
    parser.add_argument("--peer-python", help="Python interpreter with llama_cpp installed")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="llama-chat-first-load-"))
    environment = {**os.environ, "LLAMA_CHAT_CACHE": str(cache)}
    if "LLAMA_CHAT_KERNELS_DIR" not in environment:  # the kernels built already, not a new build
        environment["LLAMA_CHAT_KERNELS_DIR"] = str(Path.home() / ".cache" / "llama-chat" / "kernels")
    chat = [sys.executable, "-m", "llama_chat", "--model", str(options.model), "-p", "hi", "--max-tokens", "1",
            "--compile", "off"]
    rows: dict[str, list[tuple[float, float]]] = {}
    try:
        read_whole(options.model)  # into the page cache
        reading = min(read_whole(options.model) for _ in range(2))
        for _ in range(options.repeats):
            # llama.cpp first, while none of llama-chat's packed cache is in memory: beside those
            # pages its repacking load measured 2-4x slower here.
            shutil.rmtree(cache / "packed", ignore_errors=True)
            if options.peer_python:
                for name, repack in (("llama.cpp (every load)", "1"), ("llama.cpp, weights not repacked", "0")):
                    peer = [options.peer_python, "-c", LLAMA_CPP, str(options.model), str(options.threads), repack]
                    rows.setdefault(name, []).append(timed(peer, dict(os.environ)))
            for name, extra in (("llama-chat --raw", ["--raw"]), ("llama-chat, chat template", [])):
                for kept in ("packed", "tokenizers"):
                    shutil.rmtree(cache / kept, ignore_errors=True)
                (cache / "cpu-paths.json").unlink(missing_ok=True)
                rows.setdefault(f"{name}: first load", []).append(timed(chat + extra, environment))
                rows.setdefault(f"{name}: later load", []).append(timed(chat + extra, environment))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"CPU: {cpu_name()} (torch capability {torch.backends.cpu.get_cpu_capability()})")
    size = options.model.stat().st_size
    print(f"reading the file once from the page cache: {reading:.2f} s ({size / reading / 1e9:.1f} GB/s)")
    print(f"{options.model.name}, {options.threads} threads, whole processes, median of {options.repeats} (s):")
    print(f"  {'':40} {'first token':>11}  {'end':>6}  (each run's first token)")
    peer = statistics.median(first for first, _ in rows["llama.cpp (every load)"]) if options.peer_python else None
    for name, times in rows.items():
        first, end = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
        ratio = f"  {first / peer:.2f}x llama.cpp" if peer else ""
        runs = ", ".join(f"{t[0]:.2f}" for t in times)
        print(f"  {name:40} {first:11.2f}  {end:6.2f}  ({runs}){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
