"""Measure llama.cpp (through llama-cpp-python) on a GGUF file the way `llama-chat bench` does.

Load the model, prefill a prompt of given token ids, then decode greedily ignoring end
tokens; one short warm-up run first, then the median of --repeats runs. Peak memory is
this process's maximum resident set size.

Runs under any Python that has llama_cpp installed: it imports neither torch nor
llama_chat. llama-chat's prompt ids come from torch's generator, so they are passed in
with --prompt-ids (benchmarks/compare_speed.py does that and runs both programs).

    python benchmarks/compare_with_llama_cpp.py MODEL.gguf --prompt-ids ids.json --json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np


def peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def read_prompt_ids(source: str) -> list[int]:
    text = sys.stdin.read() if source == "-" else Path(source).read_text()
    ids = json.loads(text)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise SystemExit(f"{source}: expected a JSON list of token ids")
    return ids


class Runner:
    """Greedy prefill/decode on one llama.cpp context, reading the last logits in place."""

    def __init__(self, llm, n_vocab: int) -> None:  # llm: llama_cpp.Llama
        import llama_cpp

        self.llm = llm
        self.n_vocab = n_vocab
        self._get_logits_ith = llama_cpp.llama_get_logits_ith

    def next_token(self) -> int:
        # A view of llama.cpp's own buffer: no copy of the vocabulary-sized row per token.
        pointer = self._get_logits_ith(self.llm.ctx, -1)
        logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return int(logits.argmax())

    def measure(self, prompt: Sequence[int], new_tokens: int) -> dict:
        self.llm.reset()  # n_past = 0; the next eval drops the old keys/values
        started = time.perf_counter()
        self.llm.eval(prompt)
        prefill_seconds = time.perf_counter() - started
        token = self.next_token()
        first_token_at = time.perf_counter()
        for _ in range(new_tokens - 1):
            self.llm.eval([token])
            token = self.next_token()
        decode_seconds = time.perf_counter() - first_token_at
        return {
            "prefill_tokens_per_second": len(prompt) / prefill_seconds,
            # As llama-chat counts it: the first token comes out of the prefill.
            "decode_tokens_per_second": (new_tokens - 1) / decode_seconds if new_tokens > 1 else 0.0,
            "time_to_first_token": first_token_at - started,
            "prefill_seconds": prefill_seconds,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="GGUF file")
    parser.add_argument("--prompt-ids", metavar="FILE",
                        help="JSON list of prompt token ids, '-' for stdin (default: --prompt-tokens ids "
                             "from numpy's generator, which differ from llama-chat's)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt length without --prompt-ids")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512, help="llama.cpp n_batch and n_ubatch")
    parser.add_argument("--no-mmap", action="store_true", help="read the file into memory instead of mapping it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args(argv)

    prompt = read_prompt_ids(options.prompt_ids) if options.prompt_ids else None
    prompt_length = len(prompt) if prompt else options.prompt_tokens

    import llama_cpp

    memory_before = peak_memory_mb()
    started = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(options.model),
        n_ctx=prompt_length + options.new_tokens + 16,
        n_threads=options.threads,
        n_threads_batch=options.threads,
        n_batch=options.batch,
        n_ubatch=options.batch,
        use_mmap=not options.no_mmap,
        verbose=False,
    )
    load_seconds = time.perf_counter() - started
    memory_after_load = peak_memory_mb()

    n_vocab = llm.n_vocab()
    if prompt is None:
        prompt = np.random.default_rng(0).integers(0, n_vocab, prompt_length).tolist()
    if max(prompt) >= n_vocab:
        raise SystemExit(f"prompt id {max(prompt)} is outside the vocabulary of {n_vocab}")

    runner = Runner(llm, n_vocab)
    # Warm-up at full prompt size: pages the weights in and sizes llama.cpp's buffers.
    runner.measure(prompt, 8)
    runs = [runner.measure(prompt, options.new_tokens) for _ in range(options.repeats)]
    result: dict = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    result.update(
        program="llama.cpp",
        llama_cpp_python=llama_cpp.__version__,
        model=options.model.name,
        threads=options.threads,
        prompt_tokens=len(prompt),
        new_tokens=options.new_tokens,
        repeats=options.repeats,
        mmap=not options.no_mmap,
        load_seconds=load_seconds,
        peak_memory_mb=peak_memory_mb(),
        memory_before_load_mb=memory_before,
        peak_memory_after_load_mb=memory_after_load,
        system_info=llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    )
    if options.json:
        print(json.dumps(result))
        return 0
    print(f"llama.cpp (llama-cpp-python {result['llama_cpp_python']}) on {result['model']}, "
          f"{result['threads']} threads, median of {result['repeats']}")
    print(f"load: {result['load_seconds']:.2f} s")
    print(f"prefill ({result['prompt_tokens']} tokens): {result['prefill_tokens_per_second']:.1f} tok/s")
    print(f"decode ({result['new_tokens']} tokens): {result['decode_tokens_per_second']:.1f} tok/s")
    print(f"time to first token: {result['time_to_first_token'] * 1000:.0f} ms")
    print(f"peak memory: {result['peak_memory_mb']:.0f} MB ({result['memory_before_load_mb']:.0f} MB before loading)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
