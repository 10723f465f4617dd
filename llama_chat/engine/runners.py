"""Runners: how the model runs on a KV cache, as interchangeable wrappers around one call.

Every runner is a `Runner`, called alike, `runner(cache, ids, every_logits=False)`: it
feeds ids at the cache's next positions and returns the float32 logits after the last one
[vocab], or with every_logits after each of them [len(ids), vocab] (a verify step). Each
also has `logits(ids)` (a whole-sequence pass, no cache), `status` (what runs, as data),
`compile()` and `cancel()`.

- EagerRunner: the model's forward, a prompt in chunks of PREFILL_CHUNK tokens.
- CompiledRunner: the packages compiled ahead of time for short calls (engine/compiled),
  the eager runner for the rest, and their life cycle (loaded from disk, or built in the
  background while the chat goes on).
- TimedRunner: keeps the recent times of short calls, which the draft planner weighs.
- ThreadGovernor: runs each call with the thread count measured fastest of late (below).
- GroupRunner (parallel/group_runner): posts each call to a tensor-parallel group's other
  ranks first.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from llama_chat.engine import compiled
from llama_chat.engine.cache import KVCache
from llama_chat.engine.model import Transformer
from llama_chat.engine.threads import process_threads, run_with
from llama_chat.process_memory import return_freed_memory

PREFILL_CHUNK = 256  # tokens per model call at most: bounds a prompt's temporaries (256 read prompts as fast
# as 512 on the default model and a 1.2 B Q4_0 file, at 50 and 100 MB less memory)


class Mode(enum.Enum):
    EAGER = "eager"
    COMPILING = "compiling"
    COMPILED = "compiled"


@dataclass(frozen=True)
class RunnerStatus:
    """What runs a model's short calls, and why (for people; "" when nothing needs saying)."""

    mode: Mode
    detail: str = ""

    def describe(self) -> str:
        """The words for people: "compiled", "eager (why)", "compiling (...)"."""
        return f"{self.mode.value} ({self.detail})" if self.detail else self.mode.value


@runtime_checkable
class Runner(Protocol):
    """How a model runs: what every runner offers, and what wrappers pass through."""

    @property
    def status(self) -> RunnerStatus:
        """What runs the model's short calls, and why."""

    def __call__(self, cache: KVCache, ids: Sequence[int], *, every_logits: bool = False) -> torch.Tensor:
        """Feed ids at the cache's next positions: the logits after the last [vocab], or
        with every_logits after each of them [len(ids), vocab]."""

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(ids), vocab] from one whole-sequence pass, no cache involved."""

    def compile(self, **options) -> RunnerStatus:
        """Use compiled steps where the runner can; what runs now."""

    def cancel(self) -> None:
        """Stop work going on in the background (a compiled step's build)."""


class EagerRunner:
    """The model's forward on the cache, in Python."""

    status = RunnerStatus(Mode.EAGER)

    def __init__(self, transformer: Transformer) -> None:
        self.transformer = transformer

    @torch.inference_mode()
    def __call__(
        self, cache: KVCache, ids: Sequence[int], *, every_logits: bool = False, chunk_size: int = PREFILL_CHUNK
    ) -> torch.Tensor:
        if not ids:
            raise ValueError("a model call needs at least one token")
        cache.check_room(len(ids))
        device = self.transformer.rope_cos.device
        outputs = []
        for start in range(0, len(ids), chunk_size):
            tokens = torch.tensor([list(ids[start : start + chunk_size])], dtype=torch.long, device=device)
            # Only the last chunk's last logits are wanted, unless every token's are.
            wanted = every_logits or start + chunk_size >= len(ids)
            logits = self.transformer(tokens, cache, last_only=not every_logits, head=wanted)
            if wanted:
                outputs.append(logits[0])
        if len(ids) > compiled.VERIFY_TOKENS:  # a prompt: its temporaries (tens of MB a chunk) are not kept
            return_freed_memory()
        return torch.cat(outputs) if every_logits else outputs[-1][-1]

    @torch.inference_mode()
    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(ids), vocab] from one whole-sequence pass, no cache involved."""
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.transformer.rope_cos.device)
        return self.transformer(tokens)[0]

    def compile(self, **_) -> RunnerStatus:
        return self.status

    def cancel(self) -> None:
        pass


class Wrapper:
    """A runner around another: passes everything through that it does not change."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner

    def __call__(self, cache: KVCache, ids: Sequence[int], **options) -> torch.Tensor:
        return self.inner(cache, ids, **options)

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        return self.inner.logits(ids)

    @property
    def status(self) -> RunnerStatus:
        return self.inner.status

    @property
    def seconds(self) -> dict[int, float]:
        return self.inner.seconds

    def compile(self, **options) -> RunnerStatus:
        return self.inner.compile(**options)

    def cancel(self) -> None:
        self.inner.cancel()


