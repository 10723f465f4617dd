"""Top-1 agreement of the packed cpu paths with float32 on the default model (or --model).

Teacher-forced over the same text, each position is compared with the float32 model's
choice there: `decode` feeds one token at a time (the single-token kernels), `steps`
feeds the text in steps of --step tokens (the multi-token kernels). Prints one line each,
with the largest and mean logit difference.

    .venv/bin/python benchmarks/fidelity.py [--model FILE.gguf] [--positions 256] [--step 16]
"""

from __future__ import annotations

import argparse

import torch

import llama_chat
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
    return model.step(model.new_cache(len(ids) + 8), ids, every_logits=True, chunk_size=step)


def compare(fast: llama_chat.Llama, reference: torch.Tensor, ids: list[int], step: int) -> tuple[float, float, float]:
    got = step_logits(fast, ids, step)
    difference = (got - reference).abs()
    agreement = float((got.argmax(-1) == reference.argmax(-1)).float().mean())
    return agreement, float(difference.max()), float(difference.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--step", type=int, default=16)
    options = parser.parse_args()
    path = options.model or str(download_default_model())
    exact = llama_chat.load(path, device="cpu", dtype="float32")
    fast = llama_chat.load(path, device="cpu")
    ids = exact.tokenizer.encode(TEXT * 4)[: options.positions]
    reference = exact.logits(ids)
    print(f"{fast.quantization} weights, {fast.weights_note}; {len(ids)} positions")
    for name, step in (("decode", 1), (f"steps of {options.step}", options.step)):
        agreement, largest, mean = compare(fast, reference, ids, step)
        print(f"{name}: top-1 agreement {agreement:.3f}, logits within {largest:.2f} (mean {mean:.3f})")


if __name__ == "__main__":
    main()
