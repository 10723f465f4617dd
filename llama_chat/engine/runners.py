"""The runner: how a model runs on a KV cache.

`runner(cache, ids, every_logits=False)` feeds ids at the cache's next positions and
returns the float32 logits after the last one [vocab], or with every_logits after each of
them [len(ids), vocab] (a verify step). `logits(ids)` is a whole-sequence pass with no
cache. One call, in order:
1. the call is refused if it does not fit the cache; under tensor parallelism the group's
   hook (parallel/group_runner) posts it to the other ranks first;
2. on the cpu, the `ThreadGovernor` (engine/threads) says which thread count it runs with;
3. its ids go in chunks of at most PREFILL_CHUNK tokens, each through the package
   compiled ahead of time (engine/compiled) where one fits, else the model's eager forward;
4. its time is recorded when it is short: what the draft planner (engine/speculation) weighs.
`compile()` opens the compiled packages, or builds them in the background while the chat
runs eagerly; `status` says what runs, as data.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from llama_chat.engine import compiled
from llama_chat.engine.cache import KVCache
from llama_chat.engine.model import Transformer
from llama_chat.engine.threads import ThreadGovernor
from llama_chat.process_memory import return_freed_memory

PREFILL_CHUNK = 256  # tokens per model call at most: bounds a prompt's temporaries (256 read prompts as fast
# as 512 on the default model and a 1.2 B Q4_0 file, at 50 and 100 MB less memory)


class ExecutionMode(enum.Enum):
    EAGER = "eager"
    COMPILING = "compiling"
    COMPILED = "compiled"


@dataclass(frozen=True)
class RunnerStatus:
    """What runs a model's short calls, and why (for people; "" when nothing needs saying)."""

    mode: ExecutionMode
    detail: str = ""

    def describe(self) -> str:
        """The words for people: "compiled", "eager (why)", "compiling (...)"."""
        return f"{self.mode.value} ({self.detail})" if self.detail else self.mode.value


class CallHook(Protocol):
    """What a tensor-parallel group adds around rank 0's calls (parallel/group_runner's
    GroupHook)."""

    status: RunnerStatus  # eager, and why

    def call(self, cache: KVCache, ids: Sequence[int], chunk_size: int) -> AbstractContextManager[None]:
        """Around a call: the other ranks told to make it too."""

    def logits(self, ids: Sequence[int]) -> AbstractContextManager[None]:
        """Around a whole-sequence pass: the other ranks told to make it too."""