class CompiledRunner(Wrapper):
    """Short calls (up to VERIFY_TOKENS tokens after a held position) through the compiled
    packages once they are there; everything else, and everything until then, eagerly."""

    def __init__(self, inner: EagerRunner, cache_dtype: torch.dtype) -> None:
        super().__init__(inner)
        self.transformer = inner.transformer
        self.cache_dtype = cache_dtype
        self.packages: compiled.CompiledPackages | None = None
        self.pending: compiled.BackgroundBuild | None = None
        self._status = RunnerStatus(Mode.EAGER)

    def __call__(self, cache: KVCache, ids: Sequence[int], *, every_logits: bool = False, **options) -> torch.Tensor:
        if self.pending is not None:
            self._take_pending()
        if self.packages is None or not len(cache) or not 0 < len(ids) <= compiled.VERIFY_TOKENS:
            return self.inner(cache, ids, every_logits=every_logits, **options)
        cache.check_room(len(ids))
        with torch.inference_mode():
            logits = self.packages(cache, ids)
        return logits if every_logits else logits[-1]

    @property
    def status(self) -> RunnerStatus:
        if self.pending is not None:
            self._take_pending()
        return self._status

    def compile(self, *, wait: bool = False, background: bool = True) -> RunnerStatus:
        """Use the compiled packages: load them if they are on disk (a few milliseconds), else
        build them in the background (or, with background false, not at all)."""
        if self.packages is not None or self.pending is not None:
            return self.status
        why_not = self._unavailable()
        if why_not:
            self._status = RunnerStatus(Mode.EAGER, why_not)
            return self._status
        path = compiled.package_path(self.transformer, self.cache_dtype)
        damaged = ""
        if compiled.is_built(path):
            self.packages, damage = compiled.load_packages(path, self.transformer)
            if self.packages is not None:
                self._status = RunnerStatus(Mode.COMPILED)
                return self._status
            damaged = f"the compiled step on disk did not load ({damage[:160]}), so it was removed; "
        if not background:
            if damaged:
                self._status = RunnerStatus(Mode.EAGER, f"{damaged}the next chat builds it")
            return self._status
        self.pending = compiled.BackgroundBuild(self.transformer, self.cache_dtype, path)
        self._status = RunnerStatus(Mode.COMPILING, f"{damaged}in the background, once for this model and CPU; "
                                                    "eager meanwhile")
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
            self._status = RunnerStatus(Mode.EAGER, pending.error)
            return
        self.packages = pending.packages
        self._status = RunnerStatus(Mode.COMPILED, f"built in {pending.seconds:.0f} s")

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()

    def compiling(self) -> int:
        """1 while a compile of this runner's runs in the background, else 0."""
        return int(self.pending is not None and not self.pending.done())


