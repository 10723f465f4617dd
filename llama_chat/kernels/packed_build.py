"""A Transformer whose matrices a packed back-end packs as they are read: built in memory,
or laid out on the meta device for the packed cache to fill (packed_cache_load.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.engine.model import Transformer
from llama_chat.engine.threads import process_threads
from llama_chat.kernels.backend import PackedBackend, Progress
from llama_chat.kernels.block_linear import BlockEmbedding, BlockLinear, StackedBlockLinear
from llama_chat.kernels.packed import PackedEmbedding, PackedHead, Scratch
from llama_chat.kernels.quantize import Mode
from llama_chat.process_memory import return_freed_memory


def build_packed_transformer(
    checkpoint: Checkpoint, backend: PackedBackend, modes: dict[str, Mode], progress: Progress, *, read: bool = True
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
    pool = ThreadPoolExecutor(max_workers=process_threads() if read else 1)
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
    pool = ThreadPoolExecutor(max_workers=process_threads())
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


def place_packed(transformer: Transformer, backend: PackedBackend, module_name: str, packed: nn.Module) -> None:
    if module_name == "tok_embeddings":
        # The head too, replaced when it has a table of its own.
        transformer.tok_embeddings, transformer.output = backend.embedding(packed), backend.head(packed)
    elif module_name == "output":
        transformer.output = backend.head(packed)
    else:
        transformer.set_submodule(module_name, packed)

