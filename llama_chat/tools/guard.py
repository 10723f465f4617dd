"""A command of someone else's (an MCP server, a shell command a tool runs) started so that
it ends with the chat, however the chat ends.

The command is started through this module: `python -m llama_chat.tools.guard PARENT --
COMMAND...`. The guard and the command each get a session of their own (so Ctrl-C in the
terminal reaches the chat alone), and the guard waits. When the command ends, the guard
kills what the command left running in its process group and ends with the command's exit
status. When the chat that started it (PARENT) is gone, or the guard is told to stop
(SIGTERM, SIGHUP), it kills the command's group: the command and whatever it started. The
command's standard streams are the guard's own; the guard lets go of its copies, so a pipe
closes when the command's side does.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from llama_chat.parent_watch import POLL_SECONDS

CANNOT_START = 127  # the shell's status for a command that could not be run


def guarded(command: list[str]) -> list[str]:
    """The command line that runs `command` under the guard of this process."""
    return [sys.executable, "-P", "-m", "llama_chat.tools.guard", str(os.getpid()), "--", *command]


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # nothing of it is left
        pass


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as shells say


def main(arguments: list[str]) -> int:
    if len(arguments) < 3 or arguments[1] != "--":
        print("usage: python -m llama_chat.tools.guard PARENT -- COMMAND...", file=sys.stderr)
        return 2
    parent, command = int(arguments[0]), arguments[2:]
    if os.getsid(0) != os.getpid():
        os.setsid()
    # Held back until the guard can act on them: a stop that came between the fork and the
    # handlers would end the guard and leave the command running unwatched.
    stops = {signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        os.setsid()
        try:
            os.execvp(command[0], command)
        except OSError as error:
            os.write(2, f"cannot run {command[0]}: {error.strerror}\n".encode())
            os._exit(CANNOT_START)

    def stop(*_: object) -> None:
        _kill_group(child)
        os._exit(128 + signal.SIGTERM)

    for stop_signal in stops:
        signal.signal(stop_signal, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    # The command holds the streams now; the guard keeps none of them open.
    quiet = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(quiet, stream)
    while True:
        finished, wait_status = os.waitpid(child, os.WNOHANG)
        if finished:
            _kill_group(child)  # what the command left behind
            return _status(wait_status)
        if os.getppid() != parent:
            stop()
        time.sleep(POLL_SECONDS / 5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
