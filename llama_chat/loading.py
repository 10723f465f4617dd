"""llama_chat.load: read a checkpoint (checkpoints/detect picks the reader) and put the model on a device.

Readers hand out matrices that are read only when asked for, so the model is built one
weight at a time: on the cpu each matrix is packed (int4 or int8) as it is read, with
no dense copy of the model at any point; elsewhere, or with --quantize none, each is
converted to the model's dtype and moved to the device. Progress is reported to an
observer the caller may pass (the command line's shows a bar on a terminal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from llama_chat.checkpoints.contents import Checkpoint, Weight, stored_bytes
from llama_chat.checkpoints.detect import read_checkpoint
from llama_chat.checkpoints.stored import StoredMatrix
from llama_chat.disk_cache import read_checked
from llama_chat.engine.device import DTYPES, resolve_device, resolve_dtype
from llama_chat.engine.model import Transformer
from llama_chat.errors import DeviceError, LlamaChatError, first_line
from llama_chat.kernels import packed_cache
from llama_chat.kernels.backend import WeightBackend
from llama_chat.kernels.block_linear import BlockEmbedding, BlockLinear, StackedBlockLinear
from llama_chat.kernels.cpu_paths import choose_backend
from llama_chat.kernels.packed import PackedEmbedding, PackedHead, Scratch
from llama_chat.kernels.packed_cache_entries import make_room
from llama_chat.kernels.quantize import packs
from llama_chat.llama import Llama
from llama_chat.options import LoadOptions
from llama_chat.parallel.sharding import Shard, add_all_reduces, is_sharded, local_args, shard_state
from llama_chat.process_memory import return_freed_memory
from llama_chat.text.format_choice import get_chat_format


class Progress(Protocol):
    """What a load reports: each weight as it is read and converted, then the end."""

    def item(self, what: str, weight: Weight) -> AbstractContextManager[None]: ...

    def close(self) -> None: ...


class NoProgress:
    """Reports nothing (a load's default)."""

    def __init__(self, description: str, total_bytes: int) -> None:
        pass

    def item(self, what: str, weight: Weight) -> AbstractContextManager[None]:
        return nullcontext()

    def close(self) -> None:
        pass


@contextmanager
def reading_errors(source: Path) -> Iterator[None]:
    """Errors met while reading the weights (a truncated file) as one line naming the file."""
    try:
        yield
    except (OSError, ValueError) as error:
        raise LlamaChatError(f"{source}: cannot read the weights ({error})") from None


def build_transformer(
    checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, progress: Progress
) -> Transformer:
    """The Transformer with the checkpoint's weights as dense `dtype` tensors on `device`,
    converted one tensor at a time."""
    with torch.device("meta"):
        transformer = Transformer(checkpoint.args)
    converted: dict[int, torch.Tensor] = {}  # by source, so a tied head is converted once
    state = {}
    for name, weight in checkpoint.tensors.items():
        if id(weight) not in converted:
            with progress.item(name, weight):
                value = weight.dense() if isinstance(weight, StoredMatrix) else weight
                converted[id(weight)] = value.to(device=device, dtype=dtype)
        state[name] = converted[id(weight)]
    try:
        transformer.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        # The first line only names the module; the second says which tensors are wrong.
        detail = (str(error).strip().splitlines() + [""])[1].strip()[:300]
        raise LlamaChatError(f"the checkpoint's tensors do not fit the model: {detail}") from None
    if checkpoint.args.tie_embeddings:
        transformer.output.weight = transformer.tok_embeddings.weight
    return transformer.to(device)  # the weights are there already; this moves the rotary tables


def build_packed_transformer(
    checkpoint: Checkpoint, backend: WeightBackend, modes: dict[str, str], progress: Progress, *, read: bool = True
) -> Transformer:
    """The Transformer with every matrix packed by `backend` as it is read (the layers' as
    `modes` says, the embedding and output head as its tables);
    with read=False, the modules are laid out on the meta device (a state read from the
    packed cache fills them, or fill_packed_transformer), and only matrices for PyTorch's
    kernels are packed."""
    args = checkpoint.args
    tensors = checkpoint.tensors
    with torch.device("meta"):
        transformer = Transformer(args)
    scratch = Scratch()
    embedding, head = tensors["tok_embeddings.weight"], tensors["output.weight"]
    # Matrices pack on as many threads as PyTorch uses (reading, decoding and packing
    # release the GIL); each holds one block of rows at a time, so memory stays bounded.
    pool = ThreadPoolExecutor(max_workers=torch.get_num_threads() if read else 1)
    try:
        packing = {"tok_embeddings.weight": pool.submit(backend.pack_table, embedding, scratch, read=read)}
        if head is not embedding:
            packing["output.weight"] = pool.submit(backend.pack_table, head, scratch, read=read)
        for name, mode in modes.items():
            packing[name] = pool.submit(backend.pack_matrix, tensors[name], mode, scratch, read=read)
        for name, weight in tensors.items():
            if name == "output.weight" and head is embedding:
                continue  # the embedding's table, placed with it
            module_name, _, attribute = name.rpartition(".")
            if not read:
                if name in packing:
                    place_packed(transformer, backend, module_name, packing.pop(name).result())
                else:
                    vector = nn.Parameter(torch.empty(weight.shape, device="meta"), requires_grad=False)
                    setattr(transformer.get_submodule(module_name), attribute, vector)
                continue
            with progress.item(module_name, weight):
                if name in packing:
                    place_packed(transformer, backend, module_name, packing.pop(name).result())
                    return_freed_memory()
                else:
                    vector = nn.Parameter(weight.float(), requires_grad=False)
                    setattr(transformer.get_submodule(module_name), attribute, vector)
    finally:
        # An interrupted load (Ctrl-C at /load) stops after the matrices being packed now.
        pool.shutdown(cancel_futures=True)
    return transformer


def fill_packed_transformer(transformer: Transformer, checkpoint: Checkpoint, progress: Progress) -> None:
    """Pack the checkpoint's weights into the tensors `transformer` holds (laid out by
    build_packed_transformer with read=False, then given memory), matrices on as many
    threads as PyTorch uses. Matrices packed for PyTorch's kernels were packed at layout."""
    tensors = dict(checkpoint.tensors)
    if tensors["output.weight"] is tensors["tok_embeddings.weight"]:
        del tensors["output.weight"]  # the embedding's table, filled with it
    pool = ThreadPoolExecutor(max_workers=torch.get_num_threads())
    try:
        filling = {}
        for name, weight in tensors.items():
            module = transformer.get_submodule(name.rpartition(".")[0])
            if isinstance(module, (PackedEmbedding, PackedHead, BlockEmbedding)):
                filling[name] = pool.submit(module.table.fill, weight)
            elif isinstance(module, (BlockLinear, StackedBlockLinear)):
                filling[name] = pool.submit(module.fill, weight)
        for name, weight in tensors.items():
            module_name, _, attribute = name.rpartition(".")
            vector = getattr(transformer.get_submodule(module_name), attribute, None)
            with progress.item(module_name, weight):
                if name in filling:
                    filling.pop(name).result()
                elif isinstance(vector, nn.Parameter):  # a norm's weights
                    vector.copy_(weight.float())
    finally:
        pool.shutdown(cancel_futures=True)


def packed_from_cache(
    checkpoint: Checkpoint, source: Path, backend: WeightBackend, modes: dict[str, str], shard: Shard | None,
    progress: Progress, bound_gb: float | None = None,
) -> tuple[Transformer, str]:
    """The packed Transformer for llama-chat's kernels, mapped from the packed cache when
    entries for this source and packing are there, else packed from the source straight
    into new entries, then mapped (so the process keeps no private copy either way); and a
    note when the cache could not be used. Under tensor parallelism each rank's share of
    the split matrices is an entry of its own, and the replicated tensors (embedding, head,
    norms) one entry that every rank maps, so the ranks on a host hold them once. The cache
    is pruned to `bound_gb` (LLAMA_CHAT_PACKED_CACHE_GB) first."""
    ranks = shard is not None and shard.world > 1
    own = {"modes": modes, "shard": [shard.rank, shard.world] if ranks else None}
    entries = {"own": packed_cache.entry_path(source, own)}
    if ranks:
        entries["replicated"] = packed_cache.entry_path(source, {"modes": modes, "replicated_of": shard.world})
    if entries["own"] is None:
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
    layout = transformer.state_dict(keep_vars=True)  # keep_vars: a tied table is one tensor under two names
    parts = {"own": layout}
    names = {"own": source.name}
    if ranks:
        parts = {"own": {n: t for n, t in layout.items() if is_sharded(n)},
                 "replicated": {n: t for n, t in layout.items() if not is_sharded(n)}}
        names = {"own": f"{source.name}, rank {shard.rank} of {shard.world}",
                 "replicated": f"{source.name}, shared by {shard.world} ranks"}
    new_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in layout.values()}.values())
    try:
        _cache_step(make_room, entries["own"].parent, new_bytes, set(entries.values()), bound_gb)
        with ExitStack() as stack:
            views = {}
            for kind, part in parts.items():
                writing = packed_cache.writing(entries[kind], part, names[kind])
                views.update(_cache_step(stack.enter_context, writing))
            for name, tensor in layout.items():
                if not tensor.is_meta:  # packed at layout (PyTorch's int8 rows)
                    views[name].copy_(tensor)
            transformer.load_state_dict(views, assign=True, strict=True)
            # Errors reading the weights end the load (the new entries are removed).
            fill_packed_transformer(transformer, checkpoint, progress)
        transformer.load_state_dict(_cache_step(mapped_entries, entries.values()), assign=True, strict=True)
        return_freed_memory()  # packing's temporaries
    except _CacheUnusable as error:
        transformer = build_packed_transformer(checkpoint, backend, modes, progress)
        note = f"packed cache not written ({first_line(error.__cause__)})"
    return transformer, note


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


