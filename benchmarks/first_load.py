"""A model file's first load and a later one, whole processes timed from outside: llama-chat
(`-p hi --max-tokens 1`, as plain text with --raw and through the chat template) and
llama.cpp (llama-cpp-python: load, `eval` of "hi", one sample), the file in the page cache.

The first load packs the file into llama-chat's packed cache (emptied before it) and
measures its kernels on the model's shapes; later ones map the cache. llama.cpp keeps no
cache: every load repacks where its CPU back-end does (Q4_0 into interleaved rows here).

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

LLAMA_CPP = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=int(sys.argv[2]), verbose=False)
llm.eval(llm.tokenize(b"hi"))
llm.sample()
"""


def timed(command: list[str], environment: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=environment, check=True, capture_output=True)
    return time.perf_counter() - started


def read_into_page_cache(path: Path) -> None:
    with open(path, "rb") as file:
        while file.read(1 << 24):
            pass


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
    rows: dict[str, list[float]] = {}
    try:
        read_into_page_cache(options.model)
        for _ in range(options.repeats):
            for name, extra in (("llama-chat --raw", ["--raw"]), ("llama-chat, chat template", [])):
                shutil.rmtree(cache / "packed", ignore_errors=True)
                (cache / "cpu-paths.json").unlink(missing_ok=True)
                rows.setdefault(f"{name}: first load", []).append(timed(chat + extra, environment))
                rows.setdefault(f"{name}: later load", []).append(timed(chat + extra, environment))
            if options.peer_python:
                peer = [options.peer_python, "-c", LLAMA_CPP, str(options.model), str(options.threads)]
                rows.setdefault("llama.cpp (every load)", []).append(timed(peer, dict(os.environ)))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{options.model.name}, {options.threads} threads, whole processes, median of {options.repeats} (s):")
    peer = statistics.median(rows["llama.cpp (every load)"]) if options.peer_python else None
    for name, seconds in rows.items():
        median = statistics.median(seconds)
        ratio = f"  {median / peer:.2f}x llama.cpp" if peer else ""
        print(f"  {name:40} {median:6.2f}  ({', '.join(f'{s:.2f}' for s in seconds)}){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
