"""Where a build of llama-chat's kernels is kept, and whether what is there is whole.

A build is kept per CPU model, PyTorch version and source text, in `kernels/` of the cache
folder (LLAMA_CHAT_KERNELS_DIR moves it: paths.kernels_folder). Beside the library lies
its digest, so a library that is not the file its build wrote (truncated, changed) is
found before it is loaded, and a failed build leaves a line saying why.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

from llama_chat.disk_cache import cache_key, read_checked, staged
from llama_chat.engine.device import cpu_model_name
from llama_chat.errors import CorruptFileError
from llama_chat.paths import kernels_folder

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
LIBRARY_NAME = "llama_chat_kernels"
# at::parallel_for is inline OpenMP in PyTorch's Linux builds: without -fopenmp it runs on
# one thread. The library then asks for libgomp.so.1, which the loader finds already
# loaded with PyTorch (one OpenMP runtime, one thread pool).
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []
COMPILE_FLAGS = ["-O3", "-std=c++17", *OPENMP]
# A failed build is not tried again at every start (each try costs seconds of compiling),
# but is after a day: a compiler installed since, or a passing fault, then gets its chance.
RETRY_FAILED_BUILD_SECONDS = 24 * 3600
FAILURE_FILE = "build-failed.txt"


@functools.cache  # the sources, the CPU and PyTorch stay what they are for a process
def build_key() -> str:
    """What a build depends on: the sources and flags, this CPU and PyTorch."""
    return cache_key({
        "flags": COMPILE_FLAGS,
        "sources": [[source.name, _digest(source)] for source in sorted(SOURCE_DIR.iterdir())],
        "machine": [cpu_model_name(), torch.backends.cpu.get_cpu_capability(), torch.__version__],
    }, length=20)


def build_directory() -> Path | None:
    """This build's folder; None where the cache is off."""
    folder = kernels_folder()
    return None if folder is None else folder / build_key()


def library_file(directory: Path) -> Path:
    return directory / f"{LIBRARY_NAME}.so"


def _record_file(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_kept(library: Path) -> str:
    """Why the library on disk is not the file its build wrote, as its record says ("" when
    it is, or is not there); such a library is removed with its record. Checked before
    loading: loading a truncated library kills the process (a bus error), not an exception."""
    if not library.exists():
        return ""

    def check() -> None:
        if _record_file(library).read_text(encoding="utf-8").strip() != _digest(library):
            raise CorruptFileError(f"{library.name} is not the file its build wrote")

    return read_checked([library, _record_file(library)], check)[1]


def keep(built: Path, library: Path) -> None:
    """Put the library a compiler wrote at `built` in its place, its record first."""
    with staged(_record_file(library)) as record:
        record.write_text(_digest(built) + "\n", encoding="utf-8")
    with staged(library) as staging:
        os.replace(built, staging)


def recent_failure(directory: Path) -> str | None:
    """The line a build into `directory` failed with, within the last day; None otherwise."""
    failed = directory / FAILURE_FILE
    if not failed.exists() or time.time() - failed.stat().st_mtime >= RETRY_FAILED_BUILD_SECONDS:
        return None
    return failed.read_text(encoding="utf-8").strip()


def record_failure(directory: Path, line: str) -> None:
    with staged(directory / FAILURE_FILE) as record:
        record.write_text(line + "\n", encoding="utf-8")


def forget_failure(directory: Path) -> None:
    (directory / FAILURE_FILE).unlink(missing_ok=True)
