"""The settings a load, llama-chat's kernels and a chat's drafting take, made once where a
program starts and passed down, typed: no module below reads them from the environment or
checks their text.

`cli/options.py` builds them from the command line's flags, and `environment.py` from the
LLAMA_CHAT_* variables (each field below names its own). Every default means auto (chosen
or measured on this machine), so a library caller, `llama_chat.load(path)`, needs none.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llama_chat.errors import DeviceError, UsageError

# The dtypes a model may be asked for, by the names a user may give them.
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# Those the packed cpu path multiplies in.
PACKED_DTYPES = {name: dtype for name, dtype in DTYPES.items() if dtype in (torch.bfloat16, torch.float32)}


class KernelFamily(enum.Enum):
    """Whose kernels a packed model runs on."""

    AUTO = "auto"  # measured: llama-chat's where they are built and faster here
    OURS = "ours"
    ATEN = "aten"  # PyTorch's


def named_dtype(name: str | None, choices: dict[str, torch.dtype], refusal: str) -> torch.dtype | None:
    """The dtype `name` names among `choices`, any case; None for auto (or no name). Any
    other name is refused with the line `refusal`."""
    text = (name or "auto").lower()
    if text == "auto":
        return None
    if text not in choices:
        raise DeviceError(refusal)
    return choices[text]


def packed_dtype(name: str | None, source: str) -> torch.dtype | None:
    """The packed dtype `name` names (None: auto); a name of none is one line naming `source`."""
    return named_dtype(name, PACKED_DTYPES, f"{source}={name!r}: use auto, bfloat16 or float32")


@dataclass(frozen=True)
class KernelOptions:
    """How a model packed for the cpu multiplies: which kernels, in which dtypes."""

    family: KernelFamily = KernelFamily.AUTO  # LLAMA_CHAT_KERNELS
    variant: str | None = None  # LLAMA_CHAT_KERNEL_VARIANT: one of ours, forced (set, even empty, it forces)
    activation_bits: int = 16  # LLAMA_CHAT_ACTIVATION_BITS: several tokens' activations in ours, 16 or 8
    matmul_dtype: torch.dtype | None = None  # --dtype or LLAMA_CHAT_DTYPE: prompt steps' products on PyTorch's kernels
    kernel_dtype: torch.dtype | None = None  # --kernel-dtype or LLAMA_CHAT_KERNEL_DTYPE: what PyTorch's kernels take
    kernel_rows: int | None = None  # LLAMA_CHAT_KERNEL_ROWS: steps up to this many tokens on PyTorch's kernels
    packed_cache_gb: float | None = None  # LLAMA_CHAT_PACKED_CACHE_GB: the packed cache's bound (20 GB)


PROMPT_MATHS = ("exact", "fast")


@dataclass(frozen=True)
class LoadOptions:
    """What `llama_chat.load` makes of a checkpoint (see loading.load)."""

    device: str | None = None  # auto: cuda, mps, else cpu
    dtype: str | None = None  # the model's dtype (auto: the device's); on the cpu packed, the matmul dtype
    chat_format: str | None = None  # auto: the checkpoint's
    quantize: str = "auto"
    kv_dtype: str | None = None  # the KV cache's (auto: the loader's choice)
    kernels: KernelOptions = field(default_factory=KernelOptions)
    prompt_math: str = "exact"  # fast: prompt chunks with 8-bit activation blocks (Llama.set_prompt_math)

    def packed_kernels(self) -> KernelOptions:
        """The kernel settings of a packed model: a dtype named for the model is what its
        prompt steps multiply in (cpu_paths refuses one PyTorch's packed kernels do not run)."""
        refusal = f"unknown dtype {self.dtype!r}: use auto, float32, bfloat16 or float16"
        dtype = named_dtype(self.dtype, DTYPES, refusal)
        return self.kernels if dtype is None else dataclasses.replace(self.kernels, matmul_dtype=dtype)

    def replaced(self, **settings: object) -> LoadOptions:
        """These options with some fields changed, a kernel setting (kernel_dtype=...) among
        them; a library caller may name a kernel dtype as text."""
        kernel_fields = {f.name for f in dataclasses.fields(KernelOptions)}
        kernels = {name: value for name, value in settings.items() if name in kernel_fields}
        for name in ("matmul_dtype", "kernel_dtype"):
            if isinstance(kernels.get(name), str):
                kernels[name] = packed_dtype(kernels[name], name)
        rest = {name: value for name, value in settings.items() if name not in kernel_fields}
        return dataclasses.replace(self, kernels=dataclasses.replace(self.kernels, **kernels), **rest)


@dataclass(frozen=True)
class DataFolders:
    """Where llama-chat keeps things, where the user's standard folders are not wanted."""

    cache: Path | None = None  # LLAMA_CHAT_CACHE: measurements, builds, packed weights
    cache_off: bool = False  # LLAMA_CHAT_CACHE=off: nothing is kept
    weights: Path | None = None  # LLAMA_CHAT_WEIGHTS: the default model's folder
    kernels: Path | None = None  # LLAMA_CHAT_KERNELS_DIR: built kernels (default: kernels/ in the cache)


@dataclass(frozen=True)
class DraftLength:
    """How many tokens a drafter (prompt lookup, a draft model) proposes before a verify
    step: at most `most`, 0 for none, or None for auto (as many as measure faster here)."""

    most: int | None = None

    @classmethod
    def parse(cls, text: str, flag: str = "--lookup") -> DraftLength:
        """`flag`'s value: auto, or a whole number of tokens (0: off)."""
        if text == "auto":
            return cls()
        try:
            tokens = int(text)
        except ValueError:
            tokens = -1
        if tokens < 0:
            raise UsageError(f"{flag} takes auto or a number of tokens (0: off), not {text!r}")
        return cls(tokens)

    @property
    def automatic(self) -> bool:
        return self.most is None

    @property
    def off(self) -> bool:
        return self.most == 0

    def __str__(self) -> str:
        return "auto" if self.most is None else str(self.most)
