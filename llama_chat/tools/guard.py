"""A command of someone else's (an MCP server, a shell command a tool runs) started so that
it ends with the chat, however the chat ends, and takes everything it started with it,
however that detached.

The command is started through this file, run by its path (`python -I -S .../guard.py
PARENT -- COMMAND...`): the guard imports nothing but the standard library, so the
environment it is given can be the command's alone. The guard and the command each get a
session of their own (so Ctrl-C in the terminal reaches the chat alone), and the guard
waits. The command's standard streams are the guard's own; the guard lets go of its
copies, so a pipe closes when the command's side does.

The guard is a child subreaper: whatever the command's processes leave behind when they
end (a double fork, nohup, setsid, setpgid) becomes the guard's, so every process of the
command stays below it, and the guard kills them all. When the command ends, the guard
ends what it left running and exits with the command's status; when the chat that started
it (PARENT) is gone, or the guard is told to stop (SIGTERM, SIGHUP), it ends the command
and everything below it. The command runs as the same user, so it could stop or kill its
guard: the chat's side (tools/guard_watch.py) looks out for that.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import NoReturn

CANNOT_START = 127  # the shell's status for a command that could not be run
POLL_SECONDS = 0.05  # how soon the guard notices that its chat is gone
_PR_SET_CHILD_SUBREAPER = 36
_ENDED = ("Z", "X", None)  # a zombie, a process going, or one gone: nothing left to kill
# Python ignores these for itself; a command gets them as any program starts with them.
_IGNORED_BY_PYTHON = (signal.SIGPIPE, signal.SIGXFSZ)


def guarded(command: list[str]) -> list[str]:
    """The command line that runs `command` under the guard of this process."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), "--", *command]


# Processes, as /proc shows them


def children(pid: int) -> list[int]:
    """The processes whose parent is process `pid` (any of its threads); none once it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as listing:
                found += map(int, listing.read().split())
        except OSError:  # the thread ended
            continue
    return found


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (its state first), or None
    once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def state(pid: int) -> str | None:
    """The process's state as the kernel gives it (R, S, D, T stopped, t held by a tracer,
    Z a zombie, ...), or None once it is gone."""
    fields = _stat(pid)
    return None if fields is None else fields[0]


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: with its pid, what tells it
    from a later process given the same pid."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def descendants(pid: int) -> list[int]:
    """Every process below process `pid`: its children, theirs, and so on."""
    found, waiting = [], children(pid)
    while waiting:
        found.append(waiting.pop())
        waiting += children(found[-1])
    return found


def kill_trees(roots: list[int]) -> list[int]:
    """Kill the processes `roots` and every process below them; the processes signalled.
    Each is stopped first, over and over until no new one shows: a stopped process cannot
    start another, so none slips out between the look and the kill. A process the user
    may not signal (one that gained privileges) is left."""
    stopped: list[int] = []
    seen: set[int] = set()
    while True:
        trees = dict.fromkeys(pid for root in roots for pid in (root, *descendants(root)))
        new = [pid for pid in trees if pid not in seen and state(pid) not in _ENDED]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return stopped


def set_subreaper(on: bool) -> None:
    """Make this process a child subreaper, or no longer one: a process orphaned below it
    becomes its child rather than init's."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


# The guard


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as shells say


def _exec(command: list[str]) -> NoReturn:
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for ignored in _IGNORED_BY_PYTHON:
        signal.signal(ignored, signal.SIG_DFL)
    os.setsid()
    try:
        os.execvp(command[0], command)
    except OSError as error:
        os.write(2, f"cannot run {command[0]}: {error.strerror}\n".encode())
    os._exit(CANNOT_START)


def _end_all_below() -> None:
    """Kill every process below the guard, and collect them: a subreaper gets what its
    descendants leave behind, so this is done once it has no child left (or none it may
    signal)."""
    while True:
        killed = kill_trees(children(os.getpid()))
        try:
            collected = 0
            while os.waitpid(-1, os.WNOHANG)[0]:
                collected += 1
        except ChildProcessError:
            return
        if not killed and not collected:
            return  # only processes the user may not signal are left
        time.sleep(0.01)  # for those killed to go


def main(arguments: list[str]) -> int:
    if len(arguments) < 3 or arguments[1] != "--":
        print("usage: python -I -S guard.py PARENT -- COMMAND...", file=sys.stderr)
        return 2
    parent, command = int(arguments[0]), arguments[2:]
    if os.getsid(0) != os.getpid():
        os.setsid()
    set_subreaper(True)
    # Held back until the guard can act on them: a stop that came between the fork and the
    # handlers would end the guard and leave the command running unwatched. A child's end
    # stays held: the guard waits for it.
    stops = {signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops | {signal.SIGCHLD})
    child = os.fork()
    if child == 0:
        _exec(command)

    def stop(*_: object) -> NoReturn:
        _end_all_below()
        os._exit(128 + signal.SIGTERM)

    for stop_signal in stops:
        signal.signal(stop_signal, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    # The command holds the streams now; the guard keeps none of them open.
    quiet = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(quiet, stream)
    while True:
        pid, wait_status = os.waitpid(-1, os.WNOHANG)  # the command, or what was orphaned below the guard
        if pid == child:
            _end_all_below()  # what the command left behind
            return _status(wait_status)
        if pid:
            continue
        if os.getppid() != parent:
            stop()
        signal.sigtimedwait({signal.SIGCHLD}, POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