def packed_transformer(
    checkpoint: Checkpoint, source: Path, backend: WeightBackend, modes: dict[str, str], shard: Shard | None,
    progress: Progress, bound_gb: float | None = None,
) -> tuple[Transformer, str]:
    """The Transformer packed by `backend`: through the packed cache (pruned to bound_gb)
    where the back-end keeps its packing there, else in memory; and packed_from_cache's note."""
    if backend.keeps_packed_cache:
        transformer, note = packed_from_cache(checkpoint, source, backend, modes, shard, progress, bound_gb)
    else:
        transformer, note = build_packed_transformer(checkpoint, backend, modes, progress), ""
    backend.prepare(transformer)
    return transformer, note


def place_packed(transformer: Transformer, backend: WeightBackend, module_name: str, packed: nn.Module) -> None:
    if module_name == "tok_embeddings":
        # The head too, replaced when it has a table of its own.
        transformer.tok_embeddings, transformer.output = backend.embedding(packed), backend.head(packed)
    elif module_name == "output":
        transformer.output = backend.head(packed)
    else:
        transformer.set_submodule(module_name, packed)


def load(
    path: str | Path,
    options: LoadOptions | None = None,
    *,
    shard: Shard | None = None,
    progress: Callable[[str, int], Progress] = NoProgress,
    **settings: str | None,
) -> Llama:
    """Load a model from local files onto `options.device` (auto: cuda, mps, else cpu).

    `options` (LoadOptions: every default auto) are the command line's or a caller's;
    `settings` change some of their fields, for a caller's convenience (device="cpu").
    On the cpu the weights are packed (`quantize`: auto, int8, int4; none keeps them
    dense in `dtype`); a packed model keeps float32 activations, and the dtypes its
    matrix products and kernels take are measured on this CPU unless `dtype` or
    `kernel_dtype` name them. With a `shard`, only that tensor-parallel rank's rows and
    columns are read, and its blocks sum their outputs over the process group.
    `progress(description, total_bytes)` makes what the load reports its progress to.
    `kv_dtype` is the KV cache's dtype (auto: float16 where llama-chat's kernels attend over
    it, else the model's).
    """
    options = (options or LoadOptions()).replaced(**settings)
    resolved_device = resolve_device(options.device)
    packed = packs(options.quantize, resolved_device, options.dtype)  # a bad setting is refused before any read
    checkpoint = read_share(path, shard)
    source = Path(path).expanduser()
    chosen_format = get_chat_format(
        options.chat_format, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token, checkpoint.eos_token,
        origin=source.name, context_length=checkpoint.args.max_seq_len,
    )
    total = sum(stored_bytes(w) for w in {id(w): w for w in checkpoint.tensors.values()}.values())
    reporter = progress(f"loading {source.name}", total)
    cache_dtype = resolve_kv_dtype(options.kv_dtype)
    try:
        with reading_errors(source):
            built = build_on_device(checkpoint, source, options, resolved_device if not packed else None, shard,
                                    reporter)
    finally:
        reporter.close()
    if shard is not None and shard.world > 1:
        add_all_reduces(built.transformer)
    return Llama(
        built.transformer,
        checkpoint.tokenizer,
        name=source.name,
        chat_format=chosen_format,
        quantization=built.quantization,
        weights_note=built.weights_note,
        arithmetic=built.arithmetic,
        cache_dtype=cache_dtype or built.cache_dtype,
        sampling_defaults=checkpoint.sampling,
    )


