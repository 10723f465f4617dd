"""This process's memory: its peak, and what it holds now of its own and of mapped files."""

from __future__ import annotations

import ctypes
import functools
import mmap
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


def private_pages(length: int) -> mmap.mmap:
    """`length` bytes of fresh anonymous memory of this process's own (never shared with a
    child, never a file's), starting on a page; zero until written. Small pages: asking for
    large ones (MADV_HUGEPAGE) made an 8 B model's first load 1.7-1.9x slower on an AMD EPYC
    virtual machine, its faults compacting memory to find them (0.7-18 GB/s against a steady
    3.2-3.8 for small pages), and the file mapped over the image later has small pages anyway."""
    return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


_MAP_FIXED = 0x10  # the same on Linux and macOS


def map_file_over(address: int, length: int, descriptor: int) -> bool:
    """Map the first `length` bytes of the open file `descriptor` (private, never written
    back) at `address`, in place of the pages there, in one step: a thread reading those
    addresses meanwhile sees the old pages or the file's, never a hole. For memory whose
    bytes the file holds already. Whether it was done (not where the C library is another)."""
    mapper = _libc("mmap")
    if mapper is None or address % _PAGE:
        return False
    mapper.restype = ctypes.c_void_p
    mapper.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    placed = mapper(address, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _MAP_FIXED, descriptor, 0)
    return placed == address
