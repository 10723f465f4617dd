"""The options a run of llama-chat uses, made once from its flags and the environment's
variables (environment.py reads those) and passed down; llama_chat/options.py says what
each one is."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping

from llama_chat import environment, paths
from llama_chat.options import DataFolders, LoadOptions


def configure_folders(environ: Mapping[str, str] = os.environ) -> DataFolders:
    """Keep things in the folders LLAMA_CHAT_CACHE, LLAMA_CHAT_WEIGHTS and
    LLAMA_CHAT_KERNELS_DIR name, from now on in this process; the folders used until now."""
    return paths.configure(environment.folders(environ))


def load_options(flags: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> LoadOptions:
    """The model's load options: its flags (cli/arguments.add_model_arguments, which checks
    them), and the kernel settings of the environment (--kernel-dtype, when given, over
    LLAMA_CHAT_KERNEL_DTYPE)."""
    kernels = environment.kernel_options(environ)
    if flags.kernel_dtype is not None:
        kernels = dataclasses.replace(kernels, kernel_dtype=flags.kernel_dtype)
    return LoadOptions(device=flags.device, dtype=flags.dtype, chat_format=flags.chat_format,
                       quantize=flags.quantize, kv_dtype=flags.kv_dtype, kernels=kernels, prompt_math=flags.prompt_math)


def draft_options(flags: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> LoadOptions:
    """A draft model's load options: on the command line's device, in the default weights
    mode (the fastest measured here), whatever --quantize and --dtype say of the model."""
    return LoadOptions(device=flags.device, chat_format="plain", kernels=environment.kernel_options(environ))
