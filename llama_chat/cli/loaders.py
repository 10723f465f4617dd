"""The loaders the front ends hand to a session: each loads with the run's options, and
sets each model's runner compiling as --compile says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llama_chat.cli.load_progress import LoadProgress
from llama_chat.kernels import native_build
from llama_chat.llama import Llama
from llama_chat.loading import load
from llama_chat.options import LoadOptions
from llama_chat.parallel.sharding import Shard


@dataclass(frozen=True)
class OptionsLoader:
    """Loads a model from a path with these options, its progress shown (with a shard:
    that tensor-parallel rank's share of it)."""

    options: LoadOptions
    shard: Shard | None = None

    def __call__(self, path: str) -> Llama:
        return load(path, self.options, shard=self.shard, progress=LoadProgress)


class CompilingLoader:
    """Loads models and sets each one's runner compiling as --compile says; `stop()`
    ends compiles still running (at exit: the next run starts them again).

    While llama-chat's kernels build in the background, a model's step is not compiled in
    the background: the chat moves onto the kernels within a minute or two (see
    kernel_switch), and a step compiled for PyTorch's kernels would be thrown away. The
    build done, `compile_deferred` compiles what waited."""

    def __init__(self, load_model: Callable[[str], Llama], mode: str, background: bool) -> None:
        self.load_model = load_model
        self.mode = mode
        self.background = background
        self.loaded: list[Llama] = []
        self.deferred: list[Llama] = []

    def __call__(self, path: str) -> Llama:
        model = self.load_model(path)
        if self.mode != "off":
            for earlier in self.loaded:
                earlier.runner.cancel()
            self.deferred.clear()
            self.loaded.append(model)
            if self.mode == "auto" and self.background and native_build.build_running():
                self.deferred.append(model)
            else:
                model.runner.compile(wait=self.mode == "wait", background=self.background or self.mode == "wait")
        return model

    def compile_deferred(self) -> None:
        """Start the compiles that waited for the kernels' build to end."""
        for model in self.deferred:
            model.runner.compile(background=True)
        self.deferred.clear()

    def stop(self) -> None:
        for model in self.loaded:
            model.runner.cancel()
