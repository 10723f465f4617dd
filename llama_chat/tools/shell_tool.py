"""run_command: a shell command run in the working folder, under the guard (tools/guard.py),
within a time limit and an output cap, with an environment that holds none of the chat's
secrets.

However a run ends (the command's end, the time limit, the cap, Ctrl-C, a guard that the
command stopped or killed), the chat itself ends whatever of the command is left
(tools/guard_watch.py): nothing the command started goes on, however it detached, and no
limit waits on the guard. The run does not wait for something left behind to close the
output.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Mapping
from typing import Any

from llama_chat.environment import is_tool_variable, tool_environment
from llama_chat.tools.checks import Refused, check_arguments, refusal_of
from llama_chat.tools.folders import Folders
from llama_chat.tools.guard_watch import GuardedCommand
from llama_chat.tools.tool import ToolResult, ToolSpec

SECONDS = 30.0  # how long a command may run, by default
OUTPUT_BYTES = 32 * 1024  # how much output it may give, by default
SHELL = "/bin/sh"
_TICK_SECONDS = 0.1  # how often the guard is looked at
_CHUNK = 1 << 16


class RunCommand:
    """run_command: `command` run by /bin/sh in the working folder, stopped after `seconds`
    or when its output passes `output_bytes`, given `environment` (by default what every
    tool's process gets: environment.tool_environment())."""

    def __init__(self, folders: Folders, seconds: float = SECONDS, output_bytes: int = OUTPUT_BYTES,
                 environment: Mapping[str, str] | None = None) -> None:
        self.folders = folders
        self.seconds = seconds
        self.output_bytes = output_bytes
        self.environment = tool_environment() if environment is None else dict(environment)
        self.spec = ToolSpec(
            name="run_command",
            description=(
                f"Run a shell command with {SHELL} in the working folder, with no input, and give its output "
                f"(standard output and errors together) and exit status. The user says yes to each command first. "
                f"It is stopped, with everything it started, after {seconds:g} seconds or once its output passes "
                f"{_size(output_bytes)}; nothing it starts goes on after it ends, in the background or detached. "
                f"{_environment_note(self.environment)}"
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
            started = GuardedCommand([SHELL, "-c", command], self.folders.working, self.environment)
        except OSError as error:
            return ToolResult(f"run_command: cannot start {SHELL} in {self.folders.working} ({error.strerror}): "
                              "tell the user", is_error=True)
        try:
            output, passed = self._collect(started)
        finally:  # however it ended (Ctrl-C too), nothing of the command goes on
            started.end()
            started.output.close()
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
        if passed == "guard":
            return ToolResult(f"{text}[ended, with all it started, as it stopped or killed the process that watches "
                              "it (its parent): leave that process alone]", is_error=True)
        return ToolResult(f"{text}[exit status {started.process.returncode}{'' if text else ', no output'}]")

    def _checked(self, arguments: Mapping[str, Any]) -> str:
        check_arguments(self.spec, arguments)
        command = arguments["command"]
        if not command.strip():
            raise Refused("run_command: the command is empty: give a command line")
        if "\0" in command:
            raise Refused("run_command: the command has a NUL character, which no command line can hold: "
                          "give it without one")
        return command

    def _collect(self, command: GuardedCommand) -> tuple[bytes, str | None]:
        """The command's output, and which limit it passed ("time", "output"), if one, or
        "guard" where its guard was stopped or killed; with none, the guard has ended."""
        deadline = time.monotonic() + self.seconds
        output = bytearray()
        descriptor = command.output.fileno()
        os.set_blocking(descriptor, False)
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while True:
                ended = command.process.poll() is not None  # first: what it gave before it ended is read below
                if command.guard_lost():
                    return bytes(output), "guard"
                chunk = _read(descriptor) if selector.get_map() else None
                if chunk:
                    output += chunk
                    if len(output) > self.output_bytes:
                        return bytes(output[:self.output_bytes]), "output"
                elif chunk == b"":  # the output closed; the guard is looked at until it ends
                    selector.unregister(descriptor)
                if ended and not chunk:  # done, and its output read (what it left open is not waited for)
                    return bytes(output), None
                left = deadline - time.monotonic()
                if left <= 0:
                    return bytes(output), "time"
                if chunk is None and selector.get_map():
                    selector.select(min(left, _TICK_SECONDS))
                elif chunk is None:
                    time.sleep(min(left, _TICK_SECONDS))


def _read(descriptor: int) -> bytes | None:
    """What the output holds now: b"" once it has closed, None while it is open and empty."""
    try:
        return os.read(descriptor, _CHUNK)
    except BlockingIOError:
        return None


def _environment_note(environment: Mapping[str, str]) -> str:
    """What the description says of a command's environment: the variables the user passed
    by name, besides those every tool's process gets."""
    passed = sorted(name for name in environment if not is_tool_variable(name))
    if not passed:
        return "Its environment holds PATH, HOME, the locale and the like, none of the user's keys or tokens."
    return (f"Its environment holds PATH, HOME, the locale and the like, and {', '.join(passed)} (passed by the "
            "user); none of the user's other keys or tokens.")


def _size(count: int) -> str:
    return f"{count // 1024} KiB" if count % 1024 == 0 else f"{count:,} bytes"
