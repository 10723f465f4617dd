"""llama_chat.load: find out what a path holds, read it, and put the model on a device."""

from __future__ import annotations

from pathlib import Path

import torch

from .chat_format import get_chat_format
from .checkpoints.checkpoint import Checkpoint
from .checkpoints.gguf import load_gguf
from .checkpoints.hf import load_hf_directory
from .checkpoints.meta import load_meta_directory
from .device import resolve_device, resolve_dtype
from .errors import LlamaChatError
from .llama import Llama
from .model import Transformer, rope_tables

GGUF_MAGIC = b"GGUF"


def read_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Read a GGUF file, a Hugging Face directory (config.json) or a Meta one (params.json).

    GGUF weights are dequantised straight into `dtype`; the other formats keep the dtype
    they were stored in until build_transformer converts them.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise LlamaChatError(f"{path}: no such file or directory")
    if path.is_file():
        with open(path, "rb") as file:
            if file.read(4) == GGUF_MAGIC:
                return load_gguf(path, dtype=dtype)
        raise LlamaChatError(
            f"{path}: not a GGUF file; give a .gguf file or a directory with config.json or params.json"
        )
    if (path / "config.json").is_file():
        return load_hf_directory(path)
    if (path / "params.json").is_file():
        return load_meta_directory(path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0], dtype=dtype)
    found = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no checkpoint"
    raise LlamaChatError(
        f"{path}: {found}; expected config.json (Hugging Face), params.json (Meta) or one .gguf file"
    )


def build_transformer(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Transformer:
    """The Transformer with the checkpoint's weights, converting one tensor at a time."""
    with torch.device("meta"):  # no memory for weights that are about to be replaced
        transformer = Transformer(checkpoint.args)
    tensors = checkpoint.tensors
    converted = {}
    for name in list(tensors):
        converted[name] = tensors.pop(name).to(device=device, dtype=dtype)
    if checkpoint.args.tie_embeddings:
        converted["output.weight"] = converted["tok_embeddings.weight"]
    try:
        transformer.load_state_dict(converted, strict=True, assign=True)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0]
        raise LlamaChatError(f"the checkpoint's tensors do not fit the model: {first_line}") from None
    if checkpoint.args.tie_embeddings:
        transformer.output.weight = transformer.tok_embeddings.weight
    cos, sin = rope_tables(checkpoint.args, checkpoint.args.max_seq_len)
    transformer.rope_cos, transformer.rope_sin = cos.to(device), sin.to(device)
    return transformer


def load(
    path: str | Path,
    *,
    device: str | None = None,
    dtype: str | None = None,
    chat_format: str | None = None,
) -> Llama:
    """Load a model from local files onto `device` (auto: cuda, mps, else cpu) as `dtype`."""
    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    checkpoint = read_checkpoint(path, resolved_dtype)
    chosen_format = get_chat_format(
        chat_format, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token, checkpoint.eos_token
    )
    transformer = build_transformer(checkpoint, resolved_device, resolved_dtype)
    return Llama(
        transformer,
        checkpoint.tokenizer,
        name=Path(path).expanduser().name,
        chat_format=chosen_format,
        stop_ids=checkpoint.stop_ids | chosen_format.stop_ids,
    )
