"""Which reader a path needs: a GGUF file, a Hugging Face directory, or a Meta one."""

from __future__ import annotations

import re
from pathlib import Path

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.gguf import GGUF_MAGIC, load_gguf
from llama_chat.checkpoints.hf import load_hf_directory
from llama_chat.checkpoints.meta import load_meta_directory
from llama_chat.errors import LlamaChatError

LATER_PART = re.compile(r"-(?!00001)\d{5}-of-\d{5}\.gguf$")  # a split model is named by its first part


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a GGUF file, a Hugging Face directory (config.json) or a Meta one (params.json):
    metadata and tokenizer now, the matrices when the model is built."""
    path = Path(path).expanduser()
    if not path.exists():
        raise LlamaChatError(f"{path}: no such file or directory")
    if path.is_file():
        with open(path, "rb") as file:
            if file.read(4) == GGUF_MAGIC:
                return load_gguf(path)
        raise LlamaChatError(
            f"{path}: not a GGUF file; give a .gguf file or a directory with config.json or params.json"
        )
    if (path / "config.json").is_file():
        return load_hf_directory(path)
    if (path / "params.json").is_file():
        return load_meta_directory(path)
    ggufs = sorted(file for file in path.glob("*.gguf") if not LATER_PART.search(file.name))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0])
    found = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no checkpoint"
    raise LlamaChatError(
        f"{path}: {found}; expected config.json (Hugging Face), params.json (Meta) or one .gguf file"
    )