class Runner:
    """How a model runs on a cache: eager or compiled chosen a call at a time, timed, with
    the threads `governor` chooses (None: PyTorch's as they are), and the `group`'s hook
    around each call under tensor parallelism."""

    def __init__(self, transformer: Transformer, cache_dtype: torch.dtype,
                 governor: ThreadGovernor | None = None) -> None:
        self.transformer = transformer
        self.cache_dtype = cache_dtype
        self.governor = governor
        self.group: CallHook | None = None  # set when the model joins a tensor-parallel group
        self.packages: compiled.CompiledPackages | None = None
        self.pending: compiled.BackgroundBuild | None = None
        self._status = RunnerStatus(ExecutionMode.EAGER)
        self._times: dict[int, deque[float]] = {}  # tokens in a short call -> its recent times

    def __call__(
        self, cache: KVCache, ids: Sequence[int], *, every_logits: bool = False, chunk_size: int = PREFILL_CHUNK
    ) -> torch.Tensor:
        """Feed ids at the cache's next positions: the logits after the last [vocab], or with
        every_logits after each of them [len(ids), vocab]."""
        if not ids:
            raise ValueError("a model call needs at least one token")
        cache.check_fits(len(ids))  # before posting: a refused call must be refused on every rank
        if self.pending is not None:
            self._take_pending()
        with nullcontext() if self.group is None else self.group.call(cache, ids, chunk_size):
            started = time.perf_counter()
            if self.governor is None or len(ids) <= compiled.VERIFY_TOKENS or every_logits:
                logits = self._step(cache, ids, every_logits, chunk_size)
            else:  # a prompt: the governor paces its chunks
                logits = self._chunks(cache, ids, every_logits, chunk_size, self.governor.prompt_threads())
            if len(ids) <= compiled.VERIFY_TOKENS:
                self._times.setdefault(len(ids), deque(maxlen=8)).append(time.perf_counter() - started)
        return logits

    @torch.inference_mode()
    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(ids), vocab] from one whole-sequence pass, no cache involved."""
        with nullcontext() if self.group is None else self.group.logits(ids):
            tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.transformer.rope_cos.device)
            return self.transformer(tokens)[0]

    @property
    def seconds(self) -> dict[int, float]:
        """What a call of n tokens costs, by n (short calls that ran at least twice): the least
        of its recent times, as a busy machine only ever adds to them. A size's first run
        alone may include one-off costs (a kernel's first call), so it is not trusted."""
        return {rows: min(times) for rows, times in self._times.items() if len(times) > 1}

    def _step(self, cache: KVCache, ids: Sequence[int], every_logits: bool, chunk_size: int) -> torch.Tensor:
        """A call on one thread count, which the governor learns from (a decode or verify step)."""
        if self.governor is None:
            return self._chunks(cache, ids, every_logits, chunk_size)
        threads = self.governor.step_threads(len(ids))
        started = self.governor.use(threads)
        logits = self._chunks(cache, ids, every_logits, chunk_size)
        self.governor.step_took(threads, len(ids), started)
        return logits

    @torch.inference_mode()
    def _chunks(self, cache: KVCache, ids: Sequence[int], every_logits: bool, chunk_size: int,
                threads: int = 0) -> torch.Tensor:
        """ids in chunks of at most chunk_size tokens (in one where a compiled package takes
        them all); with `threads`, a prompt whose chunks the governor paces: each on the count
        the chunk before left, as it found the machine."""
        if self._compiled_fits(cache, len(ids)):
            chunk_size = len(ids)
        outputs = []
        for start in range(0, len(ids), chunk_size):
            chunk = ids[start : start + chunk_size]
            began = self.governor.use(threads) if threads else 0.0
            # Only the last chunk's last logits are wanted, unless every token's are.
            wanted = every_logits or start + chunk_size >= len(ids)
            logits = self._forward(cache, chunk, every_logits, wanted)
            if wanted:
                outputs.append(logits)
            if threads and len(chunk) == chunk_size:
                threads = self.governor.chunk_took(threads, chunk_size, began)
        return torch.cat(outputs) if every_logits else outputs[-1][-1]

    def _forward(self, cache: KVCache, chunk: Sequence[int], every_logits: bool, head: bool) -> torch.Tensor | None:
        """One model call: logits [rows, vocab] (every token's from a package or with
        every_logits, else the last's), None without the head."""
        if self._compiled_fits(cache, len(chunk)):
            return self.packages(cache, chunk)
        tokens = torch.tensor([list(chunk)], dtype=torch.long, device=self.transformer.rope_cos.device)
        logits = self.transformer(tokens, cache, last_only=not every_logits, head=head)
        if len(chunk) > compiled.VERIFY_TOKENS:  # a prompt chunk: its temporaries (tens of MB) are not kept
            return_freed_memory()
        return None if logits is None else logits[0]

    def _compiled_fits(self, cache: KVCache, tokens: int) -> bool:
        """Whether the packages take a call of `tokens` now (after a held position)."""
        return self.packages is not None and len(cache) > 0 and 0 < tokens <= compiled.VERIFY_TOKENS

    @property
    def status(self) -> RunnerStatus:
        """What runs the model's short calls, and why."""
        if self.group is not None:
            return self.group.status
        if self.pending is not None:
            self._take_pending()
        return self._status

    def compile(self, *, wait: bool = False, background: bool = True) -> RunnerStatus:
        """Use the compiled packages: load them if they are on disk (a few milliseconds), else
        build them in the background (or, with background false, not at all)."""
        if self.group is not None or self.packages is not None or self.pending is not None:
            return self.status
        why_not = self._unavailable()
        if why_not:
            self._status = RunnerStatus(ExecutionMode.EAGER, why_not)
            return self._status
        path = compiled.package_path(self.transformer, self.cache_dtype)
        damaged = ""
        if compiled.is_built(path):
            self.packages, damage = compiled.load_packages(path, self.transformer)
            if self.packages is not None:
                self._status = RunnerStatus(ExecutionMode.COMPILED)
                return self._status
            damaged = f"the compiled step on disk did not load ({damage[:160]}), so it was removed; "
        if not background:
            if damaged:
                self._status = RunnerStatus(ExecutionMode.EAGER, f"{damaged}the next chat builds it")
            return self._status
        self.pending = compiled.BackgroundBuild(self.transformer, self.cache_dtype, path)
        self._status = RunnerStatus(ExecutionMode.COMPILING, f"{damaged}in the background, once for this model "
                                                             "and CPU; eager meanwhile")
        if wait:
            self.pending.wait()
            self._take_pending()
        return self._status

    def _unavailable(self) -> str:
        """Why nothing can be compiled here ("" when it can)."""
        device = self.transformer.rope_cos.device
        if device.type != "cpu":
            return f"a compiled step is built for the cpu only, not {device.type}"
        if not compiled.available():
            return "this PyTorch cannot run a step compiled ahead of time"
        if compiled.package_path(self.transformer, self.cache_dtype) is None:
            return "compiled steps are kept in the cache, which is off"
        return ""

    def _take_pending(self) -> None:
        pending = self.pending
        if not pending.done():
            return
        self.pending = None
        if pending.packages is None:
            self._status = RunnerStatus(ExecutionMode.EAGER, pending.error)
            return
        self.packages = pending.packages
        self._status = RunnerStatus(ExecutionMode.COMPILED, f"built in {pending.seconds:.0f} s")

    def cancel(self) -> None:
        """Stop a build of the compiled packages going on in the background."""
        if self.pending is not None:
            self.pending.cancel()

    def compiling(self) -> int:
        """1 while a compile of this runner's runs in the background, else 0."""
        return int(self.pending is not None and not self.pending.done())


def model_runner(
    transformer: Transformer, cache_dtype: torch.dtype, background: Callable[[], int] = lambda: 0
) -> Runner:
    """How a model on its own runs: on the cpu with the threads measured fastest, a core
    left to each child at work (`background`, and the runner's own compile)."""
    runner = Runner(transformer, cache_dtype)
    if transformer.rope_cos.device.type == "cpu":
        runner.governor = ThreadGovernor(background=lambda: background() + runner.compiling())
    return runner
