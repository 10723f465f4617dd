"""The settings a load and llama-chat's kernels take, made once where a program starts and
passed down; no module below reads them from the environment.

`cli/options.py` builds them from the command line's flags and the LLAMA_CHAT_* variables
(`from_environment` below names each variable beside its field). Every default means
auto (chosen or measured on this machine), so a library caller, `llama_chat.load(path)`,
needs none. Values are kept as given (strings); the module that uses one checks it and
names the variable or flag in its error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class KernelOptions:
    """How a model packed for the cpu multiplies: which kernels, in which dtypes."""

    family: str = "auto"  # LLAMA_CHAT_KERNELS: auto (measured), ours or aten
    variant: str | None = None  # LLAMA_CHAT_KERNEL_VARIANT: one of ours, forced (set, even empty, it forces)
    activation_bits: str = "16"  # LLAMA_CHAT_ACTIVATION_BITS: several tokens' activations in ours, 16 or 8
    matmul_dtype: str | None = None  # --dtype or LLAMA_CHAT_DTYPE: prompt steps' products on PyTorch's kernels
    kernel_dtype: str | None = None  # --kernel-dtype or LLAMA_CHAT_KERNEL_DTYPE: what PyTorch's kernels take
    kernel_rows: str | None = None  # LLAMA_CHAT_KERNEL_ROWS: steps up to this many tokens on PyTorch's kernels
    packed_cache_gb: str | None = None  # LLAMA_CHAT_PACKED_CACHE_GB: the packed cache's bound (20 GB)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> KernelOptions:
        return cls(
            family=environ.get("LLAMA_CHAT_KERNELS", "auto").lower(),
            variant=environ.get("LLAMA_CHAT_KERNEL_VARIANT"),
            activation_bits=environ.get("LLAMA_CHAT_ACTIVATION_BITS", "16"),
            matmul_dtype=environ.get("LLAMA_CHAT_DTYPE"),
            kernel_dtype=environ.get("LLAMA_CHAT_KERNEL_DTYPE"),
            kernel_rows=environ.get("LLAMA_CHAT_KERNEL_ROWS"),
            packed_cache_gb=environ.get("LLAMA_CHAT_PACKED_CACHE_GB"),
        )


@dataclass(frozen=True)
class LoadOptions:
    """What `llama_chat.load` makes of a checkpoint (see loading.load)."""

    device: str | None = None  # auto: cuda, mps, else cpu
    dtype: str | None = None  # the model's dtype (auto: the device's); on the cpu packed, the matmul dtype
    chat_format: str | None = None  # auto: the checkpoint's
    quantize: str = "auto"
    kv_dtype: str | None = None  # the KV cache's (auto: the loader's choice)
    kernels: KernelOptions = field(default_factory=KernelOptions)

    def packed_kernels(self) -> KernelOptions:
        """The kernel settings of a packed model: a dtype named for the model is what its
        prompt steps multiply in."""
        if self.dtype in (None, "auto"):
            return self.kernels
        return dataclasses.replace(self.kernels, matmul_dtype=self.dtype)

    def replaced(self, **settings: str | None) -> LoadOptions:
        """These options with some fields changed, a kernel setting (kernel_dtype=...) among them."""
        kernel_fields = {f.name for f in dataclasses.fields(KernelOptions)}
        kernels = {name: value for name, value in settings.items() if name in kernel_fields}
        rest = {name: value for name, value in settings.items() if name not in kernel_fields}
        return dataclasses.replace(self, kernels=dataclasses.replace(self.kernels, **kernels), **rest)


@dataclass(frozen=True)
class Folders:
    """Where llama-chat keeps things, where the user's standard folders are not wanted."""

    cache: Path | None = None  # LLAMA_CHAT_CACHE: measurements, builds, packed weights
    cache_off: bool = False  # LLAMA_CHAT_CACHE=off: nothing is kept
    weights: Path | None = None  # LLAMA_CHAT_WEIGHTS: the default model's folder
    kernels: Path | None = None  # LLAMA_CHAT_KERNELS_DIR: built kernels (default: kernels/ in the cache)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Folders:
        cache = environ.get("LLAMA_CHAT_CACHE") or None
        weights = environ.get("LLAMA_CHAT_WEIGHTS") or None
        kernels = environ.get("LLAMA_CHAT_KERNELS_DIR") or None
        return cls(
            cache=Path(cache) if cache not in (None, "off") else None,
            cache_off=cache == "off",
            weights=Path(weights) if weights else None,
            kernels=Path(kernels).expanduser() if kernels else None,
        )
