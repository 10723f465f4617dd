"""A conversation's KV cache, saved beside its conversation file so that /open resumes it
without reading the conversation through the model again.

safetensors, never pickle: the keys and values of the positions the conversation holds,
in the cache's own dtype, their token ids, and in the metadata what they depend on (the
model file's identity, the weights mode, the chat format, the system prompt and the
shapes). A file that does not match all of that, or does not read back, is refused with
the reason in one line; the conversation's text never depends on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llama_chat.untrusted_files import parse_json
from llama_chat.disk_cache import read_checked, staged
from llama_chat.engine.cache import KVCache
from llama_chat.errors import CorruptFileError, LlamaChatError, first_line
from llama_chat.kernels.packed_cache import source_identity

KIND = "llama-chat kv cache"
VERSION = "1"
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_TORCH_DTYPES = {name: dtype for dtype, name in _SAFETENSORS_DTYPES.items()}


class CacheNotUsed(LlamaChatError):
    """A saved cache that cannot stand for the conversation; the message says why."""


def cache_path(conversation: Path) -> Path:
    """Where the cache of the conversation file `conversation` is kept: c.json -> c.kv.safetensors."""
    return conversation.with_name(f"{conversation.stem}.kv.safetensors")


def model_source(model, model_path: str | None) -> list:
    """The identity of the model's files (size, mtime, sampled hash), or of weights not from
    a file, their path and name: read once per model, as it costs a few MB of reads."""
    if model_path is not None and Path(model_path).exists():
        return source_identity(Path(model_path))
    return [model_path, model.name]


def identity(model, source: list, system: str | None, tools: Sequence[str] = ()) -> dict:
    """What a saved cache depends on: the keys and values of the same ids differ with any of
    it (the tools offered are written before the conversation)."""
    args = model.args
    depends_on = {
        "model file": source,
        "weights mode": [model.weights.packing, str(model.dtype).removeprefix("torch."), model.weights.arithmetic],
        "chat format": model.chat_format.name,
        "system prompt": system or "",
        "shape": [args.n_layers, args.n_kv_heads, args.head_dim],
    }
    if tools:
        depends_on["tools"] = list(tools)
    if args.rope_scaling.kind == "longrope":  # the keys turned with the factors the context chose
        depends_on["rotary factors"] = "long" if model.transformer.long_rope else "short"
    return depends_on


def save_cache(
    path: Path, cache: KVCache, ids: Sequence[int], depends_on: dict, limit_bytes: int | None = None
) -> int:
    """Write the cached positions that start the conversation's `ids`, atomically; returns
    how many there were (0: nothing written, and any older cache file removed, also when
    they would take more than limit_bytes)."""
    held = cache.exact_length(cache.common_prefix(ids))
    if held == 0 or (limit_bytes is not None and held * cache.position_bytes() > limit_bytes):
        path.unlink(missing_ok=True)
        return 0
    if _holds(path, cache, held, depends_on):
        return held  # written before (the chat keeps its conversation after every input, commands too)
    tensors = cache.state(held)
    metadata = {"kind": KIND, "version": VERSION, "depends on": json.dumps(depends_on, sort_keys=True)}
    with staged(path) as staging:
        save_file(tensors, str(staging), metadata=metadata)
    return held


def _holds(path: Path, cache: KVCache, held: int, depends_on: dict) -> bool:
    """Whether the file at `path` is this cache's first `held` positions already: the same
    tokens, dtype and dependencies (the same ids give the same keys and values)."""
    try:
        with safe_open(str(path), framework="pt") as saved:
            metadata = saved.metadata() or {}
            return (
                metadata.get("kind") == KIND and metadata.get("version") == VERSION
                and metadata.get("depends on") == json.dumps(depends_on, sort_keys=True)
                and saved.get_slice("keys").get_dtype() == _SAFETENSORS_DTYPES.get(cache.dtype)
                and saved.get_tensor("tokens").tolist() == cache.tokens[:held]
            )
    except Exception:  # noqa: BLE001 (missing or damaged: written anew)
        return False


def restore_cache(path: Path, cache: KVCache, ids: Sequence[int], depends_on: dict) -> int:
    """Fill `cache` from the file at `path` and return how many positions it holds; raises
    CacheNotUsed (the cache left empty) when the file is not this conversation's cache,
    and removes it when it does not read back."""
    cache.trim(0)
    read, damage = read_checked([path], lambda: _read_cache(path, cache, ids, depends_on))
    if damage:
        raise CacheNotUsed(f"{path.name} does not read back ({damage[:120]})")
    count, state = read
    cache.load_state(list(ids[:count]), state)
    return count


def _read_cache(
    path: Path, cache: KVCache, ids: Sequence[int], depends_on: dict
) -> tuple[int, dict[str, torch.Tensor]]:
    """How many positions the file at `path` holds, and their keys and values by name. Every shape
    is checked before a tensor is read, so that a file cannot make it read more than this
    conversation's positions. Raises CacheNotUsed when the file is another's cache,
    CorruptFileError when it does not read back."""
    try:
        with safe_open(str(path), framework="pt") as saved:
            metadata = saved.metadata() or {}
            if metadata.get("kind") != KIND or metadata.get("version") != VERSION:
                raise CacheNotUsed(f"{path.name} is not a llama-chat cache of this version")
            saved_depends = parse_json(metadata.get("depends on", "{}"))
            if not isinstance(saved_depends, dict):
                raise CacheNotUsed(f"{path.name} does not say what it was made with")
            for key, value in depends_on.items():
                if saved_depends.get(key) != value:
                    raise CacheNotUsed(f"it was made with another {key}")
            token_slice = saved.get_slice("tokens")
            if len(token_slice.get_shape()) != 1 or token_slice.get_dtype() != "I64":
                raise CacheNotUsed(f"{path.name} holds its tokens in another form than a list of ids")
            count = token_slice.get_shape()[0]
            if count > len(ids) or saved.get_tensor("tokens").tolist() != list(ids[:count]):
                raise CacheNotUsed(f"{path.name} holds other tokens than the conversation")
            expected = cache.state_shapes(count)
            if set(saved.keys()) != {"tokens", *expected}:
                raise CacheNotUsed(f"{path.name} holds other tensors than this model's cache")
            for name, shape in expected.items():
                stored = saved.get_slice(name)
                if stored.get_shape() != shape:
                    raise CacheNotUsed(f"{path.name} holds tensors of other shapes than this model's cache")
                # A float32 file is rounded into a narrower cache as every step's keys are (a
                # cache saved before the cache's default dtype changed); a narrower one cannot
                # stand for a wider cache.
                if stored.get_dtype() not in ("F32", _SAFETENSORS_DTYPES.get(cache.dtype)):
                    dtype = _TORCH_DTYPES.get(stored.get_dtype(), stored.get_dtype())
                    raise CacheNotUsed(f"{path.name} holds a {dtype} cache, this model's is {cache.dtype}")
            if count >= cache.capacity:
                raise CacheNotUsed(
                    f"{path.name} holds {count} positions, too many for a context of {cache.capacity} tokens"
                )
            return count, {name: saved.get_tensor(name) for name in expected}
    except CacheNotUsed:
        raise
    except Exception as error:  # noqa: BLE001 (a damaged file can fail in many ways)
        raise CorruptFileError(first_line(error)) from None
