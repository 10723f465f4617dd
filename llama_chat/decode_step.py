"""The decode step: one token in, its logits out, its keys and values written to the cache.

This is the single unit a generated token passes through: what is profiled, compiled
and benchmarked. It runs `Transformer.decode` eagerly until a compiled step is there
(loaded from disk, or built in the background while the chat goes on), then that.
"""

from __future__ import annotations

import threading

import torch

from . import compiled_step
from .cache import KVCache
from .model import Transformer


class DecodeStep:
    """Runs a model's decode step on a cache; `compiled` once a compiled one is in use."""

    def __init__(self, transformer: Transformer, cache_dtype: torch.dtype) -> None:
        self.transformer = transformer
        self.cache_dtype = cache_dtype
        self.compiled: compiled_step.CompiledStep | None = None
        self.background: compiled_step.BackgroundCompile | None = None
        self.note = "eager"  # what runs, for people: eager, compiling, compiled, or why not
        self._loading: threading.Thread | None = None
        self._loaded: compiled_step.CompiledStep | None = None
        self._load_error = ""

    def __call__(self, cache: KVCache, token: int) -> torch.Tensor:
        """Feed `token` at the cache's next position; return the float32 logits after it."""
        self._take_finished_compile()
        tokens = torch.tensor([[token]], device=cache.keys.device)
        inputs = (tokens, cache.past_bias(), cache.keys, cache.values)
        # The compiled step was traced with at least one cached position.
        step = self.compiled if self.compiled is not None and len(cache) else self.transformer.decode
        logits, keys, values = step(*inputs)
        cache.append(token, keys, values)
        return logits

    def compile(self, *, wait: bool = False, background: bool = True) -> str:
        """Use the compiled step: load it if it is on disk, else build it in the background
        (or, with background false, not at all). Returns a line saying what happens."""
        if self.compiled is not None or self.background is not None or self._loading is not None:
            return self.note
        device = next(self.transformer.parameters()).device
        if device.type != "cpu" or not compiled_step.available():
            self.note = f"eager (a compiled step is built for the cpu only, not {device.type})" if (
                device.type != "cpu"
            ) else "eager (this PyTorch cannot compile ahead of time)"
            return self.note
        path = compiled_step.package_path(self.transformer, self.cache_dtype)
        if path is None:
            self.note = "eager (compiled steps are kept in the cache, which is off)"
            return self.note
        if path.exists():
            # Loading takes a second or two (PyTorch's compiler modules are imported), so a
            # chat loads it beside the first turn instead of before the prompt.
            self._loading = threading.Thread(target=self._load, args=(path,), daemon=True)
            self._loading.start()
            self.note = "loading the compiled step (eager meanwhile)"
            if wait or not background:
                self._loading.join()
                self._take_finished_compile()
            return self.note
        if not background:
            return self.note
        self.background = compiled_step.BackgroundCompile(self.transformer, self.cache_dtype, path)
        self.note = "compiling in the background (once for this model and CPU; eager meanwhile)"
        if wait:
            self.background.wait()
            self._take_finished_compile()
        return self.note

    def describe(self) -> str:
        """What runs now: "compiled", "eager", "compiling ..." or why not."""
        self._take_finished_compile()
        return self.note

    def _load(self, path) -> None:
        try:
            self._loaded = compiled_step.CompiledStep(path, self.transformer)
        except Exception as error:  # noqa: BLE001 (a bad package falls back to the eager step)
            self._load_error = f"eager (the compiled step on disk did not load: {error}; delete {path})"

    def _take_finished_compile(self) -> None:
        if self._loading is not None and not self._loading.is_alive():
            self._loading = None
            self.compiled, self.note = self._loaded, "compiled" if self._loaded is not None else self._load_error
        background = self.background
        if background is None or not background.done():
            return
        self.background = None
        if background.step is not None:
            self.compiled = background.step
            self.note = f"compiled (built in {background.seconds:.0f} s)"
        else:
            self.note = f"eager ({background.error})"

    def cancel(self) -> None:
        if self.background is not None:
            self.background.cancel()
