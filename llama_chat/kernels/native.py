"""llama-chat's own CPU kernels (csrc/) loaded into this process, and what the library
reports: its variants and which of them this CPU runs.

The library registers `llama_chat::block_linear`, `llama_chat::cache_attention` and
`llama_chat::arrange_blocks`. It is built by native_build.py and kept where native_files.py
says; loading starts nothing. A child process (the decode step's compiler) loads the very
file its parent loaded, handed down in its environment.

Variants: portable C++, AVX2 (with FMA), AVX-512 with VNNI and AVX-512 with AMX tiles;
LLAMA_CHAT_KERNEL_VARIANT (KernelOptions.variant) forces one.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from llama_chat import environment
from llama_chat.kernels.library_layout import library_layout
from llama_chat.kernels.native_files import build_directory, library_file


def output_line(text: str) -> str:
    """The line of a compiler's or loader's output worth showing: the first error, else the first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[0][:200]


def loaded() -> bool:
    """Whether the kernels' operators are registered in this process."""
    try:
        torch.ops.llama_chat.block_linear
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.cache
def _load_library(path: str) -> None:
    environment.hand_down(environment.LOADED_LIBRARY, path)  # a child loads this same file
    if loaded():  # an equal build loaded from another folder (a second registration aborts)
        return
    torch.ops.load_library(path)
    # Shapes for tracing (the compiled decode step calls the operator too), from the
    # arguments they depend on; the rest are the schema's (ops.cpp, attention_ops.cpp).
    torch.library.register_fake("llama_chat::block_linear")(
        lambda x, weight, block_type, out_features, *_: x.new_empty((*x.shape[:-1], out_features))
    )
    torch.library.register_fake("llama_chat::cache_attention")(lambda q, *_: q.new_empty(q.shape))


@functools.cache
def _load_errors() -> dict[Path, str]:
    """Why each library this process failed to load did not load (one per process)."""
    return {}


def load_kept(library: Path) -> str:
    """Load `library`; "" once it is loaded, else why not in one line (remembered for load_error)."""
    try:
        _load_library(str(library))
    except (OSError, RuntimeError) as error:
        _load_errors()[library] = f"cannot load {library.name}: {output_line(str(error))}"
        return _load_errors()[library]
    return ""


def load_error(library: Path) -> str | None:
    """Why `library` did not load when this process tried, or None (loaded, or not tried)."""
    return _load_errors().get(library)


def load_built() -> bool:
    """Load a build already on disk (nothing is built): the parent's library in a child
    process, else this build's; whether the kernels are loaded."""
    inherited = environment.inherited_library()
    if inherited and Path(inherited).exists():
        _load_library(inherited)
        return True
    directory = build_directory()
    if directory is None or not library_file(directory).exists():
        return False
    _load_library(str(library_file(directory)))
    return True


def variant_names() -> tuple[str, ...]:
    """Every variant of the loaded library, in its numbering."""
    return library_layout().variants


def runnable_variants() -> list[str]:
    bits = torch.ops.llama_chat.supported_variants()
    return [name for number, name in enumerate(variant_names()) if bits >> number & 1]


def variant_number(name: str) -> int:
    return variant_names().index(name)