class TimedRunner(Wrapper):
    """Keeps what short calls cost, by their number of tokens: what speculation weighs."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self._times: dict[int, deque[float]] = {}  # tokens in a call -> its recent times

    def __call__(self, cache: KVCache, ids: Sequence[int], **options) -> torch.Tensor:
        started = time.perf_counter()
        logits = self.inner(cache, ids, **options)
        if len(ids) <= compiled.VERIFY_TOKENS:
            self._times.setdefault(len(ids), deque(maxlen=8)).append(time.perf_counter() - started)
        return logits

    @property
    def seconds(self) -> dict[int, float]:
        """What a call of n tokens costs, by n (short calls that ran at least twice): the least
        of its recent times, as a busy machine only ever adds to them. A size's first run
        alone may include one-off costs (a kernel's first call), so it is not trusted."""
        return {rows: min(times) for rows, times in self._times.items() if len(times) > 1}


# Threads
# -------
# How many threads the model's calls run with, chosen by measuring while the chat runs.
#
# A thread that waits on the others at every operator loses far more than its share when
# another process takes its core: on a 2-core machine with one other busy process, two
# threads decode at an eighth of their idle speed, one thread at two thirds. So the chat
# does not assume the machine is its own. It times its calls with the threads it uses and
# runs with whichever count was fastest of late: decode and verify steps try the other
# counts now and then, and their times go stale after a few seconds, so a machine that
# becomes idle again gets all its threads back. A prompt goes in chunks: it starts with the
# count the steps chose (all the threads where nothing is known), and a chunk that took
# far longer than that count ever took (a starved thread) sends the next one to fewer
# threads. While a child of the chat works in the background (a kernel build, a compile),
# one core is left to it.

STALE_SECONDS = 4.0  # a step's time older than this says little of the machine now
TRY_EVERY = 8  # steps between tries of a count with no fresh time
KEPT = 6  # times kept a count and call size
STARVED = 1.6  # a chunk this many times slower than its count's best had a thread starved


class ThreadGovernor(Wrapper):
    """Runs each call of `inner` with the thread count measured fastest of late, at most
    `most` less the children `background()` says are working."""

    def __init__(self, inner: Runner, most: int | None = None, background: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(inner)
        self.most = most or process_threads()
        self.background = background
        self.clock = clock
        self._times: dict[tuple[int, int], deque[tuple[float, float]]] = {}  # (threads, tokens): (when, seconds)
        self._chunk_best: dict[tuple[int, int], float] = {}  # (threads, chunk size): the least time one took
        self._since_try = 0
        self.threads = self.most  # what the last call ran with

    def __call__(self, cache: KVCache, ids: Sequence[int], *, every_logits: bool = False, **options) -> torch.Tensor:
        if len(ids) <= compiled.VERIFY_TOKENS or every_logits:
            threads = self._choose(len(ids))
            started = self._run_with(threads)
            logits = self.inner(cache, ids, every_logits=every_logits, **options)
            now = self.clock()
            self._times.setdefault((threads, len(ids)), deque(maxlen=KEPT)).append((now, now - started))
            return logits
        return self._prompt(cache, ids, **options)

    def _prompt(self, cache: KVCache, ids: Sequence[int], chunk_size: int = PREFILL_CHUNK, **options) -> torch.Tensor:
        """A prompt in the chunks the eager runner would make, each with the count that suits
        the machine as the last showed."""
        threads = self._best(self._allowed())
        for start in range(0, len(ids), chunk_size):
            chunk = ids[start : start + chunk_size]
            began = self._run_with(threads)
            logits = self.inner(cache, chunk, chunk_size=chunk_size, **options)
            if len(chunk) == chunk_size:
                took = self.clock() - began
                best = self._chunk_best.setdefault((threads, chunk_size), took)
                self._chunk_best[threads, chunk_size] = min(best, took)
                if took > STARVED * best and threads > 1:
                    threads -= 1
        return logits

    def _run_with(self, threads: int) -> float:
        run_with(threads)
        self.threads = threads
        return self.clock()

    def _allowed(self) -> list[int]:
        return list(range(1, max(1, self.most - self.background()) + 1))

    def _known(self, allowed: list[int], tokens: int) -> dict[int, float]:
        """Each allowed count's least recent time for calls of `tokens`, where one is fresh."""
        now = self.clock()
        known = {}
        for threads in allowed:
            times = [seconds for when, seconds in self._times.get((threads, tokens), ()) if now - when < STALE_SECONDS]
            if times:
                known[threads] = min(times)
        return known

    def _best(self, allowed: list[int], tokens: int = 1) -> int:
        """The count with the least fresh time for calls of `tokens` (the most threads
        where none is known)."""
        known = self._known(allowed, tokens)
        return min(known, key=known.get) if known else allowed[-1]

    def _choose(self, tokens: int) -> int:
        """The fastest count, or now and then the most threads with no fresh time, to learn it."""
        allowed = self._allowed()
        self._since_try += 1
        known = self._known(allowed, tokens)
        if len(known) < len(allowed) and (not known or self._since_try >= TRY_EVERY):
            self._since_try = 0
            return max(set(allowed) - known.keys())
        return min(known, key=known.get)

def model_runner(
    transformer: Transformer, cache_dtype: torch.dtype, background: Callable[[], int] = lambda: 0
) -> TimedRunner:
    """How a model on its own runs: timed, compiled where it can be, else eager; on the cpu
    with the threads measured fastest, a core left to each child at work (`background`, and
    the runner's own compile)."""
    compiling = CompiledRunner(EagerRunner(transformer), cache_dtype)
    if transformer.rope_cos.device.type != "cpu":
        return TimedRunner(compiling)
    return TimedRunner(ThreadGovernor(compiling, background=lambda: background() + compiling.compiling()))
