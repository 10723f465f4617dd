"""Choosing the device and dtype a model runs on."""

from __future__ import annotations

import platform

import torch

from llama_chat.errors import DeviceError
from llama_chat.options import DTYPES, named_dtype


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def resolve_device(name: str | None = None) -> torch.device:
    """`auto` (or None) picks cuda, then mps, then cpu; a named device must exist."""
    name = (name or "auto").lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("device cuda was asked for, but this machine has no usable CUDA GPU: use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"device {name} was asked for, but there are {torch.cuda.device_count()} CUDA devices"
            )
    elif device.type == "mps":
        if not mps_available():
            raise DeviceError("device mps was asked for, but Apple's MPS backend is not available here: use --device cpu")
    elif device.type != "cpu":
        raise DeviceError(f"unsupported device {name!r}: use auto, cpu, cuda or mps")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """`auto` (or None): float32 on cpu, bfloat16 on cuda where supported, else float16."""
    refusal = f"unknown dtype {(name or '').lower()!r}: use auto, float32, bfloat16 or float16"
    named = named_dtype(name, DTYPES, refusal)
    if named is not None:
        return named
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def cpu_model_name() -> str:
    """The CPU's model name, as measurements and packages made on it are keyed by it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def flush_denormals() -> None:
    """Have the CPU treat subnormal floats as zero, for the whole process.

    Real weights drive exp() inside silu and softmax into subnormal floats, which the CPU
    handles several times slower; flushing them changes no logit that matters. Being a
    setting of the process, it is made by the program that owns the process (the command
    line, a benchmark), not by a model.
    """
    torch.set_flush_denormal(True)
