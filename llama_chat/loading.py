"""llama_chat.load: find out what a path holds, read it, and put the model on a device.

Readers hand out matrices that are read only when asked for, so the model is built one
weight at a time: on the cpu each matrix is packed (int4 or int8) as it is read, with
no dense copy of the model at any point; elsewhere, or with --quantize none, each is
converted to the model's dtype and moved to the device. A load that takes longer than
a second shows its progress on a terminal.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from llama_chat.checkpoints.checkpoint import Checkpoint
from llama_chat.checkpoints.gguf import GGUF_MAGIC, load_gguf
from llama_chat.checkpoints.hf import load_hf_directory
from llama_chat.checkpoints.meta import load_meta_directory
from llama_chat.checkpoints.stored import GROUP, StoredMatrix
from llama_chat.cli.arguments import QUANTIZE_MODES
from llama_chat.engine.device import DTYPES, resolve_device, resolve_dtype
from llama_chat.engine.model import Transformer
from llama_chat.errors import LlamaChatError
from llama_chat.kernels.cpu_paths import CpuPaths, choose_cpu_paths
from llama_chat.kernels.packed import (
    Int8Table,
    PackedEmbedding,
    PackedHead,
    PackedLinear,
    Scratch,
    int4_layout,
    int8_kernels_available,
    return_freed_memory,
)
from llama_chat.llama import Llama
from llama_chat.parallel.sharding import Shard, add_all_reduces, local_args, shard_state
from llama_chat.text.chat_format import get_chat_format

# GGUF types whose values fit int4 groups of 32 exactly, when a converted checkpoint says
# its float weights came from one of them (it says so for the whole file, so only weights
# still stored as floats take the hint).
FOUR_BIT_SOURCES = ("Q4_0", "Q4_1", "Q4_K")
PROGRESS_AFTER_SECONDS = 1.0


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
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0])
    found = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no checkpoint"
    raise LlamaChatError(
        f"{path}: {found}; expected config.json (Hugging Face), params.json (Meta) or one .gguf file"
    )


def packs(quantize: str, device: torch.device, dtype: str | None) -> bool:
    """Whether the weights are packed: on the cpu, unless asked not to. `auto` with an explicit
    float32 or float16 asks for the exact, unpacked model."""
    if quantize not in QUANTIZE_MODES:
        raise LlamaChatError(f"unknown quantisation {quantize!r}: use auto, none, int8 or int4")
    if quantize == "none":
        return False
    if device.type != "cpu":
        if quantize != "auto":
            raise LlamaChatError(f"--quantize {quantize} runs on the cpu only; on {device.type} use --quantize none")
        return False
    if not int8_kernels_available():
        if quantize != "auto":
            raise LlamaChatError("this PyTorch has no packed weight kernels; use --quantize none")
        return False
    name = (dtype or "auto").lower()
    return quantize != "auto" or name == "auto" or DTYPES.get(name) is torch.bfloat16


def fits_int4(source: StoredMatrix) -> bool:
    layout = int4_layout()
    rows, columns = source.shape
    return layout is not None and columns % GROUP == 0 and rows % layout.block == 0


def matrix_mode(source: StoredMatrix, quantize: str, source_quantization: str | None, name: str) -> str:
    """int4 for weights stored as 4-bit groups (or when asked), int8 otherwise."""
    if quantize == "int4":
        if not fits_int4(source):
            raise LlamaChatError(
                f"{name} ({source.shape[0]} x {source.shape[1]}) does not split into this CPU's int4 blocks; "
                "use --quantize int8"
            )
        return "int4"
    if quantize == "int8":
        return "int8"
    four_bit = source.four_bit or (source.float_storage and source_quantization in FOUR_BIT_SOURCES)
    return "int4" if four_bit and fits_int4(source) else "int8"


class LoadProgress:
    """A rich progress bar on stderr, shown only on a terminal and only once a load has
    taken longer than PROGRESS_AFTER_SECONDS."""

    def __init__(self, description: str, total_bytes: int) -> None:
        self.description = description
        self.total = total_bytes
        self.done = 0
        self.started = time.perf_counter()
        self._bar = None
        self._task = None

    @contextmanager
    def item(self, what: str, weight) -> Iterator[None]:
        """Reading and converting one weight: shown while it runs, counted when done."""
        self._show(what)
        yield
        self.done += stored_bytes(weight)
        self._show(what)

    def _show(self, what: str) -> None:
        if self._bar is None:
            if time.perf_counter() - self.started < PROGRESS_AFTER_SECONDS or not sys.stderr.isatty():
                return
            self._start()
        self._bar.update(self._task, completed=self.done, what=what)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description} [dim]{task.fields[what]}"), BarColumn(), DownloadColumn(),
            TimeRemainingColumn(), console=Console(stderr=True), transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.description, total=self.total, completed=self.done, what="")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextmanager
def reading_errors(source: Path) -> Iterator[None]:
    """Errors met while reading the weights (a truncated file) as one line naming the file."""
    try:
        yield
    except (OSError, ValueError) as error:
        raise LlamaChatError(f"{source}: cannot read the weights ({error})") from None


def build_transformer(
    checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, progress: LoadProgress
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


def layer_matrix_modes(checkpoint: Checkpoint, quantize: str) -> dict[str, str]:
    """How each of the layers' matrices will be packed, by name (nothing is read)."""
    return {
        name: matrix_mode(weight, quantize, checkpoint.source_quantization, name)
        for name, weight in checkpoint.tensors.items()
        if isinstance(weight, StoredMatrix) and name not in ("tok_embeddings.weight", "output.weight")
    }


