"""run_command: a shell command run in the working folder, under the guard (tools/guard.py),
within a time limit and an output cap.

Whatever way a run ends early (the time limit, the cap, Ctrl-C), the guard is told to stop
(SIGTERM): it kills the command's process group, the command and what it started, and
ends. SIGKILL would end the guard alone and leave the command running unwatched. What a
command started outside its group (with setsid, say) is beyond the guard's reach; the run
ends when the command does, without waiting for that to close the output.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from llama_chat.tools.checks import Refused, check_arguments, refusal_of
from llama_chat.tools.folders import Folders
from llama_chat.tools.guard import guarded
from llama_chat.tools.tool import ToolResult, ToolSpec

SECONDS = 30.0  # how long a command may run, by default
OUTPUT_BYTES = 32 * 1024  # how much output it may give, by default
SHELL = "/bin/sh"
_STOP_SECONDS = 5.0  # how long the guard has to end the command once told, before it is killed itself
_TICK_SECONDS = 0.1  # how often the guard is looked at while the output stays open
_CHUNK = 1 << 16


class RunCommand:
    """run_command: `command` run by /bin/sh in the working folder, stopped after `seconds`
    or when its output passes `output_bytes`."""

    def __init__(self, folders: Folders, seconds: float = SECONDS, output_bytes: int = OUTPUT_BYTES) -> None:
        self.folders = folders
        self.seconds = seconds
        self.output_bytes = output_bytes
        self.spec = ToolSpec(
            name="run_command",
            description=(
                f"Run a shell command with {SHELL} in the working folder, with no input, and give its output "
                f"(standard output and errors together) and exit status. The user says yes to each command first. "
                f"It is stopped, with everything it started, after {seconds:g} seconds or once its output passes "
                f"{_size(output_bytes)}; nothing it starts goes on after it ends."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "command": {"type": "string", "minLength": 1, "description": "The command line, as for sh -c."},
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        )

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        return refusal_of(lambda: self._checked(arguments))

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        return f"in {self.folders.working}, for at most {self.seconds:g} s and {_size(self.output_bytes)} of output"

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        try:
            command = self._checked(arguments)
        except Refused as refused:
            return ToolResult(str(refused), is_error=True)
        try:
            process = subprocess.Popen(guarded([SHELL, "-c", command]), cwd=self.folders.working,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as error:
            return ToolResult(f"run_command: cannot start {SHELL} in {self.folders.working} ({error.strerror}): "
                              "tell the user", is_error=True)
        try:
            output, passed = self._collect(process)
        finally:  # a limit passed, or Ctrl-C: nothing of the command goes on
            _stop(process)
            process.stdout.close()
        text = output.decode("utf-8", "replace")
        if text and not text.endswith("\n"):
            text += "\n"
        if passed == "time":
            return ToolResult(f"{text}[stopped after {self.seconds:g} s, the time limit for a command, with all it "
                              "started: make it quicker, or ask the user to run it]", is_error=True)
        if passed == "output":
            return ToolResult(f"{text}[stopped once its output passed {_size(self.output_bytes)}, the most a command "
                              "may give, with all it started; its first output is above: make it give less (pipe "
                              "it through head or grep, say)]", is_error=True)
        return ToolResult(f"{text}[exit status {process.returncode}{'' if text else ', no output'}]")

    def _checked(self, arguments: Mapping[str, Any]) -> str:
        check_arguments(self.spec, arguments)
        command = arguments["command"]
        if not command.strip():
            raise Refused("run_command: the command is empty: give a command line")
        if "\0" in command:
            raise Refused("run_command: the command has a NUL character, which no command line can hold: "
                          "give it without one")
        return command

    def _collect(self, process: subprocess.Popen[bytes]) -> tuple[bytes, str | None]:
        """The command's output, and which limit it passed ("time", "output"), if one; at
        its end the guard has ended too, where no limit was passed."""
        deadline = time.monotonic() + self.seconds
        output = bytearray()
        descriptor = process.stdout.fileno()
        os.set_blocking(descriptor, False)
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while True:
                ended = process.poll() is not None  # looked at first: what it gave before it ended is read below
                try:
                    chunk = os.read(descriptor, _CHUNK)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    output += chunk
                    if len(output) > self.output_bytes:
                        return bytes(output[:self.output_bytes]), "output"
                elif chunk == b"" or ended:  # the output closed, or the command is done and its output read
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return bytes(output), "time"
                if chunk is None:
                    selector.select(min(left, _TICK_SECONDS))
        try:
            process.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            return bytes(output), "time"
        return bytes(output), None


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End the guard, and through it the command's group, unless it has ended already."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _size(count: int) -> str:
    return f"{count // 1024} KiB" if count % 1024 == 0 else f"{count:,} bytes"
