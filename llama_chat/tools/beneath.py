"""Opening what lies beneath a folder, at the moment of use, through the folder's descriptor:
no name on the way may be a link, and nothing may lead out of the folder.

Where the kernel has `openat2` (Linux 5.6 on), it resolves the whole path itself, with
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS. Elsewhere the path is walked a
name at a time from the folder's descriptor, each folder opened with O_NOFOLLOW and
O_DIRECTORY, the last name with O_NOFOLLOW. Either way a name swapped for a link between a
check and the use makes the open fail (ELOOP, ENOTDIR, EXDEV); it never leads elsewhere.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
from collections.abc import Callable, Sequence

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_OPENAT2 = {"x86_64": 437, "aarch64": 437}  # the system call's number, where it is known
FOLDER_PATH = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY  # a folder to go through (no read needed)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.cache
def _syscall() -> Callable[..., int] | None:
    """The C library's syscall(), which sets errno; None where there is none to call."""
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall  # use_errno: ctypes keeps errno only so
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


def _openat2(folder: int, path: str, flags: int) -> int:
    number, syscall = _OPENAT2.get(platform.machine()), _syscall()
    if number is None or syscall is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path)
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE)
    descriptor = syscall(ctypes.c_long(number), ctypes.c_int(folder), ctypes.c_char_p(os.fsencode(path)),
                         ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if descriptor < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return descriptor


def kernel_resolves_beneath() -> bool:
    """Whether the kernel here resolves paths beneath a folder (openat2 with the flags above);
    not where it is too old, or where a sandbox refuses the call (ENOSYS, EPERM)."""
    root = os.open("/", FOLDER_PATH | os.O_CLOEXEC)
    try:
        os.close(_openat2(root, ".", FOLDER_PATH))
    except OSError:
        return False
    finally:
        os.close(root)
    return True


def open_beneath(folder: int, names: Sequence[str], flags: int, openat2: bool) -> int:
    """A descriptor for `names` (one name a step, none: the folder itself) beneath the
    folder open as `folder`, opened with `flags`, by openat2 or by the walk. OSError where a
    name is missing, or is a link now. `flags` must not be O_PATH without O_DIRECTORY (that
    would open a last name that is a link as the link)."""
    for name in names:
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"{name!r} is no name of a file or folder")
    if openat2:
        return _openat2(folder, "/".join(names) or ".", flags | os.O_NOFOLLOW)
    current = folder
    try:
        for name in names[:-1]:
            step = os.open(name, FOLDER_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            if current != folder:
                os.close(current)
            current = step
        return os.open(names[-1] if names else ".", flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
    finally:
        if current != folder:
            os.close(current)


def open_folder(path: os.PathLike[str] | str) -> int:
    """A descriptor of the folder the tools may use at `path` (resolved when it was given),
    to open what lies beneath it through; OSError where it is no folder now."""
    return os.open(path, FOLDER_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
