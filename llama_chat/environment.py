"""The process's environment: the one module that reads the LLAMA_CHAT_* variables, each
into a typed setting checked here (a bad value is one line naming its variable), and that
builds the environment a child process starts with.

A program reads them once where it starts (cli/options.py, a kernel build's own `main`)
and passes the values down; the modules below never look.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path

from llama_chat.errors import DeviceError, LlamaChatError
from llama_chat.options import DataFolders, KernelFamily, KernelOptions, packed_dtype

KERNELS = "LLAMA_CHAT_KERNELS"
KERNEL_VARIANT = "LLAMA_CHAT_KERNEL_VARIANT"
ACTIVATION_BITS = "LLAMA_CHAT_ACTIVATION_BITS"
MATMUL_DTYPE = "LLAMA_CHAT_DTYPE"
KERNEL_DTYPE = "LLAMA_CHAT_KERNEL_DTYPE"
KERNEL_ROWS = "LLAMA_CHAT_KERNEL_ROWS"
PACKED_CACHE_GB = "LLAMA_CHAT_PACKED_CACHE_GB"
CACHE = "LLAMA_CHAT_CACHE"
WEIGHTS = "LLAMA_CHAT_WEIGHTS"
KERNELS_DIR = "LLAMA_CHAT_KERNELS_DIR"
TP_TIMEOUT = "LLAMA_CHAT_TP_TIMEOUT"
# The rank 0 that started a rank on this host (--tp): the rank ends when it is gone.
LEADER = "LLAMA_CHAT_LEADER"
# The kernel library this process loaded, handed to its children (the decode step's
# compiler): they load the same file, even where the sources on disk have changed since.
LOADED_LIBRARY = "LLAMA_CHAT_KERNELS_LIBRARY"
# Marks the processes of a command run under the guard (tools/guard_watch.py), a token a command.
COMMAND_MARK = "LLAMA_CHAT_COMMAND"

# The variables a tool's process (a command run_command runs, an MCP server) gets from the
# chat's environment: where things are, who the user is, how to write text and times; never
# a key, a token or a password. The shell sets PWD itself. --tool-env passes others by name.
TOOL_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                  "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
TOOL_VARIABLE_PREFIXES = ("LC_",)  # the locale's parts: LC_ALL, LC_CTYPE, LC_TIME, ...

# Variables this process hands to every child it starts (child_environment), set as it runs.
_handed_down: dict[str, str] = {}


def kernel_options(environ: Mapping[str, str] = os.environ) -> KernelOptions:
    """The kernel settings the variables give, checked."""
    return KernelOptions(
        family=kernel_family(environ.get(KERNELS, "auto")),
        variant=environ.get(KERNEL_VARIANT),
        activation_bits=activation_bits(environ.get(ACTIVATION_BITS, "16")),
        matmul_dtype=packed_dtype(environ.get(MATMUL_DTYPE), MATMUL_DTYPE),
        kernel_dtype=packed_dtype(environ.get(KERNEL_DTYPE), KERNEL_DTYPE),
        kernel_rows=parsed_kernel_rows(environ.get(KERNEL_ROWS)),
        packed_cache_gb=packed_cache_gb(environ.get(PACKED_CACHE_GB)),
    )


def kernel_family(value: str) -> KernelFamily:
    try:
        return KernelFamily(value.lower())
    except ValueError:
        raise DeviceError(f"{KERNELS}={value!r}: use auto, ours or aten") from None


def activation_bits(value: str) -> int:
    if value not in ("8", "16"):
        raise DeviceError(f"{ACTIVATION_BITS}={value!r}: use 16 or 8")
    return int(value)


def parsed_kernel_rows(value: str | None) -> int | None:
    """None (measured) when unset or empty."""
    if not value:
        return None
    try:
        rows = int(value)
    except ValueError:
        rows = 0
    if rows < 1:
        raise DeviceError(f"{KERNEL_ROWS}={value!r}: give a whole number of tokens, 1 or more")
    return rows


def packed_cache_gb(value: str | None) -> float | None:
    """None (the default bound) when unset or blank."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        gigabytes = float(text)
    except ValueError:
        gigabytes = -1.0
    if not 0 <= gigabytes < float("inf"):
        raise LlamaChatError(f"{PACKED_CACHE_GB}={text!r}: give the packed cache's bound as a number of GB")
    return gigabytes


