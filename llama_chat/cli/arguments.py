"""Command-line argument types and flags shared by the chat and its sub-commands."""

from __future__ import annotations

import argparse
import math

import torch

from llama_chat.kernels.quantize import QUANTIZE_MODES
from llama_chat.options import PACKED_DTYPES, PROMPT_MATHS, packed_dtype


def positive_int(text: str) -> int:
    """argparse type: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def finite_float(text: str) -> float:
    """argparse type: a real number, not nan or inf."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def kernel_dtype(text: str) -> torch.dtype | None:
    """argparse type: a dtype the packed kernels take, or None for auto (measured)."""
    if text.lower() not in ("auto", *PACKED_DTYPES):
        raise argparse.ArgumentTypeError(f"{text!r}: use auto, bfloat16 or float32")
    return packed_dtype(text, "--kernel-dtype")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say which model runs and how it is loaded: one declaration, for the
    chat and `bench` alike (cli/options.py makes the load options of them)."""
    model = parser.add_argument_group("the model and how it is loaded")
    model.add_argument("--model", "-m", help="a .gguf file or a checkpoint directory; a Hugging Face Hub id "
                       "OWNER/REPO[:QUANT|/FILE][@REVISION]; ollama:NAME; or a name `llama-chat models` lists "
                       "(default: SmolLM2-135M-Instruct)")
    model.add_argument("--chat-format", help="llama3, llama2, chatml, gemma, plain, or template (the model's own)")
    model.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    model.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16: the model's dtype; "
                       "with packed cpu weights, what prompt steps multiply in, auto measured (default: auto)")
    model.add_argument("--quantize", default="auto", choices=QUANTIZE_MODES,
                       help="pack weights for the cpu; auto: int4 where the file stores 4-bit groups, int8 "
                       "otherwise, none with --dtype float32 or off the cpu (default: auto)")
    model.add_argument("--kernel-dtype", default=None, type=kernel_dtype,
                       help="bfloat16 or float32 for the packed single-token kernels (default: auto, "
                       "measured on this CPU)")
    model.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                       help="the KV cache's dtype (default: auto: float16 where llama-chat's kernels attend, "
                            "else the model's)")
    model.add_argument("--prompt-math", default="exact", choices=PROMPT_MATHS,
                       help="prompt chunks (steps of more than 32 tokens) on llama-chat's kernels: exact (16-bit "
                       "activations, float32-grade) or fast (8-bit activation blocks, as ik_llama.cpp runs them; "
                       "replies and verify steps stay exact) (default: exact)")
    model.add_argument("--tp", type=positive_int, default=1,
                       help="split the model over N processes on this host (tensor parallel, on the cpu; memory "
                       "is then given per rank); under torchrun the group comes from the launcher (default: 1)")
