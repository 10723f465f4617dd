"""The threads a model's calls run with, chosen by measuring while the chat runs.

A thread that waits on the others at every operator loses far more than its share when
another process takes its core: on a 2-core machine with one other busy process, two
threads decode at an eighth of their idle speed, one thread at two thirds. So the chat
does not assume the machine is its own. The runner (engine/runners) asks a
`ThreadGovernor` which count each call runs with and tells it what the call took: decode
and verify steps run with whichever count was fastest of late, trying the other counts
now and then, and their times go stale after a few seconds, so a machine that becomes
idle again gets all its threads back. A prompt goes in chunks: it starts with the count
the steps chose (all the threads where nothing is known), and a chunk that took far
longer than that count ever took (a starved thread) sends the next one to fewer threads.
While a child of the chat works in the background (a kernel build, a compile), one core
is left to it.

The governor leaves PyTorch's count lowered between calls. What it lowered is not what a
model loaded later (a /load, the move onto llama-chat's kernels), its governor or its
packing should size themselves by: they ask `process_threads()`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import torch

STALE_SECONDS = 4.0  # a step's time older than this says little of the machine now
TRY_EVERY = 8  # steps between tries of a count with no fresh time
KEPT = 6  # times kept a count and call size
STARVED = 1.6  # a chunk this many times slower than its count's best had a thread starved

_process_threads: int | None = None  # PyTorch's count before a governor first changed it


def process_threads() -> int:
    """The threads this process was given (PyTorch's count as the process set it)."""
    return _process_threads or torch.get_num_threads()


def run_with(threads: int) -> None:
    """Run PyTorch's next calls on `threads`, the process's own count remembered first."""
    global _process_threads
    if _process_threads is None:
        _process_threads = torch.get_num_threads()
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)


class ThreadGovernor:
    """The thread count for each model call: the one measured fastest of late, at most
    `most` less the children `background()` says are working."""

    def __init__(self, most: int | None = None, background: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.most = most or process_threads()
        self.background = background
        self.clock = clock
        self._times: dict[tuple[int, int], deque[tuple[float, float]]] = {}  # (threads, tokens): (when, seconds)
        self._chunk_best: dict[tuple[int, int], float] = {}  # (threads, chunk size): the least time one took
        self._since_try = 0
        self.threads = self.most  # what the last call ran with

    def use(self, threads: int) -> float:
        """Run the next call with `threads`; the clock's time as it starts."""
        run_with(threads)
        self.threads = threads
        return self.clock()

    def step_threads(self, tokens: int) -> int:
        """For a step of `tokens`: the fastest count, or now and then the most threads with
        no fresh time, to learn it."""
        allowed = self._allowed()
        self._since_try += 1
        known = self._known(allowed, tokens)
        if len(known) < len(allowed) and (not known or self._since_try >= TRY_EVERY):
            self._since_try = 0
            return max(set(allowed) - known.keys())
        return min(known, key=known.get)

    def step_took(self, threads: int, tokens: int, started: float) -> None:
        """A step of `tokens` on `threads`, started at `started`, has ended."""
        now = self.clock()
        self._times.setdefault((threads, tokens), deque(maxlen=KEPT)).append((now, now - started))

    def prompt_threads(self) -> int:
        """A prompt's first chunk: the count with the least fresh time for single steps (the
        most threads where none is known)."""
        allowed = self._allowed()
        known = self._known(allowed, 1)
        return min(known, key=known.get) if known else allowed[-1]

    def chunk_took(self, threads: int, chunk_size: int, started: float) -> int:
        """A whole chunk on `threads`, started at `started`, has ended: the count the next
        one runs with (one fewer if a thread starved)."""
        took = self.clock() - started
        best = min(self._chunk_best.get((threads, chunk_size), took), took)
        self._chunk_best[threads, chunk_size] = best
        return threads - 1 if took > STARVED * best and threads > 1 else threads

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