def read_share(path: str | Path, shard: Shard | None) -> Checkpoint:
    """The checkpoint at `path`, or under tensor parallelism this rank's share of it."""
    checkpoint = read_checkpoint(path)
    if shard is None or shard.world == 1:
        return checkpoint
    return dataclasses.replace(
        checkpoint, args=local_args(checkpoint.args, shard.world),
        tensors=shard_state(checkpoint.tensors, checkpoint.args, shard),
    )


@dataclasses.dataclass(frozen=True)
class Built:
    """A Transformer with its weights in place, and how they run (Llama's words for them)."""

    transformer: Transformer
    quantization: str
    weights_note: str
    arithmetic: str
    cache_dtype: torch.dtype | None  # the KV cache's the back-end asks for (None: the model's)


def build_on_device(
    checkpoint: Checkpoint, source: Path, options: LoadOptions, dense_on: torch.device | None, shard: Shard | None,
    reporter: Progress,
) -> Built:
    """The Transformer dense on `dense_on`, or (None) packed by the back-end chosen for this CPU."""
    if dense_on is not None:
        transformer = build_transformer(checkpoint, dense_on, resolve_dtype(options.dtype, dense_on), reporter)
        return Built(transformer, "none", "", "", None)
    kernels = options.packed_kernels()
    backend, modes = choose_backend(checkpoint, options.quantize, kernels)
    transformer, cache_note = packed_transformer(checkpoint, source, backend, modes, shard, reporter,
                                                 kernels.packed_cache_gb)
    weights_note = backend.describe() + (f"; {cache_note}" if cache_note else "")
    return Built(transformer, backend.quantization(modes), weights_note, backend.arithmetic(), backend.cache_dtype)


def resolve_kv_dtype(name: str | None) -> torch.dtype | None:
    """--kv-dtype: auto (None: the loader's choice, see load) or float32, bfloat16, float16."""
    name = (name or "auto").lower()
    if name == "auto":
        return None
    if name not in DTYPES:
        raise DeviceError(f"unknown --kv-dtype {name!r}: use auto, float32, bfloat16 or float16")
    return DTYPES[name]


def model_memory_bytes(model: Llama) -> int:
    """Bytes of every tensor the model holds (packed weights, tables, norms), each counted once."""
    seen: dict[int, int] = {}
    for module in model.transformer.modules():
        owned = [*vars(module).values(), *module.parameters(recurse=False), *module.buffers(recurse=False)]
        for value in owned:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
