"""The first answers a newcomer sees: six simple questions put to the default model (or
--model) at the sampling a chat starts with, a fresh conversation each, over several runs,
counted right where the reply holds the answer's word.

    python benchmarks/first_answers.py --runs 4                      # the chat's defaults
    python benchmarks/first_answers.py --runs 4 --temperature 0.7    # llama-chat's own default, no card
"""

from __future__ import annotations

import argparse
import re
import time

import torch

from llama_chat.chat.session import Session
from llama_chat.default_model import require_default_model
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.loading import load

QUESTIONS = (
    ("What is the capital of France?", r"\bparis\b"),
    ("What is 2 + 2?", r"\b4\b|\bfour\b"),
    ("What is the largest planet in our solar system?", r"\bjupiter\b"),
    ("Who wrote Romeo and Juliet?", r"\bshakespeare\b"),
    ("What is the boiling point of water in Celsius?", r"\b100\b"),
    ("What is the chemical symbol for gold?", r"\bau\b"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a path or name (default: the default model)")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--temperature", type=float, help="instead of what the chat starts with")
    parser.add_argument("--top-p", type=float, help="instead of what the chat starts with")
    parser.add_argument("--max-tokens", type=int, default=64)
    options = parser.parse_args()
    model = load(options.model or require_default_model())
    settings = SamplingSettings(max_tokens=options.max_tokens)
    for source, values in model.recommended:
        print(f"{source}: {values}")
        settings = SamplingSettings(**{**vars(settings), **values})
    overrides = {name: value for name, value in (("temperature", options.temperature), ("top_p", options.top_p))
                 if value is not None}
    settings = SamplingSettings(**{**vars(settings), **overrides})
    print(f"model {model.name}; temperature {settings.temperature}, top_p {settings.top_p}, top_k {settings.top_k}, "
          f"min_p {settings.min_p}, repeat_penalty {settings.repeat_penalty}; {options.runs} runs; torch "
          f"{torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    right = 0
    started = time.perf_counter()
    for run in range(options.runs):
        for question, answer in QUESTIONS:
            session = Session(model, SamplingSettings(**{**vars(settings), "seed": 1000 * run + len(question)}))
            reply = session.send(question).run().reply.strip()
            correct = re.search(answer, reply, re.IGNORECASE) is not None
            right += correct
            print(f"run {run + 1} {'right' if correct else 'WRONG'}: {question} -> {reply[:120]!r}")
    print(f"{right} of {options.runs * len(QUESTIONS)} right ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
