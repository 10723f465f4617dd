"""This process's memory: its peak, and what it holds now of its own and of mapped files."""

from __future__ import annotations

import ctypes
import functools
import resource
from collections.abc import Callable


def peak_memory_mb() -> float:
    """This process's peak resident memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def memory_now_mb() -> tuple[float, float] | None:
    """This process's resident memory now, and the part of it that is its own (anonymous:
    not pages of mapped files, which the system shares between processes and can drop);
    None where /proc does not say (not Linux)."""
    fields = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                name, _, value = line.partition(":")
                fields[name] = value.split()
        return int(fields["VmRSS"][0]) / 1024, int(fields["RssAnon"][0]) / 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def memory_report() -> list[float]:
    """[peak resident MB, own MB now (0 where unknown)]: what a rank reports to rank 0."""
    now = memory_now_mb()
    return [peak_memory_mb(), 0.0 if now is None else now[1]]


@functools.cache
def _libc(name: str) -> Callable[..., int] | None:
    """A function of glibc, or None where the C library is another."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Give memory freed by a large piece of work (packing a model, a prompt chunk) back to
    the system.

    glibc's malloc keeps freed blocks of up to 32 MB for reuse, so the temporaries of
    packing one matrix after another, or of a prompt chunk's layers, would stay resident,
    used by nothing.
    """
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


_POPULATE_READ = 22  # madvise's advice that fills a mapping's page table at once (Linux 5.14 and later)
_PAGE = 4096


def populate(address: int, length: int) -> None:
    """Map in, at once, the pages of a mapped file's `length` bytes from `address`, as
    llama.cpp's MAP_POPULATE does: the first pass over a model then meets no page faults, a
    million of them for 4 GB, each a trip into the kernel. Where the system cannot, the
    pages come in as they are first touched."""
    advise = _libc("madvise")
    if advise is None or length <= 0:
        return
    start = address - address % _PAGE
    advise(ctypes.c_void_p(start), ctypes.c_size_t(length + address - start), _POPULATE_READ)
