"""llama.cpp's fidelity to a reference on given token ids, teacher-forced, as JSON on stdout.

Runs under any Python that has llama-cpp-python (numpy only: it imports neither torch nor
llama_chat); benchmarks/fidelity.py calls it with --peer-python, with the ids and the
float32 reference's logits it wrote, to set llama.cpp's figures beside llama-chat's on the
same file. The ids are fed --step tokens a llama.cpp batch (n_batch = n_ubatch = step,
every position's logits asked for) and each block of positions is compared with the
reference's as it comes (benchmarks/fidelity_stats.py), so llama.cpp holds a batch of
logits and this process a block, never the whole text's.

    python benchmarks/llama_cpp_fidelity.py MODEL.gguf IDS.json REFERENCE.f32 [--step 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from fidelity_stats import Agreement, Reference, block_for, peak_memory_mb  # a sibling module, numpy only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("ids", help="a JSON list of token ids")
    parser.add_argument("reference", help="the reference's float32 logits [positions, vocabulary], raw")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step", type=int, default=64, help="tokens a llama.cpp batch holds")
    options = parser.parse_args()
    import llama_cpp

    ids = json.loads(Path(options.ids).read_text())
    llm = llama_cpp.Llama(
        options.model, n_ctx=len(ids), n_batch=options.step, n_ubatch=options.step, n_threads=options.threads,
        n_threads_batch=options.threads, verbose=False,
    )
    vocabulary = llm.n_vocab()
    reference = Reference(Path(options.reference), len(ids), vocabulary)
    agreement = Agreement()
    block = block_for(options.step)
    rows = np.empty((block, vocabulary), dtype=np.float32)
    batch = llama_cpp.llama_batch_init(options.step, 0, 1)
    try:
        for start in range(0, len(ids), block):
            stop = min(start + block, len(ids))
            for at in range(start, stop, options.step):
                count = min(options.step, stop - at)
                batch.n_tokens = count
                for i in range(count):
                    batch.token[i], batch.pos[i], batch.logits[i] = ids[at + i], at + i, True
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                if llama_cpp.llama_decode(llm.ctx, batch) != 0:
                    raise SystemExit(f"llama_decode failed at position {at}")
                # llama.cpp's own buffer: the batch's rows, in order, copied into the block.
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(count * vocabulary,))
                rows[at - start : at - start + count] = logits.reshape(count, vocabulary)
            agreement.add(reference.rows(start, stop), rows[: stop - start])
    finally:
        llama_cpp.llama_batch_free(batch)
    print(json.dumps({**agreement.summary(), "peak_memory_mb": peak_memory_mb()}))


if __name__ == "__main__":
    main()
