"""Rank 0's side of a tensor-parallel group's model calls, and the start-up every front end shares.

`GroupHook` is what the runner (engine/runners) calls around each of rank 0's calls once
its model joined the group: it posts the same call to the other ranks, holds Ctrl-C until
every rank has finished the call, and keeps the runner eager (a compiled call has no
all-reduce between ranks). `run_in_group` starts or joins the group and runs a front end
on rank 0 while the other ranks follow it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta


from llama_chat import environment
from llama_chat.engine.cache import KVCache
from llama_chat.engine.runners import ExecutionMode, RunnerStatus
from llama_chat.parallel.ranks import Peers, follow, join, lead, shard_from_environment
from llama_chat.parallel.sharding import Shard
from llama_chat.parent_watch import end_with_parent

@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C until a call is done on every rank: stopping rank 0 between two
    all-reduces would leave the others waiting on the second."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda *_: received.append(1))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


class GroupHook:
    """Rank 0's calls made by the other ranks of the group too (the runner's `group`)."""

    status = RunnerStatus(ExecutionMode.EAGER, "a compiled step cannot all-reduce between ranks")

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    @contextmanager
    def call(self, cache: KVCache, ids: Sequence[int], chunk_size: int) -> Iterator[None]:
        with uninterrupted():
            self.peers.feed(cache, ids, chunk_size)
            yield

    @contextmanager
    def logits(self, ids: Sequence[int]) -> Iterator[None]:
        with uninterrupted():
            self.peers.logits(ids)
            yield


class ParallelLoader:
    """Rank 0's loader in a group: every rank loads its shard, or none does."""

    def __init__(self, load_shard: Callable[[str], object], peers: Peers) -> None:
        self.load_shard = load_shard
        self.peers = peers

    def __call__(self, path: str):
        model = self.peers.load(self.load_shard, path)
        model.runner.group = GroupHook(self.peers)
        return model


def run_in_group(
    tp: int, argv: Sequence[str], shard_loader: Callable[[Shard | None], Callable[[str], object]],
    front_end: Callable[[Callable[[str], object]], int], timeout: timedelta,
) -> int:
    """Run `front_end(loader)` on this process, alone or as rank 0 of a group (one formed by
    a launcher, or `tp` ranks started here running `argv`); a process that is another rank
    of a group follows rank 0 instead. `shard_loader(shard)` loads a rank's share; a
    collective not done within `timeout` ends the run."""
    shard = shard_from_environment()
    if shard is not None and shard.rank > 0:  # another rank of a group: rank 0 drives it
        end_with_parent(environment.leader())  # one this host's rank 0 started ends with it
        return follow(join(shard, timeout), shard_loader(shard))
    shard, peers = lead(shard, tp, argv, timeout)
    try:
        loader = shard_loader(shard)
        return front_end(ParallelLoader(loader, peers) if peers is not None else loader)
    finally:
        if peers is not None:
            peers.close()
