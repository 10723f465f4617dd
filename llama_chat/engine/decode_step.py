"""The decode step: one token in, its logits out, its keys and values written to the cache.

This is the single unit a generated token passes through: what is profiled, compiled
and benchmarked. It runs `Transformer.decode` eagerly until a compiled step is there
(loaded from disk, or built in the background while the chat goes on), then that.
"""

from __future__ import annotations

import torch

from llama_chat.engine import compiled_step
from llama_chat.engine.cache import KVCache
from llama_chat.engine.model import Transformer
from llama_chat.errors import first_line


class DecodeStep:
    """Runs a model's decode step on a cache; `compiled` once a compiled one is in use."""

    def __init__(self, transformer: Transformer, cache_dtype: torch.dtype) -> None:
        self.transformer = transformer
        self.cache_dtype = cache_dtype
        self.compiled: compiled_step.CompiledStep | None = None
        self.pending: compiled_step.BackgroundCompile | None = None  # being built
        self.note = "eager"  # what runs, for people: eager, compiling, compiled, or why not

    def __call__(self, cache: KVCache, token: int) -> torch.Tensor:
        """Feed `token` at the cache's next position; return the float32 logits after it."""
        if self.pending is not None:
            self._take_pending()
        tokens = torch.tensor([[token]], device=cache.keys.device)
        inputs = (tokens, cache.past_bias(), cache.keys, cache.values)
        # The compiled step was traced with at least one cached position.
        step = self.compiled if self.compiled is not None and len(cache) else self.transformer.decode
        logits, keys, values = step(*inputs)
        cache.append(token, keys, values)
        return logits

    def compile(self, *, wait: bool = False, background: bool = True) -> str:
        """Use the compiled step: load it if it is on disk (a few milliseconds), else build it
        in the background (or, with background false, not at all). Returns a line saying
        what happens."""
        if self.compiled is not None or self.pending is not None:
            return self.note
        device = next(self.transformer.parameters()).device
        if device.type != "cpu":
            self.note = f"eager (a compiled step is built for the cpu only, not {device.type})"
            return self.note
        if not compiled_step.available():
            self.note = "eager (this PyTorch cannot run a step compiled ahead of time)"
            return self.note
        path = compiled_step.package_path(self.transformer, self.cache_dtype)
        if path is None:
            self.note = "eager (compiled steps are kept in the cache, which is off)"
            return self.note
        if path.exists():
            try:
                self.compiled = compiled_step.CompiledStep(path, self.transformer)
                self.note = "compiled"
            except Exception as error:  # noqa: BLE001 (any failure falls back to the eager step)
                reason = first_line(error)[:200]
                self.note = f"eager (the compiled decode step did not load: {reason}; delete {path})"
            return self.note
        if not background:
            return self.note
        self.pending = compiled_step.BackgroundCompile(self.transformer, self.cache_dtype, path)
        self.note = "compiling in the background (once for this model and CPU; eager meanwhile)"
        if wait:
            self.pending.wait()
            self._take_pending()
        return self.note

    def describe(self) -> str:
        """What runs now: "compiled", "eager", "compiling ..." or why not."""
        if self.pending is not None:
            self._take_pending()
        return self.note

    def _take_pending(self) -> None:
        pending = self.pending
        if not pending.done():
            return
        self.pending = None
        if pending.step is None:
            self.note = f"eager ({pending.error})"
            return
        self.compiled = pending.step
        self.note = f"compiled (built in {pending.seconds:.0f} s)"

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
