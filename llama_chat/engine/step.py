"""The model step: the one way the engine runs the model on a KV cache.

A prompt chunk, a single generated token and a verify step (a token and the drafts after
it) all pass through `ModelStep`: it runs `Transformer.step` on the cache's buffers and
writes the new keys and values through `KVCache.write`. A single token runs eagerly until
a compiled step is there (loaded from disk, or built in the background while the chat
goes on), then that; what runs is chosen here, once, not by callers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch

from llama_chat.engine import compiled_step
from llama_chat.engine.cache import KVCache
from llama_chat.engine.model import Transformer
from llama_chat.errors import first_line
from llama_chat.process_memory import return_freed_memory

PREFILL_CHUNK = 256  # tokens per model call at most: bounds a prompt's temporaries (256 read prompts as fast
# as 512 on the default model and a 1.2 B Q4_0 file, at 50 and 100 MB less memory)


class ModelStep:
    """Runs a model on a cache; `compiled` once a compiled single-token step is in use."""

    peers = None  # the other ranks of a group: none for a model on its own (see ParallelStep)

    def __init__(self, transformer: Transformer, cache_dtype: torch.dtype) -> None:
        self.transformer = transformer
        self.cache_dtype = cache_dtype
        self.compiled: compiled_step.CompiledStep | None = None
        self.pending: compiled_step.BackgroundCompile | None = None  # being built
        self.note = "eager"  # what runs, for people: eager, compiling, compiled, or why not
        self._times: dict[int, deque[float]] = {}  # tokens in a step -> its recent times, for short steps

    @torch.inference_mode()
    def __call__(
        self, cache: KVCache, ids: Sequence[int], *, every_logits: bool = False, chunk_size: int = PREFILL_CHUNK
    ) -> torch.Tensor:
        """Feed ids at the cache's next positions; return the float32 logits after the last one
        [vocab], or with every_logits after each of them [len(ids), vocab] (a verify step)."""
        if not ids:
            raise ValueError("a model step needs at least one token")
        cache.check_room(len(ids))
        if self.pending is not None:
            self._take_pending()
        started = time.perf_counter()
        outputs = []
        for start in range(0, len(ids), chunk_size):
            chunk = list(ids[start : start + chunk_size])
            tokens = torch.tensor([chunk], dtype=torch.long, device=cache.keys.device)
            inputs = (self.transformer.tok_embeddings(tokens), cache.past_bias(), cache.keys, cache.values)
            # The compiled steps were traced for up to VERIFY_TOKENS tokens after at least one
            # cached position (they give logits for every token).
            if self.compiled is not None and len(cache) and len(chunk) <= compiled_step.VERIFY_TOKENS:
                logits, keys, values = self.compiled(*inputs)
            else:
                logits, keys, values = self.transformer.step(*inputs, last_only=not every_logits)
            cache.write(chunk, keys, values)
            outputs.append(logits)
        if len(ids) <= compiled_step.VERIFY_TOKENS:  # short steps are timed: what speculation weighs
            self._times.setdefault(len(ids), deque(maxlen=8)).append(time.perf_counter() - started)
        else:  # a prompt: its temporaries (tens of MB a chunk) are not kept for the next
            return_freed_memory()
        return torch.cat(outputs) if every_logits else outputs[-1][-1]

    @property
    def seconds(self) -> dict[int, float]:
        """What a step of n tokens costs, by n (short steps that ran at least twice): the least
        of its recent times, as a busy machine only ever adds to them. A size's first run
        alone may include one-off costs (a kernel's first call), so it is not trusted."""
        return {rows: min(times) for rows, times in self._times.items() if len(times) > 1}

    @torch.inference_mode()
    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(ids), vocab] from one whole-sequence pass, no cache involved."""
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=next(self.transformer.parameters()).device)
        return self.transformer(tokens)[0]

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
        damaged = ""
        if compiled_step.is_built(path):
            try:
                self.compiled = compiled_step.CompiledStep(path, self.transformer)
                self.note = "compiled"
                return self.note
            except Exception as error:  # noqa: BLE001 (a damaged package is removed and built again)
                damaged = f"the compiled step on disk did not load ({first_line(error)[:160]}), so it was removed; "
                compiled_step.remove(path)
        if not background:
            self.note = f"eager ({damaged}the next chat builds it)" if damaged else self.note
            return self.note
        self.pending = compiled_step.BackgroundCompile(self.transformer, self.cache_dtype, path)
        self.note = f"compiling in the background ({damaged or ''}once for this model and CPU; eager meanwhile)"
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
