"""Tensor parallelism: one model split over the ranks of a torch.distributed group.

Each rank owns whole key/value-head groups with their query heads (its rows of wqkv, its
columns of wo) and a slice of the SwiGLU width (its rows of the gate and up matrices,
its columns of w2). A block's attention and feed-forward outputs are then partial sums,
added up by one all-reduce each. The embedding, the output head and the norms are
replicated: every rank computes the same logits, so nothing is gathered, and only rank 0
samples from them.

Slicing happens on StoredMatrix objects before anything is read, so a rank reads and
packs only its own rows and columns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from llama_chat.checkpoints.stored import (
    GROUP,
    ColumnRange,
    RowRange,
    StackedRows,
    StoredMatrix,
)
from llama_chat.engine.config import ModelArgs
from llama_chat.errors import LlamaChatError, first_line


class RankLost(Exception):
    """A collective failed: another rank died, hung past the timeout, or closed the group.
    Not a LlamaChatError: the chat cannot go on without every rank."""


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int


def check_divisible(args: ModelArgs, world: int) -> None:
    """One clear line naming what does not split over `world` ranks."""
    if args.n_kv_heads % world:
        raise LlamaChatError(
            f"--tp {world}: the model's {args.n_kv_heads} key/value heads do not divide among {world} ranks "
            "(each rank takes whole key/value-head groups)"
        )
    if args.hidden_dim % (world * GROUP):
        raise LlamaChatError(
            f"--tp {world}: the feed-forward width {args.hidden_dim} does not split into {world} slices of whole "
            f"{GROUP}-weight groups"
        )


def local_args(args: ModelArgs, world: int) -> ModelArgs:
    """The dimensions one rank's share of the model has."""
    check_divisible(args, world)
    return dataclasses.replace(
        args, n_heads=args.n_heads // world, n_kv_heads=args.n_kv_heads // world,
        hidden_dim=args.hidden_dim // world, head_dim=args.head_dim,
    )


# What is split between ranks (matrices, and the q, k and v biases with their rows); everything else
# (embedding, head, norms) is replicated.
SPLIT_BETWEEN_RANKS = ("attention.wqkv", "attention.wo", "feed_forward.w13", "feed_forward.w2", "attention.qkv_bias")


def is_sharded(name: str) -> bool:
    """Whether a model tensor (a weight, or a buffer of a module packed from one) belongs to
    something split between ranks."""
    return any(f".{split}." in f".{name}." for split in SPLIT_BETWEEN_RANKS)


def shard_state(state: dict, args: ModelArgs, shard: Shard) -> dict:
    """The checkpoint's weights narrowed to one rank's rows and columns (nothing is read)."""
    world, rank = shard.world, shard.rank
    kv_heads, heads = args.n_kv_heads // world, args.n_heads // world
    q_rows, kv_rows, hidden = heads * args.head_dim, kv_heads * args.head_dim, args.hidden_dim // world
    narrowed = dict(state)
    for name, weight in state.items():
        if name.endswith("attention.qkv_bias"):  # split with its heads, as wqkv's rows are
            q, k, v = weight.split([args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim,
                                    args.n_kv_heads * args.head_dim])
            narrowed[name] = torch.cat([q.narrow(0, rank * q_rows, q_rows), k.narrow(0, rank * kv_rows, kv_rows),
                                        v.narrow(0, rank * kv_rows, kv_rows)])
        if not isinstance(weight, StoredMatrix):
            continue
        if name.endswith("attention.wqkv.weight"):
            q, k, v = parts(weight, 3)
            narrowed[name] = StackedRows(
                [RowRange(q, rank * q_rows, q_rows), RowRange(k, rank * kv_rows, kv_rows),
                 RowRange(v, rank * kv_rows, kv_rows)]
            )
        elif name.endswith("attention.wo.weight"):
            narrowed[name] = ColumnRange(weight, rank * q_rows, q_rows)
        elif name.endswith("feed_forward.w13.weight"):
            gate, up = parts(weight, 2)
            narrowed[name] = StackedRows([RowRange(gate, rank * hidden, hidden), RowRange(up, rank * hidden, hidden)])
        elif name.endswith("feed_forward.w2.weight"):
            narrowed[name] = ColumnRange(weight, rank * hidden, hidden)
    return narrowed


def parts(weight: StoredMatrix, count: int) -> list[StoredMatrix]:
    """The matrices a fused one was stacked from (q, k, v or gate, up)."""
    if not isinstance(weight, StackedRows) or len(weight.parts) != count:
        raise LlamaChatError(f"a fused matrix of {count} parts was expected, found {type(weight).__name__}")
    return weight.parts


class AllReduced(nn.Module):
    """A row-parallel projection (wo, w2): this rank's partial product, summed over ranks."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return summed(self.inner(x))


def summed(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor summed over every rank, in place; a failed collective is RankLost."""
    try:
        dist.all_reduce(tensor)
    except (RuntimeError, ValueError) as error:
        raise RankLost(first_line(error)) from None
    return tensor


def add_all_reduces(transformer: nn.Module) -> None:
    for block in transformer.layers:
        block.attention.wo = AllReduced(block.attention.wo)
        block.feed_forward.w2 = AllReduced(block.feed_forward.w2)
