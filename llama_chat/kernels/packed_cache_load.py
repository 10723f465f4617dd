"""Loading a packed model through the packed cache (packed_cache.py holds the entries'
format): mapped from entries for this source and packing where they are there, else packed
into private memory laid out as new entries, the model ready at once, and the entries
written from that memory behind the chat (packed_cache_writer.py), which then maps them in
place of the private pages. Under tensor parallelism each rank's share of the split
matrices is an entry of its own, and the replicated tensors (embedding, head, norms) one
entry that every rank maps, so the ranks on a host hold them once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.disk_cache import read_checked
from llama_chat.engine.model import Transformer
from llama_chat.errors import first_line
from llama_chat.kernels import packed_cache
from llama_chat.kernels.backend import PackedBackend, Progress, Source
from llama_chat.kernels.packed_build import build_packed_transformer, fill_packed_transformer
from llama_chat.kernels.packed_cache import EntryImage
from llama_chat.kernels.packed_cache_writer import EntryWrite, images_being_written
from llama_chat.kernels.quantize import Mode
from llama_chat.parallel.sharding import is_sharded
from llama_chat.process_memory import return_freed_memory


def packed_from_cache(
    checkpoint: Checkpoint, backend: PackedBackend, modes: dict[str, Mode], source: Source, progress: Progress
) -> tuple[Transformer, str]:
    """The Transformer packed by `backend`: mapped from the packed cache's entries where they
    are there, else packed into private memory and its entries written behind the chat (the
    cache pruned to source.cache_bound_gb first), or packed in memory where the cache is off
    or cannot be used; and a note when the cache could not be used."""
    entries = entry_paths(source, modes)
    if entries is None:
        return build_packed_transformer(checkpoint, backend, modes, progress), ""
    note = ""
    transformer = build_packed_transformer(checkpoint, backend, modes, progress, read=False)
    images = images_being_written(set(entries.values()))
    if images is not None:  # this process loaded the model a moment ago: its packing, shared
        views = {name: view for image in images.values() for name, view in image.views.items()}
        transformer.load_state_dict(views, assign=True, strict=True)
        return transformer, note
    if all(entry.exists() for entry in entries.values()):
        _, damage = read_checked(
            entries.values(), lambda: transformer.load_state_dict(mapped_entries(entries.values()), assign=True),
            damage=(OSError, ValueError, RuntimeError, KeyError),
        )
        if not damage:
            return transformer, note
        note = f"packed cache rebuilt ({damage})"
        transformer = build_packed_transformer(checkpoint, backend, modes, progress, read=False)
    images = pack_into_images(transformer, checkpoint, source, progress)
    try:
        write = _cache_step(EntryWrite.reserve, {entries[kind]: image for kind, image in images.items()},
                            source.path.name, source.cache_bound_gb)
    except _CacheUnusable as error:
        return transformer, f"packed cache not written ({first_line(error.__cause__)})"
    write.start()  # the model answers meanwhile
    return transformer, note


def entry_paths(source: Source, modes: dict[str, Mode]) -> dict[str, Path] | None:
    """The entries the model is kept in, by kind ("own", and under tensor parallelism
    "replicated"); None when the cache is off."""
    shard = source.shard
    ranks = shard is not None and shard.world > 1
    own = packed_cache.packed_entry(source.path, {"modes": modes, "shard": [shard.rank, shard.world] if ranks else None})
    if own is None:
        return None
    if not ranks:
        return {"own": own}
    replicated = packed_cache.packed_entry(source.path, {"modes": modes, "replicated_of": shard.world})
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


def pack_into_images(
    transformer: Transformer, checkpoint: Checkpoint, source: Source, progress: Progress
) -> dict[str, EntryImage]:
    """Pack the checkpoint into private memory laid out as the new entries (EntryImage, by
    kind) and as `transformer` (on the meta device but for what was packed at layout),
    whose tensors become views of it. Errors reading the weights end the load."""
    layout = transformer.state_dict(keep_vars=True)  # keep_vars: a tied table is one tensor under two names
    parts, names = entry_parts(layout, source)
    images = {kind: EntryImage(part, names[kind]) for kind, part in parts.items()}
    views = {name: view for image in images.values() for name, view in image.views.items()}
    for name, tensor in layout.items():
        if not tensor.is_meta:  # packed at layout (PyTorch's int8 rows)
            views[name].copy_(tensor)
    transformer.load_state_dict(views, assign=True, strict=True)
    fill_packed_transformer(transformer, checkpoint, progress)
    return_freed_memory()  # packing's temporaries
    return images


class _CacheUnusable(Exception):
    """The packed cache could not take an entry: the model stays packed in memory."""


def _cache_step(step: Callable, *arguments):
    try:
        return step(*arguments)
    except (OSError, ValueError, RuntimeError) as error:  # RuntimeError: a file that cannot be mapped
        raise _CacheUnusable from error


def mapped_entries(entries: Iterable[Path]) -> dict[str, torch.Tensor]:
    """The tensors of packed-cache entries, each mapped read-only."""
    return {name: tensor for entry in entries for name, tensor in packed_cache.load_entry(entry).items()}
