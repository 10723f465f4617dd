"""The progress bar of a slow load: on stderr, and only when it is a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from llama_chat.checkpoints.contents import stored_bytes

PROGRESS_AFTER_SECONDS = 1.0


class LoadProgress:
    """A rich progress bar on stderr, shown only on a terminal and only once a load has
    taken longer than PROGRESS_AFTER_SECONDS."""

    def __init__(self, description: str, total_bytes: int) -> None:
        self.description = description
        self.total = total_bytes
        self.done = 0
        self.started = time.perf_counter()
        self._bar = None
        self._task = None

    @contextmanager
    def item(self, what: str, weight) -> Iterator[None]:
        """Reading and converting one weight: shown while it runs, counted when done."""
        self._show(what)
        yield
        self.done += stored_bytes(weight)
        self._show(what)

    def _show(self, what: str) -> None:
        if self._bar is None:
            if time.perf_counter() - self.started < PROGRESS_AFTER_SECONDS or not sys.stderr.isatty():
                return
            self._start()
        self._bar.update(self._task, completed=self.done, what=what)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description} [dim]{task.fields[what]}"), BarColumn(), DownloadColumn(),
            TimeRemainingColumn(), console=Console(stderr=True), transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.description, total=self.total, completed=self.done, what="")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
