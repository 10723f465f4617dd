"""A command on a pseudo-terminal, for tests that need a real terminal (echo, Ctrl-C)."""

import os
import pty
import select
import signal
import termios
import time
from collections.abc import Callable
from pathlib import Path

from .signals import as_a_foreground_job


class Terminal:
    """A command on a pseudo-terminal, read as a person would see it."""

    def __init__(self, command: list[str], environment: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ.update(environment)
            as_a_foreground_job()  # Ctrl-C, Ctrl-\ and a closed terminal act (see signals.py)
            os.execv(command[0], command)
        self.output = b""

    def read_until(self, marker: bytes, seconds: float, after: int = 0) -> bool:
        """Read until `marker` shows (past byte `after` of the output) or time is up."""
        return self.wait_for(lambda: marker in self.output[after:], seconds)

    def wait_for(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Read the output until `condition()` holds or time is up (or the output ends)."""
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            if not self._read(timeout=0.01):
                break
        return condition()

    def _read(self, timeout: float) -> bool:
        """Add what the command has written within `timeout` s; False once the output has ended."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 4096)
        except OSError:
            return False
        self.output += data
        if b"\x1b[6n" in data:  # answer prompt_toolkit's cursor position request
            os.write(self.fd, b"\x1b[1;1R")
        return bool(data)

    def read_prompt(self, seconds: float, after: int) -> bool:
        """Read until a prompt that started past byte `after` reads keys: it turns bracketed
        paste on once it holds the terminal in raw mode."""
        return self.read_until(b"\x1b[?2004h", seconds, after)

    def ctrl_c_is_a_signal(self) -> bool:
        """Whether Ctrl-C typed now is a signal (the chat's own mode, a reply or a command
        running) rather than a key (a prompt's raw mode)."""
        return bool(termios.tcgetattr(self.fd)[3] & termios.ISIG)

    def pause(self) -> None:
        """Stop the command (SIGSTOP) and return once it has stopped, with all it wrote read."""
        os.kill(self.pid, signal.SIGSTOP)
        os.waitpid(self.pid, os.WUNTRACED)
        while select.select([self.fd], [], [], 0)[0] and self._read(timeout=0):
            pass

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def answer(self, keys: bytes, marker: bytes, seconds: float) -> bytes:
        """Type `keys` and read until `marker` shows in what follows; returns that output."""
        sent = len(self.output)
        self.type(keys)
        assert self.read_until(marker, seconds, after=sent), self.text()
        return self.output[sent:]

    def children(self) -> list[int]:
        """The chat's child processes, leaving out its chat template's renderer."""
        pids = [int(pid) for pid in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]
        return [pid for pid in pids if b"template_worker" not in _command_line(pid)]

    def exit_code(self, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.read_until(b"\0never", 0.2)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"still running after {seconds} s: {self.text()}")

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # it has ended
        return b""
