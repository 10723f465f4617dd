"""What tests load models and look at their weights with: a script's load options, and a
BlockLinear's blocks back in the file's order."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from llama_chat.environment import kernel_options
from llama_chat.kernels.block_linear import BlockLinear, untile_rows
from llama_chat.options import LoadOptions


def options_from_environment(environ: Mapping[str, str] = os.environ) -> LoadOptions:
    """The load options of a program that has no model flags: every flag's default, and the
    environment's kernel settings (the LLAMA_CHAT_* variables a test sets)."""
    return LoadOptions(kernels=kernel_options(environ))


def file_blocks(layer: BlockLinear) -> torch.Tensor:
    """The layer's blocks in the file's order, [out_features, bytes a row]."""
    return untile_rows(layer.blocks, layer.block_type, layer.out_features)
