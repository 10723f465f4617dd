"""llama_chat.load: find out what a path holds, read it, and put the model on a device.

A GGUF file is dequantised on every read, which takes seconds; the first load therefore
also writes the checkpoint as a Hugging Face folder (safetensors in the dtype the model
runs in, which load by memory-mapping without a conversion) into the cache folder, and
later loads of the same unchanged file read that instead.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import torch
from safetensors import SafetensorError

from .chat_format import get_chat_format
from .checkpoints.checkpoint import Checkpoint
from .checkpoints.gguf import GGUF_MAGIC, load_gguf
from .checkpoints.hf import load_hf_directory
from .checkpoints.meta import load_meta_directory
from .convert import write_hf_directory
from .device import DTYPES, resolve_device, resolve_dtype
from .errors import LlamaChatError
from .llama import Llama
from .model import Transformer
from .quantize import check_quantization, choose_quantization, quantize_transformer


def cache_root() -> Path | None:
    """$LLAMA_CHAT_CACHE ("off" for none), else $XDG_CACHE_HOME/llama-chat or ~/.cache/llama-chat."""
    configured = os.environ.get("LLAMA_CHAT_CACHE")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama-chat"


def gguf_cache_dir(path: Path, dtype: torch.dtype) -> Path | None:
    """Where the conversion of this GGUF file to `dtype` lives; a changed file gets a new folder."""
    root = cache_root()
    if root is None:
        return None
    stat = path.stat()
    identity = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    dtype_name = str(dtype).removeprefix("torch.")
    return root / f"{path.stem}-{dtype_name}-{hashlib.sha256(identity).hexdigest()[:16]}"


def read_gguf(path: Path, dtype: torch.dtype, use_cache: bool = True) -> Checkpoint:
    cached = gguf_cache_dir(path, dtype) if use_cache else None
    if cached is not None and (cached / "config.json").is_file():
        return load_hf_directory(cached)
    checkpoint = load_gguf(path, dtype=dtype)
    if cached is not None:
        try:
            write_hf_directory(checkpoint, cached, dtype)
        except (OSError, SafetensorError):
            pass  # a cache that cannot be written (a full disk) only costs time
    return checkpoint


def read_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32, *, use_cache: bool = True) -> Checkpoint:
    """Read a GGUF file, a Hugging Face directory (config.json) or a Meta one (params.json).

    GGUF weights are dequantised into `dtype` when they are not cached (`use_cache`
    reads and writes the conversion cache); the other formats keep the dtype they were
    stored in until build_transformer converts them.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise LlamaChatError(f"{path}: no such file or directory")
    if path.is_file():
        with open(path, "rb") as file:
            if file.read(4) == GGUF_MAGIC:
                return read_gguf(path, dtype, use_cache)
        raise LlamaChatError(
            f"{path}: not a GGUF file; give a .gguf file or a directory with config.json or params.json"
        )
    if (path / "config.json").is_file():
        return load_hf_directory(path)
    if (path / "params.json").is_file():
        return load_meta_directory(path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return read_gguf(ggufs[0], dtype, use_cache)
    found = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no checkpoint"
    raise LlamaChatError(
        f"{path}: {found}; expected config.json (Hugging Face), params.json (Meta) or one .gguf file"
    )


def build_transformer(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Transformer:
    """The Transformer with the checkpoint's weights, converting one tensor at a time."""
    transformer = Transformer(checkpoint.args)  # uninitialised: the weights are replaced below
    tensors = checkpoint.tensors
    tied = checkpoint.args.tie_embeddings
    if tied:
        tensors.pop("output.weight", None)  # the embedding table itself: converted once, below
    converted = {}
    for name in list(tensors):
        converted[name] = tensors.pop(name).to(device=device, dtype=dtype)
    if tied:
        converted["output.weight"] = converted["tok_embeddings.weight"]
    try:
        transformer.load_state_dict(converted, strict=True, assign=True)
    except RuntimeError as error:
        # The first line only names the module; the second says which tensors are wrong.
        detail = (str(error).strip().splitlines() + [""])[1].strip()[:300]
        raise LlamaChatError(f"the checkpoint's tensors do not fit the model: {detail}") from None
    if tied:
        transformer.output.weight = transformer.tok_embeddings.weight
    return transformer.to(device)  # the weights are there already; this moves the rotary tables


def load(
    path: str | Path,
    *,
    device: str | None = None,
    dtype: str | None = None,
    chat_format: str | None = None,
    quantize: str = "auto",
) -> Llama:
    """Load a model from local files onto `device` (auto: cuda, mps, else cpu) as `dtype`.

    `quantize` (none, int8, int4, auto) packs the weights for fast cpu decoding, in
    bfloat16; auto does so on the cpu unless another dtype is asked for.
    """
    resolved_device = resolve_device(device)
    dtype_name = (dtype or "auto").lower()
    runs_in_bfloat16 = dtype_name == "auto" or DTYPES.get(dtype_name) is torch.bfloat16
    if quantize == "auto" and not runs_in_bfloat16:
        quantize = "none"  # an explicit float32 or float16 asks for the unpacked model
    # Whether to pack is known now; int4 or int8 only once the file says how it was stored.
    packed = choose_quantization(quantize, resolved_device, None) != "none"
    if packed and not runs_in_bfloat16:
        raise LlamaChatError(f"--quantize {quantize} runs in bfloat16; use --dtype bfloat16 or --quantize none")
    resolved_dtype = torch.bfloat16 if packed else resolve_dtype(dtype, resolved_device)
    checkpoint = read_checkpoint(path, resolved_dtype)
    args = checkpoint.args
    # Every projection's input width: dim, the attention heads' total, the SwiGLU width.
    input_widths = math.gcd(args.dim, args.n_heads * args.head_dim, args.hidden_dim)
    mode = choose_quantization(quantize, resolved_device, checkpoint.source_quantization, input_widths)
    check_quantization(mode, resolved_device, input_widths)
    chosen_format = get_chat_format(
        chat_format, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token, checkpoint.eos_token
    )
    transformer = build_transformer(checkpoint, resolved_device, resolved_dtype)
    if mode != "none":
        quantize_transformer(transformer, mode)
    return Llama(
        transformer,
        checkpoint.tokenizer,
        name=Path(path).expanduser().name,
        chat_format=chosen_format,
        stop_ids=checkpoint.stop_ids,
        quantization=mode,
    )
