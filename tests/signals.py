"""Signals a test sends, whatever the run inherited. A run started in the background by a
shell without job control inherits SIGINT and SIGQUIT ignored, one under nohup SIGHUP; the
processes it starts inherit that too, and Python starts without its KeyboardInterrupt
where SIGINT is ignored. A test that sends one of them first puts back what a foreground
job has."""

import signal
from collections.abc import Iterator
from contextlib import contextmanager

FOREGROUND_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def as_a_foreground_job() -> None:
    """For a child's preexec_fn: the signals a terminal sends act on it as on a foreground job."""
    for number in FOREGROUND_SIGNALS:
        signal.signal(number, signal.SIG_DFL)


@contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """Within the block, SIGINT to this process raises KeyboardInterrupt, as Python has it in a
    foreground run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
