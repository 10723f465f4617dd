"""A model by its Hub name, as a person meets it: `llama-chat -m OWNER/REPO:Q4_K_M -p ...`
against a loopback hub (the test suite's, which speaks the Hub's download API) serving a
real GGUF file, into a fresh Hugging Face cache. Three runs: one killed (SIGKILL) half-way
through the download, one that resumes it and answers, and one that starts from the cache;
each run's time, the file's bytes served and the requests made.

    python benchmarks/hub_download.py --model weights/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.hub_server import HubRepo, HubServer  # noqa: E402 (the suite's loopback hub)

REPO = "local/Model-GGUF"
FILE = "Model-Q4_K_M.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a GGUF file to serve as the repository's Q4_K_M")
    options = parser.parse_args()
    data = options.model.read_bytes()
    with tempfile.TemporaryDirectory() as scratch, HubServer([HubRepo(REPO, {FILE: data})]) as hub:
        environment = dict(os.environ, HF_ENDPOINT=hub.endpoint, HF_HOME=f"{scratch}/home",
                           HF_HUB_CACHE=f"{scratch}/cache")
        environment.pop("HF_TOKEN", None)
        command = [sys.executable, "-m", "llama_chat", "-m", f"{REPO}:Q4_K_M", "-p", "What is the capital of France?",
                   "--max-tokens", "16", "--temperature", "0"]
        print(f"{options.model.name}: {len(data) / 1e6:.1f} MB, served from {hub.endpoint}")
        killed = killed_half_way(command, environment, Path(scratch) / "cache", len(data))
        print(f"run 1, killed with {killed / 1e6:.1f} MB of the file on disk")
        for run in (2, 3):
            before, requests_before = served(hub), len(hub.requests)
            started = time.perf_counter()
            done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900)
            seconds = time.perf_counter() - started
            reply = done.stdout.strip().replace("\n", " ")[:60]
            gets = [r.range for r in hub.requests[requests_before:] if r.method == "GET" and r.filename == FILE]
            print(f"run {run}: exit {done.returncode} in {seconds:.1f} s, {(served(hub) - before) / 1e6:.1f} MB "
                  f"served, {len(hub.requests) - requests_before} requests, GETs of the file {gets}; {reply!r}")
        # The killed run's response was cut, so the server's counter leaves it out: what it
        # left on disk stands for it.
        print(f"the file's bytes over all runs: {(killed + served(hub)) / len(data):.3f} x its size")


def served(hub: HubServer) -> int:
    return hub.bytes_served[(REPO, FILE)]


def killed_half_way(command: list[str], environment: dict, cache: Path, size: int) -> int:
    """Start the run and SIGKILL it once half the file is on disk; how much was."""
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        partial = sum(path.stat().st_size for path in cache.glob("models--*/blobs/*.incomplete"))
        if partial >= size // 2:
            break
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return sum(path.stat().st_size for path in cache.glob("models--*/blobs/*.incomplete"))


if __name__ == "__main__":
    main()
