"""Loading a packed model through the packed cache (packed_cache.py holds the entries'
format): mapped from entries for this source and packing where they are there, else packed
from the source straight into new entries and then mapped, so the process keeps no private
copy either way. Under tensor parallelism each rank's share of the split matrices is an
entry of its own, and the replicated tensors (embedding, head, norms) one entry that every
rank maps, so the ranks on a host hold them once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.disk_cache import read_checked
from llama_chat.engine.model import Transformer
from llama_chat.errors import first_line
from llama_chat.kernels import packed_cache
from llama_chat.kernels.backend import PackedBackend, Progress, Source
from llama_chat.kernels.packed_build import build_packed_transformer, fill_packed_transformer
from llama_chat.kernels.packed_cache_entries import make_room
from llama_chat.kernels.quantize import Mode
from llama_chat.parallel.sharding import is_sharded
from llama_chat.process_memory import return_freed_memory


def packed_from_cache(
    checkpoint: Checkpoint, backend: PackedBackend, modes: dict[str, Mode], source: Source, progress: Progress
) -> tuple[Transformer, str]:
    """The Transformer packed by `backend`, mapped from the packed cache (pruned to
    source.cache_bound_gb first), or packed in memory where the cache is off or cannot be
    used; and a note when the cache could not be used."""
    entries = entry_paths(source, modes)
    if entries is None:
        return build_packed_transformer(checkpoint, backend, modes, progress), ""
    note = ""
    transformer = build_packed_transformer(checkpoint, backend, modes, progress, read=False)
    if all(entry.exists() for entry in entries.values()):
        _, damage = read_checked(
            entries.values(), lambda: transformer.load_state_dict(mapped_entries(entries.values()), assign=True),
            damage=(OSError, ValueError, RuntimeError, KeyError),
        )
        if not damage:
            return transformer, note
        note = f"packed cache rebuilt ({damage})"
        transformer = build_packed_transformer(checkpoint, backend, modes, progress, read=False)
    try:
        pack_into_new_entries(transformer, checkpoint, entries, source, progress)
    except _CacheUnusable as error:
        transformer = build_packed_transformer(checkpoint, backend, modes, progress)
        note = f"packed cache not written ({first_line(error.__cause__)})"
    return transformer, note


def entry_paths(source: Source, modes: dict[str, Mode]) -> dict[str, Path] | None:
    """The entries the model is kept in, by kind ("own", and under tensor parallelism
    "replicated"); None when the cache is off."""
    shard = source.shard
    ranks = shard is not None and shard.world > 1
    own = packed_cache.entry_path(source.path, {"modes": modes, "shard": [shard.rank, shard.world] if ranks else None})
    if own is None:
        return None
    if not ranks:
        return {"own": own}
    replicated = packed_cache.entry_path(source.path, {"modes": modes, "replicated_of": shard.world})
    return {"own": own, "replicated": replicated}


def entry_parts(
    layout: dict[str, torch.Tensor], source: Source
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, str]]:
    """The tensors each entry holds, by kind, and the name `llama-chat cache` shows for it."""
    shard, name = source.shard, source.path.name
    if shard is None or shard.world == 1:
        return {"own": layout}, {"own": name}
    parts = {"own": {n: t for n, t in layout.items() if is_sharded(n)},
             "replicated": {n: t for n, t in layout.items() if not is_sharded(n)}}
    names = {"own": f"{name}, rank {shard.rank} of {shard.world}",
             "replicated": f"{name}, shared by {shard.world} ranks"}
    return parts, names


def pack_into_new_entries(
    transformer: Transformer, checkpoint: Checkpoint, entries: dict[str, Path], source: Source, progress: Progress
) -> None:
    """Pack the checkpoint into new entries laid out as `transformer` (on the meta device but
    for what was packed at layout), then map them into it. Raises _CacheUnusable where the
    cache cannot take or give back an entry; errors reading the weights end the load (the
    new entries are removed)."""
    layout = transformer.state_dict(keep_vars=True)  # keep_vars: a tied table is one tensor under two names
    parts, names = entry_parts(layout, source)
    new_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in layout.values()}.values())
    _cache_step(make_room, entries["own"].parent, new_bytes, set(entries.values()), source.cache_bound_gb)
    with ExitStack() as stack:
        views = {}
        for kind, part in parts.items():
            writing = packed_cache.writing(entries[kind], part, names[kind])
            views.update(_cache_step(stack.enter_context, writing))
        for name, tensor in layout.items():
            if not tensor.is_meta:  # packed at layout (PyTorch's int8 rows)
                views[name].copy_(tensor)
        transformer.load_state_dict(views, assign=True, strict=True)
        fill_packed_transformer(transformer, checkpoint, progress)
    transformer.load_state_dict(_cache_step(mapped_entries, entries.values()), assign=True, strict=True)
    return_freed_memory()  # packing's temporaries


class _CacheUnusable(Exception):
    """The packed cache could not take or give back an entry: the model is packed in memory."""


def _cache_step(step: Callable, *arguments):
    try:
        return step(*arguments)
    except (OSError, ValueError, RuntimeError) as error:  # RuntimeError: a file that cannot be mapped
        raise _CacheUnusable from error


def mapped_entries(entries: Iterable[Path]) -> dict[str, torch.Tensor]:
    """The tensors of packed-cache entries, each mapped read-only."""
    return {name: tensor for entry in entries for name, tensor in packed_cache.load(entry).items()}
