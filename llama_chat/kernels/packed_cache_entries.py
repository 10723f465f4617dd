"""The packed cache's entries as a whole: listed, and pruned to a size bound.

Every model loaded on llama-chat's kernels leaves an entry about the size of the model,
so the cache is bounded: before a new entry is written, the least recently used others
are removed until all fit within the smaller of LLAMA_CHAT_PACKED_CACHE_GB (20 GB unless
set) and half the disk space the cache could have (what is free plus what it holds). An
entry's last use is its file's modification time, set each time it is mapped. The entries
of the load under way are never removed, even when they alone pass the bound.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from llama_chat.disk_cache import STAGING_SUFFIX

DEFAULT_BOUND_GB = 20
DISK_SHARE = 0.5  # of the space the cache could have
# Left by a process that ended mid-write; younger ones may be another process's write now.
UNFINISHED_KEPT_SECONDS = 24 * 3600
ENTRY_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int
    last_used: float  # seconds since the epoch
    unfinished: bool  # a write that has not ended (or never will)


def entries(folder: Path) -> list[Entry]:
    """The entries in the cache's folder, least recently used first; files that vanish
    while listed (another process pruning) are left out."""
    found = []
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        unfinished = name.endswith(STAGING_SUFFIX)
        if not (unfinished or name.endswith(ENTRY_SUFFIX)):
            continue
        try:
            info = (folder / name).stat()
        except FileNotFoundError:
            continue
        found.append(Entry(folder / name, info.st_size, info.st_mtime, unfinished))
    return sorted(found, key=lambda entry: entry.last_used)


def bound_bytes(folder: Path, held: int, configured_gb: float | None = None) -> int:
    """How many bytes the entries may hold, `held` being what they hold now, within
    `configured_gb` (LLAMA_CHAT_PACKED_CACHE_GB; None: the default)."""
    gigabytes = DEFAULT_BOUND_GB if configured_gb is None else configured_gb
    free = shutil.disk_usage(folder).free
    return int(min(gigabytes * 1e9, DISK_SHARE * (free + held)))


def make_room(folder: Path, new_bytes: int, keep: set[Path], bound_gb: float | None = None) -> list[Entry]:
    """Remove the least recently used entries (never those in `keep`) until the rest and
    `new_bytes` more fit within the bound (bound_bytes, `bound_gb` configured), and
    unfinished writes left a day or more ago; what was removed."""
    folder.mkdir(parents=True, exist_ok=True)
    present = entries(folder)
    now = time.time()
    stale = [e for e in present if e.unfinished and now - e.last_used > UNFINISHED_KEPT_SECONDS]
    total = sum(e.size for e in present if e not in stale) + new_bytes
    bound = bound_bytes(folder, total - new_bytes, bound_gb)
    removed = list(stale)
    for entry in present:
        if total <= bound:
            break
        if entry.unfinished or entry.path in keep:
            continue
        removed.append(entry)
        total -= entry.size
    for entry in removed:
        entry.path.unlink(missing_ok=True)
    return removed


def record_use(path: Path) -> None:
    """Mark the entry as used now (its modification time), for pruning by last use."""
    try:
        os.utime(path)
    except OSError:  # a cache on a read-only disk: it is not pruned by this process either
        pass