def build_packed_transformer(
    checkpoint: Checkpoint, paths: CpuPaths, modes: dict[str, str], progress: LoadProgress
) -> Transformer:
    """The Transformer with every matrix packed as it is read (the layers' as `modes` says,
    the embedding and output head as int8 tables)."""
    args = checkpoint.args
    tensors = checkpoint.tensors
    with torch.device("meta"):
        transformer = Transformer(args)
    scratch = Scratch()
    embedding, head = tensors["tok_embeddings.weight"], tensors["output.weight"]
    # Matrices pack on as many threads as PyTorch uses (reading, decoding and packing
    # release the GIL); each holds one block of rows at a time, so memory stays bounded.
    pool = ThreadPoolExecutor(max_workers=torch.get_num_threads())
    try:
        packing = {"tok_embeddings.weight": pool.submit(Int8Table, embedding, scratch)}
        if head is not embedding:
            packing["output.weight"] = pool.submit(Int8Table, head, scratch)
        for name, mode in modes.items():
            packing[name] = pool.submit(
                PackedLinear, tensors[name], mode, scratch, paths.kernel_dtype, paths.kernel_rows, paths.matmul_dtype
            )
        for name, weight in tensors.items():
            if name == "output.weight" and head is embedding:
                continue  # the embedding's table, placed with it
            module_name, _, attribute = name.rpartition(".")
            with progress.item(module_name, weight):
                if name in packing:
                    place_packed(transformer, module_name, packing.pop(name).result())
                    return_freed_memory()
                else:
                    vector = nn.Parameter(weight.float(), requires_grad=False)
                    setattr(transformer.get_submodule(module_name), attribute, vector)
    finally:
        # An interrupted load (Ctrl-C at /load) stops after the matrices being packed now.
        pool.shutdown(cancel_futures=True)
    return transformer


def place_packed(transformer: Transformer, module_name: str, packed: PackedLinear | Int8Table) -> None:
    if module_name == "tok_embeddings":
        transformer.tok_embeddings = PackedEmbedding(packed, torch.float32)
        transformer.output = PackedHead(packed)  # replaced when the head has a table of its own
    elif module_name == "output":
        transformer.output = PackedHead(packed)
    else:
        transformer.set_submodule(module_name, packed)


def stored_bytes(weight) -> int:
    return weight.stored_bytes if isinstance(weight, StoredMatrix) else weight.numel() * weight.element_size()


def describe_packing(modes: dict[str, str]) -> str:
    """'int4', 'int8', or 'int4 and int8' by what the layers' matrices are packed as."""
    return " and ".join(sorted(set(modes.values()))) or "none"


def load(
    path: str | Path,
    *,
    device: str | None = None,
    dtype: str | None = None,
    chat_format: str | None = None,
    quantize: str = "auto",
    kernel_dtype: str | None = None,
    shard: Shard | None = None,
) -> Llama:
    """Load a model from local files onto `device` (auto: cuda, mps, else cpu).

    On the cpu the weights are packed (`quantize`: auto, int8, int4; none keeps them
    dense in `dtype`); a packed model keeps float32 activations, and the dtypes its
    matrix products and kernels take are measured on this CPU unless `dtype` or
    `kernel_dtype` name them. With a `shard`, only that tensor-parallel rank's rows and
    columns are read, and its blocks sum their outputs over the process group.
    """
    resolved_device = resolve_device(device)
    packed = packs(quantize, resolved_device, dtype)
    checkpoint = read_checkpoint(path)
    if shard is not None and shard.world > 1:
        checkpoint = dataclasses.replace(
            checkpoint, args=local_args(checkpoint.args, shard.world),
            tensors=shard_state(checkpoint.tensors, checkpoint.args, shard),
        )
    args = checkpoint.args
    chosen_format = get_chat_format(
        chat_format, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token, checkpoint.eos_token
    )
    source = Path(path).expanduser()
    total = sum(stored_bytes(w) for w in {id(w): w for w in checkpoint.tensors.values()}.values())
    progress = LoadProgress(f"loading {source.name}", total)
    try:
        with reading_errors(source):
            if packed:
                modes = layer_matrix_modes(checkpoint, quantize)
                most_used = Counter(modes.values()).most_common(1)[0][0]
                paths = choose_cpu_paths(args, most_used, dtype, kernel_dtype)
                transformer = build_packed_transformer(checkpoint, paths, modes, progress)
                weights_note, quantization = paths.describe(), describe_packing(modes)
            else:
                resolved_dtype = resolve_dtype(dtype, resolved_device)
                transformer = build_transformer(checkpoint, resolved_device, resolved_dtype, progress)
                weights_note, quantization = "", "none"
    finally:
        progress.close()
    if shard is not None and shard.world > 1:
        add_all_reduces(transformer)
    return Llama(
        transformer,
        checkpoint.tokenizer,
        name=source.name,
        chat_format=chosen_format,
        quantization=quantization,
        weights_note=weights_note,
    )


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
