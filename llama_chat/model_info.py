"""What people look up about a model file (`/info`, `llama-chat info MODEL`): read from its
metadata and tokenizer, without reading its weights."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import torch

from llama_chat.checkpoints.detect import read_checkpoint
from llama_chat.checkpoints.gguf_file import MAGIC as GGUF_MAGIC
from llama_chat.checkpoints.gguf_blocks import KERNEL_BLOCK_TYPES
from llama_chat.checkpoints.gguf_split import read_gguf_model
from llama_chat.kernels.quantize import held_as
from llama_chat.models.sizes import human_parameters

_LONGEST_VALUE = 200  # characters of a name or license shown
FLOAT_TYPES = ("F32", "F16", "BF16")


def model_info(path: str | Path) -> list[tuple[str, str]]:
    """(label, value) rows: name, architecture, size, shapes, vocabulary, tensor types,
    license, chat template and stop tokens."""
    path = Path(path)
    checkpoint = read_checkpoint(path)
    args, tokenizer = checkpoint.args, checkpoint.tokenizer
    metadata, types = {}, defaultdict(lambda: [0, 0])
    kernels, split = None, ""
    files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]
    if path.is_file() and is_gguf(path):
        metadata, tensors, files = read_gguf_model(path)
        for info in tensors.values():
            types[info.tensor_type.name][0] += 1
            types[info.tensor_type.name][1] += info.n_bytes
        kernels = kernels_row(tensors.values(), checkpoint.source_quantization)
        split = f", split in {len(files)} parts" if len(files) > 1 else ""
    else:
        for tensor in checkpoint.tensors.values():
            kind, size = tensor_type(tensor)
            types[kind][0] += 1
            types[kind][1] += size
    unique = {id(tensor): tensor for tensor in checkpoint.tensors.values()}  # a tied head counted once
    parameters = sum(math.prod(tensor.shape) for tensor in unique.values())
    stop_names = sorted(f"{tokenizer.token_name(token) or token} ({token})" for token in tokenizer.stop_ids)
    return [
        ("name", _from_file(metadata.get("general.name")) or path.name),
        ("architecture", args.architecture),
        ("file", f"{path} ({sum(p.stat().st_size for p in files) / 1e6:.1f} MB{split})"),
        ("parameters", human_parameters(parameters)),
        ("layers", str(args.n_layers)),
        ("heads", f"{args.n_heads} query, {args.n_kv_heads} key/value, {args.head_dim} wide"
                  + (f", {args.rotary_dim} of them turning" if args.rotary_dim != args.head_dim else "")),
        ("width", f"{args.dim}, feed-forward {args.hidden_dim}"),
        ("context", f"{args.max_seq_len} tokens"),
        ("vocabulary", f"{args.vocab_size} tokens"),
        ("tensor types", ", ".join(f"{kind}: {count} tensors, {size / 1e6:.1f} MB"
                                   for kind, (count, size) in sorted(types.items(), key=lambda item: -item[1][1]))),
        *([("kernels", kernels)] if kernels else []),
        ("license", _from_file(metadata.get("general.license")) or "not stated in the file"),
        ("chat template", "yes, its own" if checkpoint.chat_template else "none (a built-in format is used)"),
        ("stop tokens", ", ".join(stop_names) or "none"),
    ]


def kernels_row(tensors, source_quantization: str | None) -> str:
    """How llama-chat's kernels hold a GGUF file's matrices by default: the types they read as
    the file stores them, and what each other type becomes (quantize.held_as)."""
    kept, converted = set(), defaultdict(int)
    for info in tensors:
        if len(info.shape) != 2:
            continue
        name = info.tensor_type.name
        held = held_as(name if name in KERNEL_BLOCK_TYPES else None, name in FLOAT_TYPES, source_quantization)
        if held == name:
            kept.add(name)
        else:
            converted[(name, held)] += 1
    parts = [f"{', '.join(sorted(kept))} as the file stores them"] if kept else []
    parts += [f"{name} ({count} matrices) read into {held} blocks" for (name, held), count in sorted(converted.items())]
    return "; ".join(parts)


def _from_file(value: object) -> str:
    """A metadata value as a line of at most a few words: the file may hold a megabyte here."""
    text = "" if value is None else str(value)
    return text if len(text) <= _LONGEST_VALUE else text[:_LONGEST_VALUE] + "…"


def is_gguf(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == GGUF_MAGIC


def tensor_type(tensor) -> tuple[str, int]:
    """A non-GGUF checkpoint's tensor: its stored type and bytes."""
    if isinstance(tensor, torch.Tensor):
        return str(tensor.dtype).removeprefix("torch."), tensor.numel() * tensor.element_size()
    kind = tensor.block_type or str(getattr(tensor, "dtype", "float")).removeprefix("torch.")
    return kind, tensor.stored_bytes
