"""The chat's side of a command run under the guard (tools/guard.py): the command started
with the environment given and a mark of its own, watched while it runs, and ended, with
everything it started, by the chat itself.

The command runs as the same user as its guard, so it could stop or kill it: the chat
never relies on the guard to end a run, but kills the guard and every process below it
itself, and a guard stopped (or held by a tracer) or killed by anyone but the chat is
noticed at the next look. The chat is a subreaper while a command runs, so what a killed
guard held comes to the chat; it tells those from its other children by the mark in their
environment, by having seen them below the guard at its last look, or, for one that
cleared its environment since, by its start after that look.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Mapping

from llama_chat.environment import bears_mark, marked_environment
from llama_chat.tools.guard import children, descendants, guarded, kill_trees, set_subreaper, start_time, state

_COLLECT_SECONDS = 2.0  # for processes killed to be gone; one the kernel holds (a stuck disk) is left to it
_COLLECT_TICK = 0.005


class GuardedCommand:
    """`command` run under the guard, in `cwd`, with `environment` and nothing else of the
    chat's; its input empty, its output and errors together in `output`."""

    def __init__(self, command: list[str], cwd: str, environment: Mapping[str, str]) -> None:
        self._token = secrets.token_hex(8)  # the mark in the environment of the command's processes
        self._seen: dict[int, int] = {}  # pid: start time, of the processes below the guard at the last look
        self._looked = _now_in_ticks()  # when the guard was last seen alive, in /proc's start-time ticks
        set_subreaper(True)
        try:
            self.process = subprocess.Popen(
                guarded(command), cwd=cwd, env=marked_environment(environment, self._token),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except BaseException:
            set_subreaper(False)
            raise
        self.output = self.process.stdout

    def guard_lost(self) -> bool:
        """Whether the guard was stopped, held by a tracer or killed: by the command, since
        the chat has not ended it. Notes the processes below it, for end()."""
        if self.process.poll() is not None:
            return self.process.returncode < 0  # killed; a guard that ended itself gives the command's status
        self._looked = _now_in_ticks()
        self._seen = {pid: self._seen.get(pid) or start_time(pid) for pid in descendants(self.process.pid)}
        return state(self.process.pid) in ("T", "t")

    def end(self) -> None:
        """Kill the guard and every process of the command's still running, and collect them."""
        killed_guard = self.process.poll() is not None and self.process.returncode < 0
        roots = [pid for pid in children(os.getpid()) if self._ours(pid, killed_guard)]
        ended = {pid for root in roots for pid in (root, *descendants(root))}  # those that ended by themselves too
        ended |= set(kill_trees(roots))
        self.process.wait()
        self._collect(ended - {self.process.pid})
        set_subreaper(False)

    def _ours(self, pid: int, killed_guard: bool) -> bool:
        """Whether the chat's child `pid` is the guard or a process of the command's. Once the
        guard was killed, a child started since it was last seen alive is taken for one (one
        the chat itself started in that moment would be too: the cost of a command that
        kills its guard)."""
        started = start_time(pid)
        if pid == self.process.pid or self._seen.get(pid, -1) == started:
            return True
        if killed_guard and started is not None and started >= self._looked:
            return True
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                return bears_mark(environ.read(), self._token)
        except OSError:  # gone, or not the user's to read
            return False

    def _collect(self, ended: set[int]) -> None:
        """Collect the command's processes that are the chat's now (orphaned while it was a
        subreaper), each once it is gone."""
        left = set(ended)
        deadline = time.monotonic() + _COLLECT_SECONDS
        while left and time.monotonic() < deadline:
            for pid in list(left):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        left.discard(pid)
                except ChildProcessError:  # not the chat's child: gone, or on its way to the chat
                    if state(pid) is None:
                        left.discard(pid)
            if left:
                time.sleep(_COLLECT_TICK)


def _now_in_ticks() -> int:
    """The time since boot in the clock ticks of /proc's start times, rounded down."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
