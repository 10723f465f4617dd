"""Model calls compiled ahead of time, kept on disk and loaded in a moment.

`Transformer.forward_embeddings` for one token has the same shapes at every position
when the cache is given as its buffers and the position as a value read in the call, so
torch.export traces it once and AOTInductor compiles it to a package: fused C++ for the
small operations between the matrix kernels, called from C++ rather than Python. A
second package takes 2 to VERIFY_TOKENS tokens (a token and its drafts, a chat turn).
`_FunctionalCall` is the one adapter that gives the model that form: the cache read
through a CacheCall, as an eager call reads it, whose new keys and values go out for
KVCache.write (a compiled call mutates nothing), and the weights as inputs, not
constants, so a package holds no weights (a few MB), depends only on the weights' shapes
and dtypes, and uses the model's own tensors.

Compiling takes a minute or so, in a child process that works from a copy of the model
with no data (`structure_copy`), so the chat runs eagerly meanwhile and a failure there
cannot take the chat down. Packages are kept per model shape, CPU, thread count and
PyTorch version (`package_key`); later runs load theirs in milliseconds.

    python -m llama_chat.engine.compiled STRUCTURE_FILE CACHE_DTYPE PACKAGE_FILE THREADS
"""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from llama_chat.disk_cache import cache_key, entry_path, read_checked, remove, staged
from llama_chat.engine.cache import TRIM_MARGIN, CacheCall, layer_sources
from llama_chat.engine.device import cpu_model_name
from llama_chat.engine.model import ROTARY_TABLES
from llama_chat.environment import child_environment
from llama_chat.errors import first_line
from llama_chat.parent_watch import end_with_parent

VERIFY_TOKENS = 32  # the multi-token package takes 2 to this many: a token and its drafts, a chat turn


def traced_weights(transformer: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a model call reads from the model, by name (a tied one once)."""
    return {**dict(transformer.named_parameters()), **dict(transformer.named_buffers())}


class _FromEmbeddings(nn.Module):
    """The model's call from embeddings on a cache call, as a module's forward: what
    torch.func.functional_call runs."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, x: torch.Tensor, call: CacheCall) -> torch.Tensor:
        return self.transformer.forward_embeddings(x, call)


class _FunctionalCall(nn.Module):
    """The model's call on a cache in the form export traces: embeddings, the cache's call
    inputs and the weights in; the logits of every token and their keys and values
    [n_layers, time, kv_heads, head_dim] out."""

    def __init__(self, structure: nn.Module) -> None:
        super().__init__()
        self.context = structure.args.max_seq_len
        # Kept outside the module tree: export would otherwise bake its tensors in.
        object.__setattr__(self, "model", _FromEmbeddings(structure))
        self.names = list(traced_weights(self.model))
        self.rotary = list(traced_weights(structure)).index(ROTARY_TABLES[0])  # in the same order
        self.sources = layer_sources(structure.args)

    def forward(self, x, cache_inputs, weights):
        position, *held = cache_inputs
        position = position.item()
        # Where the new tokens may go, told to export, which cannot bound a value read in the call.
        time, capacity = x.shape[1], held[0].shape[2]
        torch._check(position >= 0)
        torch._check(position + time <= capacity)
        torch._check(position + time <= self.context)
        torch._check(position + time <= weights[self.rotary].shape[0])  # the tables grow with the caches made
        call = CacheCall(self.sources, position, held)
        # tie_weights: a tied head is one tensor, named once among the inputs.
        logits = torch.func.functional_call(self.model, dict(zip(self.names, weights)), (x, call), tie_weights=True)
        return logits[0], *call.new_entries()


def traced_sources(transformer: nn.Module) -> list[Path]:
    """The Python files a package's code is traced from: those defining the model's modules
    (blocks, packed matrices, tensor-parallel layers), the package's modules they import
    from (rope, kernels), and this one. Found from the model itself, so no list is kept."""
    names = {type(module).__module__ for module in transformer.modules()} | {__name__}
    names = {name for name in names if name.startswith("llama_chat.")}
    for name in list(names):
        for value in vars(sys.modules[name]).values():
            owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(owner, str) and owner.startswith("llama_chat."):
                names.add(owner)
    return sorted(Path(sys.modules[name].__file__) for name in names)


def package_key(transformer: nn.Module, cache_dtype: torch.dtype) -> str:
    """What a package depends on: the weights' names, shapes and dtypes (the rotary tables'
    but for their length, which the package takes as it comes), the cache's dtype, this CPU,
    PyTorch and the traced code (not the threads: see build_package)."""
    spec = {
        "weights": [[name, list(t.shape[1:] if name in ROTARY_TABLES else t.shape), str(t.dtype)]
                    for name, t in traced_weights(transformer).items()],
        "cache": str(cache_dtype),
        "cpu": [cpu_model_name(), torch.backends.cpu.get_cpu_capability()],
        "torch": torch.__version__,
        "code": [hashlib.sha256(path.read_bytes()).hexdigest() for path in traced_sources(transformer)],
    }
    return cache_key(spec)


def package_path(transformer: nn.Module, cache_dtype: torch.dtype) -> Path | None:
    """Where this model's single-token package is kept (None when caching is off)."""
    folder = entry_path("compiled")
    return None if folder is None else folder / f"decode-{package_key(transformer, cache_dtype)}.pt2"


def available() -> bool:
    """Whether this PyTorch can run a package compiled ahead of time (whether it can also
    build one shows in the child process that tries)."""
    return hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "AOTIModelPackageLoader")


