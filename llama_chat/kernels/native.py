"""llama-chat's own CPU kernels (csrc/): built on this machine, kept, loaded, or not.

The C++ sources are compiled with PyTorch's extension tooling (a C++ compiler and the
`ninja` package) into one library that registers `llama_chat::block_linear` and
`llama_chat::cache_attention`. A build is kept per CPU model, PyTorch version and source
text, in `kernels/` of the cache folder (LLAMA_CHAT_KERNELS_DIR moves it: paths.kernels_folder),
so it is made once: by `scripts/setup`, by `python -m llama_chat.kernels.native`, or in the background
on first use, while that first run goes on with PyTorch's own kernels (a chat moves onto them
once they are built, see `finished_build`). A background build runs at the lowest priority,
one compiler at a time, and ends with the process that started it. Without a
compiler, or when a build fails, PyTorch's kernels run and `status()` says why in one
line. A kept build that is not the file its build wrote (truncated, changed: its digest
is recorded beside it) is removed and built again the same way.

Variants: portable C++, AVX2 (with FMA) and AVX-512 with VNNI; the library reports their
names and which this CPU can run, and LLAMA_CHAT_KERNEL_VARIANT (KernelOptions.variant) forces one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from llama_chat import environment
from llama_chat.disk_cache import cache_key, read_checked, staged
from llama_chat.engine.device import cpu_model_name
from llama_chat.errors import CorruptFileError
from llama_chat.kernels.library_layout import library_layout
from llama_chat.options import KernelFamily, KernelOptions
from llama_chat.parent_watch import end_with_parent
from llama_chat.paths import configure, kernels_folder

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


@dataclass(frozen=True)
class NativeStatus:
    loaded: bool
    detail: str  # the variants this CPU runs, or why the kernels are not in use
    # Off for want of something on this machine (a compiler, ninja, a build that failed or
    # does not load), not by a choice or for a build under way: worth a line at start-up.
    wanting: bool = False


@functools.cache  # the sources, the CPU and PyTorch stay what they are for a process
def build_key() -> str:
    """What a build depends on: the sources and flags, this CPU and PyTorch."""
    return cache_key({
        "flags": COMPILE_FLAGS,
        "sources": [[source.name, _digest(source)] for source in sorted(SOURCE_DIR.iterdir())],
        "machine": [cpu_model_name(), torch.backends.cpu.get_cpu_capability(), torch.__version__],
    }, length=20)


def build_directory() -> Path | None:
    folder = kernels_folder()
    return None if folder is None else folder / build_key()


def library_file(directory: Path) -> Path:
    return directory / f"{LIBRARY_NAME}.so"


def _record_file(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_kept(library: Path) -> str:
    """Why the library on disk is not the file its build wrote, as its record says ("" when
    it is, or is not there); such a library is removed with its record. Checked before
    loading: loading a truncated library kills the process (a bus error), not an exception."""
    if not library.exists():
        return ""

    def check() -> None:
        if _record_file(library).read_text(encoding="utf-8").strip() != _digest(library):
            raise CorruptFileError(f"{library.name} is not the file its build wrote")

    return read_checked([library, _record_file(library)], check)[1]


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
        built = Path(built if isinstance(built, str) else library_file(Path(workdir)))
        with staged(_record_file(library)) as record:
            record.write_text(_digest(built) + "\n", encoding="utf-8")
        with staged(library) as staging:
            os.replace(built, staging)
    return library


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[0][:200]


@functools.cache
def _started_build(directory: Path) -> subprocess.Popen:
    """The one build this process starts into `directory`: a child process (so a chat never
    waits on it, nor fails with it), in a session of its own (Ctrl-C is the chat's), at the
    lowest priority with one compiler at a time (the chat keeps the machine), ending with
    this process however it ends."""
    return subprocess.Popen(
        [sys.executable, "-m", "llama_chat.kernels.native", str(directory), str(os.getpid())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, env=environment.child_environment(MAX_JOBS="1", OMP_NUM_THREADS="1"),
    )


def _build_started() -> tuple[Path, subprocess.Popen] | None:
    """The folder and process of the build this process started, if it started one."""
    if _started_build.cache_info().currsize == 0:  # asked at every step: nothing to work out
        return None
    directory = build_directory()
    return directory, _started_build(directory)


def build_under_way() -> subprocess.Popen | None:
    """The build this process started, while it runs and has not written the library."""
    started = _build_started()
    if started is None:
        return None
    directory, child = started
    return child if child.poll() is None and not library_file(directory).exists() else None


def finished_build() -> bool:
    """Whether a build this process started in the background has finished since it was
    last asked, with a library that loads: the kernels are there for models loaded from now
    on. The build's process is collected either way."""
    started = _build_started()
    if started is None:
        return False
    directory, child = started
    child.poll()  # collected once it has ended
    if _operators_registered() or not library_file(directory).exists():  # written whole, or not at all
        return False
    return status().loaded


def wait_for_build() -> bool:
    """Wait for the build this process started (if one runs) to end; whether the kernels loaded."""
    child = build_under_way()
    if child is not None:
        child.communicate()
    return finished_build()


def _operators_registered() -> bool:
    try:
        torch.ops.llama_chat.block_linear
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.cache
def _load_library(path: str) -> None:
    environment.hand_down(environment.LOADED_LIBRARY, path)  # a child loads this same file
    if _operators_registered():  # an equal build loaded from another folder (a second registration aborts)
        return
    torch.ops.load_library(path)
    # Shapes for tracing (the compiled decode step calls the operator too), from the
    # arguments they depend on; the rest are the schema's (ops.cpp, attention_ops.cpp).
    torch.library.register_fake("llama_chat::block_linear")(
        lambda x, weight, block_type, out_features, *_: x.new_empty((*x.shape[:-1], out_features))
    )
    torch.library.register_fake("llama_chat::cache_attention")(lambda q, *_: q.new_empty(q.shape))


def status(wait: bool = False, kernels: KernelOptions = KernelOptions()) -> NativeStatus:
    """Load the kernels if a build is on disk; otherwise start one (in the background, or
    waited for with `wait`) and say so. Never raises: PyTorch's kernels are the fallback."""
    if kernels.family is KernelFamily.ATEN:
        return NativeStatus(False, "PyTorch's kernels forced (LLAMA_CHAT_KERNELS=aten)")
    directory = build_directory()
    if directory is None:
        return NativeStatus(False, "not built: the cache is off (LLAMA_CHAT_CACHE=off)")
    library = library_file(directory)
    # Truncated or changed: built again below.
    damaged = f"{library.name} was not the file its build wrote, and was removed; " if _check_kept(library) else ""
    if library.exists():
        try:
            _load_library(str(library))
        except (OSError, RuntimeError) as error:
            return NativeStatus(False, f"cannot load {library.name}: {_first_line(str(error))}", wanting=True)
        return NativeStatus(True, "variants here: " + ", ".join(runnable_variants()))
    failed = directory / "build-failed.txt"
    if failed.exists() and time.time() - failed.stat().st_mtime < RETRY_FAILED_BUILD_SECONDS:
        line = failed.read_text(encoding="utf-8").strip()
        return NativeStatus(False, f"build failed: {line} (remove {directory} to try again now)", wanting=True)
    failed.unlink(missing_ok=True)
    reason = missing_tools()
    if reason:
        return NativeStatus(False, damaged + reason, wanting=True)
    child = _started_build(directory)
    if not wait:
        return NativeStatus(False, damaged + "building in the background (PyTorch's kernels meanwhile)")
    _, errors = child.communicate()
    if not library.exists():
        return NativeStatus(False, damaged + f"build failed: {_first_line(errors or '')}", wanting=True)
    try:
        _load_library(str(library))
    except (OSError, RuntimeError) as error:
        return NativeStatus(False, f"cannot load {library.name}: {_first_line(str(error))}", wanting=True)
    rebuilt = f"{damaged}built again; " if damaged else ""
    return NativeStatus(True, rebuilt + "variants here: " + ", ".join(runnable_variants()))


def load_built() -> bool:
    """Load a build already on disk (nothing is built): the parent's library in a child
    process, else this build's; whether the kernels are loaded."""
    inherited = environment.inherited_library()
    if inherited and Path(inherited).exists():
        _load_library(inherited)
        return True
    directory = build_directory()
    if directory is None or not library_file(directory).exists():
        return False
    _load_library(str(library_file(directory)))
    return True


def variant_names() -> tuple[str, ...]:
    """Every variant of the loaded library, in its numbering."""
    return library_layout().variants


def runnable_variants() -> list[str]:
    bits = torch.ops.llama_chat.supported_variants()
    return [name for number, name in enumerate(variant_names()) if bits >> number & 1]


def variant_number(name: str) -> int:
    return variant_names().index(name)


def main(argv: list[str]) -> int:
    """Build into the folder given (a child of `status`, watching the process that started
    it), or into the cache folder."""
    if len(argv) > 1:  # in the background of a chat: ends with it, and yields it the machine
        end_with_parent(int(argv[1]))
        os.nice(19)
    directory = Path(argv[0]) if argv else build_directory()
    if directory is None:
        print("llama-chat kernels: the cache is off (LLAMA_CHAT_CACHE=off); nothing built", file=sys.stderr)
        return 1
    if not _check_kept(library_file(directory)) and library_file(directory).exists():
        return 0
    reason = missing_tools()
    if reason:
        print(f"llama-chat kernels: {reason}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    try:
        build(directory)
    except Exception as error:  # any failure of the compiler: recorded in one line
        line = _first_line(str(error))
        with staged(directory / "build-failed.txt") as record:
            record.write_text(line + "\n", encoding="utf-8")
        print(f"llama-chat kernels: build failed: {line}", file=sys.stderr)
        return 1
    if not argv:
        print(f"llama-chat kernels built in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    # A program of its own (scripts/setup runs it): its folders come from the environment.
    configure(environment.folders())
    sys.exit(main(sys.argv[1:]))
