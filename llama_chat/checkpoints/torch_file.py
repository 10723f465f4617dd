"""PyTorch weight files (.pth, .bin), read memory-mapped and with no pickled code allowed."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from llama_chat.errors import LlamaChatError


def load_torch_file(path: Path) -> dict[str, torch.Tensor]:
    """A PyTorch weight file's tensors, memory-mapped, refusing any pickled code."""
    if not path.is_file():
        raise LlamaChatError(f"{path}: no such file")
    with open(path, "rb") as file:
        header = file.read(4)
    is_zip = header == b"PK\x03\x04"
    # PyTorch files are zip archives, or bare pickles (protocol marker 0x80) from before 2020.
    if not is_zip and header[:1] != b"\x80":
        raise LlamaChatError(f"{path}: not a readable PyTorch weight file (neither a zip archive nor a pickle)")
    try:
        # Files from before PyTorch's zip format cannot be memory-mapped.
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError:
        raise LlamaChatError(
            f"{path}: refused: needs arbitrary code to load (it holds more than tensors); "
            "use a safetensors or plain-tensor checkpoint"
        ) from None
    except Exception as error:  # torch reports damaged files with many exception types
        raise LlamaChatError(f"{path}: not a readable PyTorch weight file ({type(error).__name__}: {error})") from None
    if not isinstance(loaded, dict) or not all(isinstance(key, str) for key in loaded):
        raise LlamaChatError(f"{path}: expected a dictionary of named tensors, found {type(loaded).__name__}")
    return loaded