def verify_path(path: Path) -> Path:
    """Where the multi-token package beside the single-token one at `path` is kept."""
    return path.with_name("verify" + path.name.removeprefix("decode"))


def package_files(path: Path) -> list[Path]:
    """Both packages of a model: the single-token one at `path` and the one beside it."""
    return [path, verify_path(path)]


def is_built(path: Path) -> bool:
    """Whether both packages of a model are on disk."""
    return all(file.exists() for file in package_files(path))


def load_packages(path: Path, transformer: nn.Module) -> tuple[CompiledPackages | None, str]:
    """A model's packages opened, and ""; or None and why not in one line, the packages
    removed so that they are built again."""
    return read_checked(package_files(path), lambda: CompiledPackages(path, transformer), damage=(Exception,))


def build_packages(structure: nn.Module, cache_dtype: torch.dtype, destination: Path) -> None:
    """Both packages of `structure`: one token at destination, then 2 to VERIFY_TOKENS
    tokens beside it (the single-token one first: a chat uses it most)."""
    # One already there stays: a compile the chat ended half-way goes on where it was.
    for path, most_tokens in ((destination, 1), (verify_path(destination), VERIFY_TOKENS)):
        if not path.exists():
            build_package(structure, cache_dtype, path, most_tokens)


INDUCTOR_SETTINGS = {
    # Keep every rounding the code asks for (to bfloat16 before a kernel and back).
    "emulate_precision_casts": True,
    # The code generated here is a step's element-wise work, small at one token; the
    # matrices and attention are operators that run on the threads the chat sets. One
    # thread: the generated count is fixed, and a thread waiting on a second that another
    # process holds made a busy machine's steps 4x slower (2 cores: 46 against 177 tok/s
    # on the default model, the chat on one thread); idle, two were 4% faster.
    "cpp.threads": 1,
    # Keep small element-wise results (the final norm) in memory: inlined into the
    # output head's loop, they were computed again for every row of the vocabulary.
    "realize_cpu_opcount_threshold": 4,
}


def build_package(
    structure: nn.Module, cache_dtype: torch.dtype, destination: Path, most_tokens: int
) -> None:
    """Export and compile the call of `structure` (a model, or a copy without data) for one
    token (most_tokens 1) or for 2 to most_tokens tokens, into a package at destination,
    written whole or not at all."""
    # Uninitialised stand-ins: tracing reads only their shapes, so no memory is touched. The
    # rotary tables' length varies (as long as the caches made need): 16 stands for any.
    traced = traced_weights(structure)
    weights = [
        torch.empty((16, *t.shape[1:]) if name in ROTARY_TABLES else t.shape, dtype=t.dtype)
        if t.device.type == "meta" or name in ROTARY_TABLES else t
        for name, t in traced.items()
    ]
    args = structure.args
    sources = layer_sources(args)
    windowed = [kind for kind, _ in sources].count(True)
    time = min(most_tokens, 4)
    cache_shape = (args.n_layers - windowed, args.n_kv_heads, 16, args.head_dim)
    # The position, then the global layers' buffers (see KVCache.call_inputs).
    cache_inputs = [torch.tensor(8), torch.zeros(cache_shape, dtype=cache_dtype),
                    torch.zeros(cache_shape, dtype=cache_dtype)]
    capacity = torch.export.Dim("capacity", min=2, max=args.max_seq_len)
    # The tokens' axis, where it varies (embeddings [1, tokens, dim], window_bias [tokens, ring]).
    token_axis = {} if most_tokens == 1 else {"tokens": torch.export.Dim("tokens", min=2, max=most_tokens)}
    tokens = {1: token_axis["tokens"]} if token_axis else {}
    cache_dynamic = [{}, {2: capacity}, {2: capacity}]
    if windowed:  # window_bias [tokens, ring] and the rings (a small cache's ring is its capacity)
        most_slots = min(args.sliding_window + TRIM_MARGIN, args.max_seq_len)
        ring_shape = (windowed, args.n_kv_heads, min(16, most_slots), args.head_dim)
        cache_inputs += [torch.zeros(time, ring_shape[2]), torch.zeros(ring_shape, dtype=cache_dtype),
                         torch.zeros(ring_shape, dtype=cache_dtype)]
        ring = torch.export.Dim("ring", min=2, max=most_slots)
        cache_dynamic += [{**({0: token_axis["tokens"]} if token_axis else {}), 1: ring}, {2: ring}, {2: ring}]
    example = (torch.zeros(1, time, args.dim), cache_inputs, weights)  # the tokens' embeddings first
    positions = torch.export.Dim("positions", min=2, max=args.max_seq_len)
    dynamic = (tokens, cache_dynamic, [{0: positions} if name in ROTARY_TABLES else {} for name in traced])
    with torch.no_grad():
        program = torch.export.export(_FunctionalCall(structure), example, dynamic_shapes=dynamic, strict=False)
    # An open file: the compiler wants a name ending in .pt2, which the staged one does not.
    with staged(destination) as staging, open(staging, "wb") as package:
        torch._inductor.aoti_compile_and_package(program, package_path=package, inductor_configs=INDUCTOR_SETTINGS)


