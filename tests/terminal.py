"""A command on a pseudo-terminal, for tests that need a real terminal (echo, Ctrl-C)."""

import os
import pty
import select
import signal
import time
from pathlib import Path


class Terminal:
    """A command on a pseudo-terminal, read as a person would see it."""

    def __init__(self, command: list[str], environment: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ.update(environment)
            # As a shell starts a job in the foreground: Ctrl-C and Ctrl-\ act. (A run of the
            # tests started in the background inherits them ignored, and so would the command.)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGQUIT, signal.SIG_DFL)
            os.execv(command[0], command)
        self.output = b""

    def read_until(self, marker: bytes, seconds: float, after: int = 0) -> bool:
        """Read until `marker` shows (past byte `after` of the output) or time is up."""
        deadline = time.monotonic() + seconds
        while marker not in self.output[after:] and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    return False
                if not data:
                    return False
                self.output += data
                if b"\x1b[6n" in data:  # answer prompt_toolkit's cursor position request
                    os.write(self.fd, b"\x1b[1;1R")
        return marker in self.output[after:]

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def children(self) -> list[int]:
        return [int(pid) for pid in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]

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
