"""A model in ollama's store, loaded by its name and read where it lies: the process's memory
before and after the load and a reply, split into mapped file pages (shared, the blob's)
and the process's own, beside the blob's size. The store is laid out in a temporary folder
as ollama lays it out (tests/ollama_store.py), holding the given GGUF file.

    python benchmarks/store_memory.py --model weights/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.ollama_store import add_model  # noqa: E402 (the suite's store layout)


def memory() -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of this process, in MB."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                fields[name] = int(value.split()[0]) / 1024
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = Path(scratch) / "models"
        add_model(store, options.model.read_bytes(), model="bench", tag="latest", template=None)
        os.environ["OLLAMA_MODELS"] = str(store)
        from llama_chat.chat.session import Session
        from llama_chat.loading import load

        before = memory()
        model = load("ollama:bench")
        loaded = memory()
        Session(model).send("What is the capital of France?").run()
        replied = memory()
        blob = model.source.path
        files = sorted(path.relative_to(store) for path in store.rglob("*") if path.is_file())
        print(f"blob {blob.name[:19]}... {blob.stat().st_size / 1e6:.1f} MB; files in the store: {len(files)}")
        for label, values in (("before the load", before), ("after the load", loaded), ("after a reply", replied)):
            print(f"{label}: resident {values['VmRSS']:.0f} MB = mapped files {values['RssFile']:.0f} MB + "
                  f"the process's own {values['RssAnon']:.0f} MB")
        print(f"the load and reply added {replied['RssFile'] - before['RssFile']:.0f} MB of mapped file pages and "
              f"{replied['RssAnon'] - before['RssAnon']:.0f} MB of the process's own")


if __name__ == "__main__":
    main()