class CompiledPackages:
    """A model's two loaded packages (one token; 2 to VERIFY_TOKENS), run on a KVCache with
    the model's own weights.

    They are opened with PyTorch's C++ loader itself: `torch._inductor.aoti_load_package`
    would first import the compiler's Python modules, over a second, for nothing a
    package needs to run. The inputs go in flat, as export flattened them.
    """

    def __init__(self, path: Path, transformer: nn.Module) -> None:
        self.single = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        self.multiple = torch._C._aoti.AOTIModelPackageLoader(str(verify_path(path)), "model", False, 1, -1)
        self.embeddings = transformer.tok_embeddings
        self.weights = list(traced_weights(transformer).values())

    def __call__(self, cache, ids: Sequence[int]) -> torch.Tensor:
        """Feed ids (1 to VERIFY_TOKENS, after at least one held position) to cache; the
        float32 logits after each [len(ids), vocab]."""
        tokens = torch.tensor([list(ids)], dtype=torch.long)
        inputs = [self.embeddings(tokens), *cache.call_inputs(len(ids)), *self.weights]
        logits, new_keys, new_values = (self.single if len(ids) == 1 else self.multiple).boxed_run(inputs)
        cache.write(ids, new_keys, new_values)
        return logits


def structure_copy(transformer: nn.Module) -> nn.Module:
    """The model with every tensor on the meta device: its code and shapes, none of its data."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in traced_weights(transformer).values():
        meta = tensor.to("meta")
        memo[id(tensor)] = nn.Parameter(meta, requires_grad=False) if isinstance(tensor, nn.Parameter) else meta
    return copy.deepcopy(transformer, memo)


class BackgroundBuild:
    """Builds a model's packages in a child process without holding up the chat, then loads
    them. `packages` is the CompiledPackages once ready, `error` one line if it failed,
    `seconds` how long it all took."""

    def __init__(self, transformer: nn.Module, cache_dtype: torch.dtype, destination: Path) -> None:
        self.transformer = transformer
        self.destination = destination
        self.packages: CompiledPackages | None = None
        self.error = ""
        self.seconds = 0.0
        self.process: subprocess.Popen | None = None
        self._started = time.perf_counter()
        self.thread = threading.Thread(target=self._finish, args=(cache_dtype,), name="compile", daemon=True)
        self.thread.start()

    def _finish(self, cache_dtype: torch.dtype) -> None:
        try:
            self._build(cache_dtype)
            if not self.error:
                self.packages, damage = load_packages(self.destination, self.transformer)
                if damage:
                    self.error = f"the compiled step just built did not load ({damage[:160]}); removed"
        except Exception as error:  # noqa: BLE001 (any failure falls back to eager calls)
            remove(package_files(self.destination))
            self.error = f"building the compiled step failed ({first_line(error)[:160]})"
        finally:
            self.seconds = time.perf_counter() - self._started

    def _build(self, cache_dtype: torch.dtype) -> None:
        with tempfile.TemporaryDirectory(prefix="llama-chat-compile-") as workdir:
            structure = Path(workdir) / "structure.pt"
            torch.save(structure_copy(self.transformer), structure)
            dtype_name = str(cache_dtype).removeprefix("torch.")
            command = [sys.executable, "-m", "llama_chat.engine.compiled", str(structure), dtype_name,
                       str(self.destination), str(os.getpid())]
            # One thread and one compiler: the chat keeps the other cores while this compiles.
            environment = child_environment(OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
            with open(Path(workdir) / "log.txt", "w+b") as log:
                # A session of its own: Ctrl-C is the chat's; the compilers it starts end with it.
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
                )
                code = self.process.wait()
                if code != 0:
                    log.seek(0)
                    lines = log.read().decode(errors="replace").strip().splitlines()
                    self.error = f"compiling the decode step failed ({lines[-1][:200] if lines else f'exit {code}'})"

    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self) -> None:
        self.thread.join()

    def cancel(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()


def main(argv: list[str]) -> int:
    structure_file, cache_dtype, destination, parent = argv
    end_with_parent(int(parent))  # a chat that ends takes its compile with it
    os.nice(19)  # it yields the machine to the chat
    torch.set_num_threads(1)
    structure = torch.load(structure_file, weights_only=False)  # our own copy, written just now
    build_packages(structure, getattr(torch, cache_dtype), Path(destination))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
