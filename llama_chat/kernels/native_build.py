"""Building llama-chat's kernels (csrc/) on this machine, once.

The C++ sources are compiled with PyTorch's extension tooling (a C++ compiler and the
`ninja` package) into one library, kept where native_files.py says: by `scripts/setup`,
by `python -m llama_chat.kernels.native_build`, or in the background on first use
(`start_build`), while that first run goes on with PyTorch's own kernels (a chat moves
onto them once they are built, cli/kernel_switch.py). A background build runs at the
lowest priority, one compiler at a time, and ends with the process that started it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llama_chat import environment
from llama_chat.kernels.native import output_line
from llama_chat.kernels.native_files import (
    COMPILE_FLAGS, LIBRARY_NAME, OPENMP, SOURCE_DIR, build_directory, check_kept, keep, library_file, record_failure,
)
from llama_chat.parent_watch import end_with_parent
from llama_chat.paths import configure


def missing_tools() -> str | None:
    """Why this machine cannot build the kernels, or None."""
    compiler = environment.compiler()
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) found; install g++ or clang to build llama-chat's kernels"
    try:
        import ninja  # noqa: F401  (the extension tooling runs the ninja program it ships)
    except ImportError:
        return "the ninja package is missing (pip install ninja) to build llama-chat's kernels"
    return None


def build(directory: Path) -> Path:
    """Compile the library into `directory` (whole or not at all); its path."""
    from torch.utils import cpp_extension  # heavy; only a build needs it

    library = library_file(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent) as workdir:
        sources = [str(p) for p in sorted(SOURCE_DIR.glob("*.cpp"))]
        built = cpp_extension.load(
            name=LIBRARY_NAME, sources=sources, build_directory=workdir,
            extra_cflags=COMPILE_FLAGS, extra_ldflags=OPENMP, is_python_module=False, verbose=False,
        )
        keep(Path(built if isinstance(built, str) else library_file(Path(workdir))), library)
    return library


@functools.cache
def _started_build(directory: Path) -> subprocess.Popen:
    """The one build this process starts into `directory`: a child process (so a chat never
    waits on it, nor fails with it), in a session of its own (Ctrl-C is the chat's), at the
    lowest priority with one compiler at a time (the chat keeps the machine), ending with
    this process however it ends."""
    return subprocess.Popen(
        [sys.executable, "-m", "llama_chat.kernels.native_build", str(directory), str(os.getpid())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, env=environment.child_environment(MAX_JOBS="1", OMP_NUM_THREADS="1"),
    )


def start_build(directory: Path) -> None:
    """Start building into `directory` in the background (once a process)."""
    _started_build(directory)


def started_build() -> tuple[Path, subprocess.Popen] | None:
    """The folder and process of the build this process started, if it started one."""
    if _started_build.cache_info().currsize == 0:  # asked at every step: nothing to work out
        return None
    directory = build_directory()
    return directory, _started_build(directory)


def build_running() -> bool:
    """Whether the build this process started runs and has not written the library yet."""
    started = started_build()
    if started is None:
        return False
    directory, child = started
    return child.poll() is None and not library_file(directory).exists()


def wait_for_build() -> str:
    """Wait for the build this process started (if one runs) to end; what it wrote on its
    error output ("" when none ran)."""
    started = started_build()
    if started is None:
        return ""
    return started[1].communicate()[1] or ""


def main(argv: list[str]) -> int:
    """Build into the folder given (a child of `start_build`, watching the process that
    started it), or into the cache folder."""
    if len(argv) > 1:  # in the background of a chat: ends with it, and yields it the machine
        end_with_parent(int(argv[1]))
        os.nice(19)
    directory = Path(argv[0]) if argv else build_directory()
    if directory is None:
        print("llama-chat kernels: the cache is off (LLAMA_CHAT_CACHE=off); nothing built", file=sys.stderr)
        return 1
    if not check_kept(library_file(directory)) and library_file(directory).exists():
        return 0
    reason = missing_tools()
    if reason:
        print(f"llama-chat kernels: {reason}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    try:
        build(directory)
    except Exception as error:  # any failure of the compiler: recorded in one line
        line = output_line(str(error))
        record_failure(directory, line)
        print(f"llama-chat kernels: build failed: {line}", file=sys.stderr)
        return 1
    if not argv:
        print(f"llama-chat kernels built in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    # A program of its own (scripts/setup runs it): its folders come from the environment.
    configure(environment.folders())
    sys.exit(main(sys.argv[1:]))
