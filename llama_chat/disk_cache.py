"""What llama-chat keeps on disk to save work, kept one way.

An entry is found by a key made from everything it depends on, written whole or not at
all (under a temporary name, renamed into place), and checked when read: one that does
not read back (truncated, edited by hand, left by older code) is removed and the reason
given in one line, and its cache makes it again. The caches: the built kernels
(kernels/native_files.py), the packed weights (kernels/packed_cache.py), the probe's
measurements (kernels/cpu_paths.py), the compiled packages (engine/compiled.py), the
tokenizers built from model files (text/tokenizer_cache.py), and saved KV caches, which
live beside their conversation files (chat/cache_file.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from glob import escape as glob_escape
from pathlib import Path
from typing import TypeVar

from llama_chat.errors import first_line
from llama_chat.paths import cache_root

STAGING_SUFFIX = ".partial"  # of the temporary names `staged` writes under
IDENTITY_SAMPLES = 16  # pieces of a file hashed for its identity, spread over it
IDENTITY_SAMPLE_BYTES = 1 << 16
T = TypeVar("T")


def cache_key(description: object, length: int = 24) -> str:
    """A hash of a JSON-able description of what an entry depends on: a change to any of
    it gives another key, so an entry is never used for something it was not made from."""
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:length]


def code_digests(names: Iterable[str]) -> list[str]:
    """The sha256 of each named file inside llama_chat/: an entry keyed by them is made anew
    when the code that made it changes."""
    package = Path(__file__).resolve().parent
    return [hashlib.sha256((package / name).read_bytes()).hexdigest() for name in names]


def file_identity(path: Path) -> list:
    """What tells a file from a changed one at a glance: its name, size, modification time
    and a hash of its first MiB and of pieces spread over it (a few MB read, not the file)."""
    info = path.stat()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        for index in range(IDENTITY_SAMPLES):
            handle.seek(info.st_size * index // IDENTITY_SAMPLES)
            digest.update(handle.read(IDENTITY_SAMPLE_BYTES))
    return [path.name, info.st_size, info.st_mtime_ns, digest.hexdigest()]


def entry_path(*parts: str) -> Path | None:
    """Where an entry is kept in the cache folder (folder, then file name); None when the
    cache is off or cannot be written."""
    root = cache_root()
    return None if root is None else root.joinpath(*parts)


@contextmanager
def staged(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write a new file under: renamed to `path` when the
    block ends, removed when it fails. A reader sees the file whole or not at all. The name
    holds the writer's process id: what a writer killed mid-way left (gigabytes, for packed
    weights) is removed by the next one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(path)
    prefix = f".{path.name}.{os.getpid()}."
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=STAGING_SUFFIX)
    os.close(handle)
    try:
        yield Path(staging)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def _remove_abandoned(path: Path) -> None:
    """Remove the temporary files of writers of `path` that are no longer running."""
    prefix = f".{path.name}."
    for staging in path.parent.glob(f"{glob_escape(prefix)}*{STAGING_SUFFIX}"):
        writer = staging.name[len(prefix):].partition(".")[0]
        if writer.isdigit() and not _running(int(writer)):
            staging.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def read_checked(
    files: Iterable[Path], read: Callable[[], T], damage: tuple[type[Exception], ...] = (OSError, ValueError)
) -> tuple[T | None, str]:
    """read() of the entry made of `files` (the caller's check raises when it is not as
    written), and ""; or, when read raises one of `damage`, None and the reason in one
    line, the files removed so that the caller makes the entry again."""
    files = list(files)
    try:
        return read(), ""
    except damage as error:
        remove(files)
        return None, first_line(error)


def remove(files: Iterable[Path]) -> None:
    """Remove an entry's files. One that cannot be removed (a folder in its place, a disk
    that is read-only) is left: a new entry is written over it, or it fails its check again."""
    for file in files:
        try:
            file.unlink(missing_ok=True)
        except OSError:
            pass
