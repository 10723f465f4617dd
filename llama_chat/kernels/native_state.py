"""Where llama-chat's kernels stand in this process: asked (`status`, which starts and
loads nothing), or brought about (`load_or_build`: the build on disk loaded, or one started).

Without a compiler, or when a build fails, PyTorch's kernels run and the status says why
in one line. A kept build that is not the file its build wrote (truncated, changed) is
removed and built again the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llama_chat.kernels import native, native_build
from llama_chat.kernels.native_files import (
    build_directory, check_kept, forget_failure, library_file, recent_failure,
)
from llama_chat.options import KernelFamily, KernelOptions


@dataclass(frozen=True)
class NativeStatus:
    loaded: bool
    detail: str  # the variants this CPU runs, or why the kernels are not in use
    # Off for want of something on this machine (a compiler, ninja, a build that failed or
    # does not load), not by a choice or for a build under way: worth a line at start-up.
    wanting: bool = False


FORCED_OFF = NativeStatus(False, "PyTorch's kernels forced (LLAMA_CHAT_KERNELS=aten)")
CACHE_OFF = NativeStatus(False, "not built: the cache is off (LLAMA_CHAT_CACHE=off)")
BUILDING = "building in the background (PyTorch's kernels meanwhile)"


def _in_use(prefix: str = "") -> NativeStatus:
    return NativeStatus(True, prefix + "variants here: " + ", ".join(native.runnable_variants()))


def _failed(directory: Path, line: str) -> NativeStatus:
    return NativeStatus(False, f"build failed: {line} (remove {directory} to try again now)", wanting=True)


def status(kernels: KernelOptions = KernelOptions()) -> NativeStatus:
    """The kernels' state, as a query: nothing is built, loaded or removed."""
    if kernels.family is KernelFamily.ATEN:
        return FORCED_OFF
    if native.loaded():
        return _in_use()
    directory = build_directory()
    if directory is None:
        return CACHE_OFF
    if native_build.build_running():
        return NativeStatus(False, BUILDING)
    library = library_file(directory)
    error = native.load_error(library)
    if error:
        return NativeStatus(False, error, wanting=True)
    if library.exists():
        return NativeStatus(False, f"built, not loaded yet ({library})")
    failure = recent_failure(directory)
    if failure is not None:
        return _failed(directory, failure)
    reason = native_build.missing_tools()
    return NativeStatus(False, reason, wanting=True) if reason else NativeStatus(False, "not built yet")


def load_or_build(kernels: KernelOptions = KernelOptions(), wait: bool = False) -> NativeStatus:
    """Load the kernels if a build is on disk; otherwise start building them (in the
    background, or waited for with `wait`) and say so. Never raises: PyTorch's kernels are
    the fallback."""
    if kernels.family is KernelFamily.ATEN:
        return FORCED_OFF
    directory = build_directory()
    if directory is None:
        return CACHE_OFF
    library = library_file(directory)
    # Truncated or changed: built again below.
    damaged = f"{library.name} was not the file its build wrote, and was removed; " if check_kept(library) else ""
    if library.exists():
        error = native.load_kept(library)
        return NativeStatus(False, error, wanting=True) if error else _in_use()
    failure = recent_failure(directory)
    if failure is not None:
        return _failed(directory, failure)
    forget_failure(directory)
    reason = native_build.missing_tools()
    if reason:
        return NativeStatus(False, damaged + reason, wanting=True)
    native_build.start_build(directory)
    if not wait:
        return NativeStatus(False, damaged + BUILDING)
    errors = native_build.wait_for_build()
    if not library.exists():
        return NativeStatus(False, damaged + f"build failed: {native.output_line(errors)}", wanting=True)
    error = native.load_kept(library)
    if error:
        return NativeStatus(False, error, wanting=True)
    return _in_use(f"{damaged}built again; " if damaged else "")


def load_finished_build() -> bool:
    """Load the library a build this process started in the background has written, the
    first time this is asked once it is there; whether it loaded now. The build's process
    is collected either way."""
    started = native_build.started_build()
    if started is None:
        return False
    directory, child = started
    child.poll()  # collected once it has ended
    if native.loaded() or not library_file(directory).exists():  # written whole, or not at all
        return False
    return load_or_build().loaded
