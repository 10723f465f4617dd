"""The options a run of llama-chat uses, made once from its flags and environment variables
and passed down (llama_chat/options.py says what each one is)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta

from llama_chat import paths
from llama_chat.errors import LlamaChatError
from llama_chat.options import Folders, KernelOptions, LoadOptions


def configure_folders(environ: Mapping[str, str] = os.environ) -> Folders:
    """Keep things in the folders LLAMA_CHAT_CACHE, LLAMA_CHAT_WEIGHTS and
    LLAMA_CHAT_KERNELS_DIR name, from now on in this process; the folders used until now."""
    return paths.configure(Folders.from_environment(environ))


def group_timeout(environ: Mapping[str, str] = os.environ) -> timedelta:
    """How long a tensor-parallel group waits for a collective: LLAMA_CHAT_TP_TIMEOUT seconds (60)."""
    value = environ.get("LLAMA_CHAT_TP_TIMEOUT", "60")
    try:
        return timedelta(seconds=float(value))
    except ValueError:
        raise LlamaChatError(f"LLAMA_CHAT_TP_TIMEOUT={value!r} is not a number of seconds") from None


def kernel_options(environ: Mapping[str, str] = os.environ) -> KernelOptions:
    """The kernel settings the LLAMA_CHAT_* variables give (llama_chat/options.py names them)."""
    return KernelOptions.from_environment(environ)


def options_from_environment(environ: Mapping[str, str] = os.environ) -> LoadOptions:
    """The load options of a program that has no model flags (a script, a test): every
    flag's default, and the environment's kernel settings."""
    return LoadOptions(kernels=kernel_options(environ))


def load_options(flags: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> LoadOptions:
    """The model's load options: its flags (cli/arguments.add_model_arguments), and the
    kernel settings of the environment (--kernel-dtype, when given, over LLAMA_CHAT_KERNEL_DTYPE)."""
    kernels = kernel_options(environ)
    if flags.kernel_dtype != "auto" or kernels.kernel_dtype is None:
        kernels = dataclasses.replace(kernels, kernel_dtype=flags.kernel_dtype)
    return LoadOptions(device=flags.device, dtype=flags.dtype, chat_format=flags.chat_format,
                       quantize=flags.quantize, kv_dtype=flags.kv_dtype, kernels=kernels)


def draft_options(flags: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> LoadOptions:
    """A draft model's load options: on the command line's device, in the default weights
    mode (the fastest measured here), whatever --quantize and --dtype say of the model."""
    return LoadOptions(device=flags.device, chat_format="plain", kernels=kernel_options(environ))
