"""llama_chat.load: read a checkpoint (checkpoints/detect picks the reader) and put the model on a device.

Readers hand out matrices that are read only when asked for, so the model is built one
weight at a time by the weight back-end cpu_paths.choose_backend picks (kernels/backend.py):
on the cpu each matrix is packed as it is read, with no dense copy of the model at any
point; elsewhere, or with --quantize none, each is converted to the model's dtype and moved
to the device. Progress is reported to an
observer the caller may pass (the command line's shows a bar on a terminal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch

from llama_chat.checkpoints.contents import Checkpoint, Weight, stored_bytes
from llama_chat.checkpoints.detect import read_checkpoint
from llama_chat.engine.device import resolve_device
from llama_chat.errors import LlamaChatError
from llama_chat.kernels.backend import Progress, Source
from llama_chat.kernels.cpu_paths import choose_backend
from llama_chat.kernels.quantize import refuse_unpackable
from llama_chat.llama import Llama
from llama_chat.models.cards import CARD, card_sampling
from llama_chat.models.resolve import note_on_stderr, resolve
from llama_chat.models.source import ModelSource
from llama_chat.options import DTYPES, LoadOptions, named_dtype
from llama_chat.parallel.sharding import Shard, add_all_reduces, local_args, shard_state
from llama_chat.text.format_choice import get_chat_format


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


def load(
    name: str | Path | ModelSource,
    options: LoadOptions | None = None,
    *,
    shard: Shard | None = None,
    progress: Callable[[str, int], Progress] = NoProgress,
    **settings: str | None,
) -> Llama:
    """Load a model onto `options.device` (auto: cuda, mps, else cpu).

    `name` is a path, a Hugging Face Hub id (fetched into the Hugging Face cache unless it
    is there) or the name of a model another tool keeps on this machine: see models/names.py.

    `options` (LoadOptions: every default auto) are the command line's or a caller's;
    `settings` change some of their fields, for a caller's convenience (device="cpu").
    On the cpu the weights are packed (`quantize`: auto, int8, int4; none keeps them
    dense in `dtype`); a packed model keeps float32 activations, and the dtypes its
    matrix products and kernels take are measured on this CPU unless `dtype` or
    `kernel_dtype` name them. With a `shard`, only that tensor-parallel rank's rows and
    columns are read, and its blocks sum their outputs over the process group.
    `progress(description, total_bytes)` makes what the load reports its progress to.
    `kv_dtype` is the KV cache's dtype (auto: what the back-end asks for, float16 where
    llama-chat's kernels attend over it, else the model's).
    """
    options = (options or LoadOptions()).replaced(**settings)
    device = resolve_device(options.device)
    refuse_unpackable(options.quantize, device)  # a bad setting is refused before any read
    model_source = resolve(name)
    for note in model_source.notes:
        note_on_stderr(note)
    checkpoint = read_share(model_source.path, shard)
    source = model_source.path
    chosen_format = _chat_format(options.chat_format, checkpoint, model_source.name)
    reporter = progress(f"loading {model_source.name}", sum(stored_bytes(w) for w in _unique_tensors(checkpoint)))
    try:
        with reading_errors(source):
            backend, modes, transformer, note = _build(checkpoint, options, device, Source(
                source, shard, options.packed_kernels().packed_cache_gb), reporter)
    finally:
        reporter.close()
    kv_dtype = resolve_kv_dtype(options.kv_dtype)
    if shard is not None and shard.world > 1:
        add_all_reduces(transformer)
    model = Llama(
        transformer, checkpoint.tokenizer, name=model_source.name, chat_format=chosen_format,
        weights=backend.record(modes, note), cache_dtype=kv_dtype or backend.kv_cache_dtype(),
        recommended=recommended_sampling(checkpoint, model_source), source=model_source,
    )
    model.set_prompt_math(options.prompt_math)
    return model


def _chat_format(asked: str | None, checkpoint: Checkpoint, origin: str):
    """The format `asked` for (--chat-format), else the checkpoint's own template's."""
    return get_chat_format(asked, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token,
                           checkpoint.eos_token, origin=origin, context_length=checkpoint.args.max_seq_len)


def _unique_tensors(checkpoint: Checkpoint) -> list:
    """The checkpoint's tensors, each once (tied weights are one tensor under two names)."""
    return list({id(tensor): tensor for tensor in checkpoint.tensors.values()}.values())


def _build(checkpoint: Checkpoint, options: LoadOptions, device, weights_source: Source, reporter: Progress):
    """The weight back-end chosen for this CPU or device, its modes, and the Transformer it
    builds (with a note on the packed cache)."""
    backend, modes = choose_backend(checkpoint, options.quantize, device, options.dtype, options.packed_kernels())
    transformer, note = backend.build(checkpoint, modes, weights_source, reporter)
    return backend, modes, transformer, note


def recommended_sampling(checkpoint: Checkpoint, source: ModelSource) -> tuple[tuple[str, dict], ...]:
    """The sampling recommended for the model, each with where it comes from, the weakest
    first: its model card, its file's own keys, the store's settings (ollama's params)."""
    names = (source.name, source.path.name, *checkpoint.names)
    layers = [(CARD, card_sampling(names, checkpoint.chat_template is not None)), ("model file", checkpoint.sampling),
              (source.sampling_source, source.sampling)]
    return tuple((label, values) for label, values in layers if values)


def read_share(path: str | Path, shard: Shard | None) -> Checkpoint:
    """The checkpoint at `path`, or under tensor parallelism this rank's share of it."""
    checkpoint = read_checkpoint(path)
    if shard is None or shard.world == 1:
        return checkpoint
    return dataclasses.replace(
        checkpoint, args=local_args(checkpoint.args, shard.world),
        tensors=shard_state(checkpoint.tensors, checkpoint.args, shard),
    )


def resolve_kv_dtype(name: str | None) -> torch.dtype | None:
    """--kv-dtype: auto (None: the loader's choice, see load) or float32, bfloat16, float16."""
    refusal = f"unknown --kv-dtype {(name or '').lower()!r}: use auto, float32, bfloat16 or float16"
    return named_dtype(name, DTYPES, refusal)


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
