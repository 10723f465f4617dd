"""The time a file tool's call may take, the same as a command's (`--tool-timeout`).

A file tool works in the chat's own process, so it is not stopped from outside: its loops
(lines passed over, entries listed, files searched) ask whether the time has passed, and
stop there with a line saying so.
"""

from __future__ import annotations

import time

from llama_chat.tools.checks import Refused

SECONDS = 30.0  # how long a call may take, by default


class TimeLimit:
    """The time left to one call of `tool`, started when the limit is made."""

    def __init__(self, tool: str, seconds: float) -> None:
        self.tool = tool
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.deadline

    def check(self) -> None:
        """Refused (one line for the model) once the time has passed."""
        if self.passed():
            raise Refused(f"{self.tool}: stopped after {self.seconds:g} s, the time limit for a tool call: "
                          "ask for less at a time")
