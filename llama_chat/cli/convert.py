"""`llama-chat convert SRC DST`: any supported checkpoint to a Hugging Face-style directory."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors import SafetensorError

from llama_chat.checkpoints.detect import read_checkpoint
from llama_chat.checkpoints.hf_writer import write_hf_directory
from llama_chat.engine.device import resolve_dtype
from llama_chat.errors import LlamaChatError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat convert", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a .gguf file, or a Meta or Hugging Face checkpoint directory")
    parser.add_argument("destination", help="the directory to create (must not exist yet)")
    parser.add_argument("--dtype", default="float32", help="float32 (default, exact), bfloat16 or float16")
    options = parser.parse_args(argv)
    destination = Path(options.destination).expanduser()
    if destination.exists():
        raise LlamaChatError(f"{destination} already exists; give a new directory to convert into")
    dtype = resolve_dtype(options.dtype, torch.device("cpu"))
    checkpoint = read_checkpoint(options.source)
    try:
        write_hf_directory(checkpoint, destination, dtype)
    except SafetensorError as error:  # its own I/O errors, a full disk among them
        raise LlamaChatError(f"{destination}: cannot write the weights ({error})") from None
    print(destination)
    return 0
