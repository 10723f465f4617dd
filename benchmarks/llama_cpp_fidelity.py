"""llama.cpp's logits at every position of given token ids, teacher-forced, as a .npy file.

Runs under any Python that has llama-cpp-python (it imports neither torch nor
llama_chat); benchmarks/fidelity.py calls it with --peer-python to set llama.cpp's figures
beside llama-chat's on the same file. The ids are fed in steps of --step tokens (llama.cpp
quantises a step's activations to 8-bit blocks either way).

    python benchmarks/llama_cpp_logits.py MODEL.gguf IDS.json OUT.npy [--threads 2] [--step 16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("ids", help="a JSON list of token ids")
    parser.add_argument("out", help="where the float32 logits [positions, vocabulary] go")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step", type=int, default=16, help="tokens a llama.cpp batch holds")
    options = parser.parse_args()
    import llama_cpp

    ids = json.loads(Path(options.ids).read_text())
    llm = llama_cpp.Llama(
        options.model, n_ctx=len(ids) + 8, n_batch=options.step, n_ubatch=options.step, n_threads=options.threads,
        n_threads_batch=options.threads, logits_all=True, verbose=False,
    )
    llm.eval(ids)
    np.save(options.out, np.asarray(llm.scores[: len(ids)], dtype=np.float32))


if __name__ == "__main__":
    main()
