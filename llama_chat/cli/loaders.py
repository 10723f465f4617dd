"""The loader the front ends hand to a session: it sets each model's runner compiling as
--compile says."""

from __future__ import annotations

from collections.abc import Callable

from llama_chat.llama import Llama


class CompilingLoader:
    """Loads models and sets each one's runner compiling as --compile says; `stop()`
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
                earlier.runner.cancel()
            self.loaded.append(model)
            model.runner.compile(wait=self.mode == "wait", background=self.background or self.mode == "wait")
        return model

    def stop(self) -> None:
        for model in self.loaded:
            model.runner.cancel()
