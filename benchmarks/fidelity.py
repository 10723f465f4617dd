"""How closely the packed cpu paths follow float32 on the default model (or --model), as the
field measures it: the share of positions with the same top token, and the mean KL
divergence of the next-token distribution from float32's.

Teacher-forced over the same text, each position is compared with the float32 model's
(the file's weights dequantised to float32) there: `decode` feeds one token at a time
(the single-token kernels), `verify steps` feeds it 9 tokens at a time (a speculative
verify step: a token and 8 drafts) and `steps` --step tokens at a time (prompt chunks).
With --peer-python (an interpreter with llama-cpp-python), llama.cpp's logits on the same
file and ids are measured the same way (benchmarks/llama_cpp_logits.py), a token at a time
and in steps.

    .venv/bin/python benchmarks/fidelity.py [--model FILE.gguf] [--positions 256] [--step 16] [--peer-python PY]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

import llama_chat
from llama_chat.cli.options import configure_folders, options_from_environment
from llama_chat.default_model import download_default_model

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type with an oil-based ink and a wooden press. "
    "La révolution industrielle a transformé l'Europe au XIXe siècle: les usines, les chemins de fer "
    "et les villes ont grandi ensemble. "
    "Der Rhein ist einer der längsten Flüsse Europas und fließt von den Alpen bis zur Nordsee. "
    "El agua hierve a cien grados Celsius al nivel del mar, pero a menos temperatura en las montañas. "
    "Москва — столица России и крупнейший город страны. "
    "长城是中国古代的军事防御工程，全长两万多公里。"
    "東京は日本の首都であり、世界最大の都市圏の一つです。 "
    "def mean(values):\n    return sum(values) / len(values)\n\nprint(mean([1, 2, 3]))\n"
    "Photosynthesis converts light energy into chemical energy stored in glucose. 🌱☀️"
)


def step_logits(model: llama_chat.Llama, ids: list[int], step: int) -> torch.Tensor:
    """Logits at every position, the text fed `step` tokens at a time through the cache."""
    return model.runner(model.new_cache(len(ids) + 8), ids, every_logits=True, chunk_size=step)


VERIFY_STEP = 9  # a token and 8 drafts (speculation's most by default)
PEER_SCRIPT = Path(__file__).with_name("llama_cpp_logits.py")


def agreement(got: torch.Tensor, reference: torch.Tensor) -> str:
    """Same top token, mean KL divergence from the reference, and the largest logit difference."""
    same = float((got.argmax(-1) == reference.argmax(-1)).float().mean())
    log_p, log_q = reference.log_softmax(-1), got.log_softmax(-1)
    divergence = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    return f"same top token {same:.3f}, KL divergence {divergence:.2e}, logits within {float((got - reference).abs().max()):.2f}"


def llama_cpp_logits(python: str, model: str, ids: list[int], step: int) -> torch.Tensor:
    with tempfile.TemporaryDirectory() as folder:
        ids_file, out = Path(folder, "ids.json"), Path(folder, "logits.npy")
        ids_file.write_text(json.dumps(ids))
        subprocess.run([python, str(PEER_SCRIPT), model, str(ids_file), str(out), "--step", str(step)], check=True)
        return torch.from_numpy(np.load(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--step", type=int, default=16)
    parser.add_argument("--peer-python", help="an interpreter with llama-cpp-python: llama.cpp's figures too")
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = options_from_environment()
    path = options.model or str(download_default_model())
    exact = llama_chat.load(path, environment, device="cpu", dtype="float32")
    fast = llama_chat.load(path, environment, device="cpu")
    ids = exact.tokenizer.encode(TEXT * 4)[: options.positions]
    reference = exact.logits(ids)
    print(f"{fast.quantization} weights, {fast.weights_note}; {len(ids)} positions against float32")
    for name, step in (("decode", 1), (f"verify steps of {VERIFY_STEP}", VERIFY_STEP),
                       (f"steps of {options.step}", options.step)):
        print(f"llama-chat {name}: {agreement(step_logits(fast, ids, step), reference)}")
    if options.peer_python:
        for name, step in (("decode", 1), (f"steps of {options.step}", options.step)):
            got = llama_cpp_logits(options.peer_python, path, ids, step)
            print(f"llama.cpp {name}: {agreement(got, reference)}")


if __name__ == "__main__":
    main()