def folders(environ: Mapping[str, str] = os.environ) -> DataFolders:
    """The folders LLAMA_CHAT_CACHE (or off), LLAMA_CHAT_WEIGHTS and LLAMA_CHAT_KERNELS_DIR name."""
    cache = environ.get(CACHE) or None
    weights = environ.get(WEIGHTS) or None
    kernels = environ.get(KERNELS_DIR) or None
    return DataFolders(
        cache=Path(cache) if cache not in (None, "off") else None,
        cache_off=cache == "off",
        weights=Path(weights) if weights else None,
        kernels=Path(kernels).expanduser() if kernels else None,
    )


def group_timeout(environ: Mapping[str, str] = os.environ) -> timedelta:
    """How long a tensor-parallel group waits for a collective: LLAMA_CHAT_TP_TIMEOUT seconds (60)."""
    value = environ.get(TP_TIMEOUT, "60")
    try:
        return timedelta(seconds=float(value))
    except ValueError:
        raise LlamaChatError(f"{TP_TIMEOUT}={value!r} is not a number of seconds") from None


def launched_place(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """This process's rank and the group's size, as a launcher (--tp, torchrun) gives them
    in its own variables; (0, 1) for a process on its own."""
    return int(environ.get("RANK", "0")), int(environ.get("WORLD_SIZE", "1"))


def leader(environ: Mapping[str, str] = os.environ) -> int | None:
    """The process id of the rank 0 that started this rank on this host (None: started
    otherwise, by a launcher or by hand)."""
    value = environ.get(LEADER)
    if value is None:
        return None
    if not value.isdigit():
        raise LlamaChatError(f"{LEADER}={value!r}: it is set by llama-chat for the ranks it starts; unset it")
    return int(value)


def user_base(variable: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The platform's base folder for a kind of user file ($XDG_CACHE_HOME...), if set to an
    absolute path. The XDG base directory specification has a relative one ignored: it would
    name a folder in whatever folder the program started in (a cloned repository's
    llama-chat/mcp.json read as the user's own)."""
    value = environ.get(variable)
    return value if value and os.path.isabs(value) else None


def compiler() -> str:
    """The C++ compiler a kernel build runs: the build tools' own variable, CXX, which they read too."""
    return os.environ.get("CXX", "c++")


def inherited_library() -> str | None:
    """The kernel library the parent process loaded, handed down to this one."""
    return os.environ.get(LOADED_LIBRARY) or None


def hand_down(variable: str, value: str) -> None:
    """Give `variable` to every child process started from now on."""
    _handed_down[variable] = value


def child_environment(**variables: str) -> dict[str, str]:
    """The environment a child process starts with: this one's, what this process hands
    down (the kernel library it loaded), and `variables`."""
    return {**os.environ, **_handed_down, **variables}


def marked_environment(environment: Mapping[str, str], token: str) -> dict[str, str]:
    """`environment` with the mark of a guarded command's processes, `token`, which every
    process the command starts inherits."""
    return {**environment, COMMAND_MARK: token}


def bears_mark(process_environment: bytes, token: str) -> bool:
    """Whether a process's environment, as /proc/PID/environ gives it, holds the mark `token`."""
    return f"{COMMAND_MARK}={token}".encode() in process_environment.split(b"\0")


def tool_environment(passed: Iterable[str] = (), environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a tool's process starts with: TOOL_VARIABLES and the locale's
    variables where set, and the variables named in `passed` where set."""
    # A value like "() {" is a shell function handed down, the way Shellshock came in.
    kept = {name: value for name, value in environ.items() if is_tool_variable(name) and not value.startswith("()")}
    return kept | {name: environ[name] for name in passed if name in environ}


def is_tool_variable(name: str) -> bool:
    """Whether every tool's process gets variable `name` (where it is set)."""
    return name in TOOL_VARIABLES or name.startswith(TOOL_VARIABLE_PREFIXES)
