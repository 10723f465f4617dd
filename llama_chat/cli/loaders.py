"""Loaders the front ends hand to a session: one per rank group, and one that sets the
decode step compiling as --compile says."""

from __future__ import annotations

from collections.abc import Callable

from llama_chat.llama import Llama
from llama_chat.parallel.ranks import Peers


class ParallelLoader:
    """Rank 0's loader in a tensor-parallel group: every rank loads its shard, or none does."""

    def __init__(self, load_shard: Callable[[str], Llama], peers: Peers) -> None:
        self.load_shard = load_shard
        self.peers = peers

    def __call__(self, path: str) -> Llama:
        model = self.peers.load(self.load_shard, path)
        model.peers = self.peers
        return model


class CompilingLoader:
    """Loads models and sets each one's decode step compiling as --compile says; `stop()`
    ends compiles still running (at exit: the next run starts them again)."""

    def __init__(self, load_model: Callable[[str], Llama], mode: str, background: bool) -> None:
        self.load_model = load_model
        self.mode = mode
        self.background = background
        self.loaded: list[Llama] = []

    def __call__(self, path: str) -> Llama:
        model = self.load_model(path)
        if self.mode != "off":
            for earlier in self.loaded:
                earlier.decode_step.cancel()
            self.loaded.append(model)
            model.decode_step.compile(wait=self.mode == "wait", background=self.background or self.mode == "wait")
        return model

    def stop(self) -> None:
        for model in self.loaded:
            model.decode_step.cancel()
