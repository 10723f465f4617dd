"""Renders a model's chat template in a separate process, under limits of time, output and memory.

The process (template_worker.py) is started on first use and kept; a render that runs past
its time is ended by killing the process, and the next render starts a new one. A template
that once passed a limit is not run again: every later render refuses at once with the same
line, so a chat never waits twice on a template that hangs.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

from llama_chat.environment import child_environment
from llama_chat.errors import LlamaChatError
from llama_chat.text.chat_format import PICK_ANOTHER
from llama_chat.text.template_worker import MEMORY_LIMIT_BYTES

# Far above what real templates take (a few milliseconds; see docs/models.md), far below a hang.
RENDER_SECONDS = 5.0
# Starting Python and Jinja, on a machine busy loading a model.
START_SECONDS = 60.0
# A template's own text beside placeholders for the messages: a few characters per token of
# context is already more than any real template writes.
OUTPUT_CHARS_PER_TOKEN = 8
MIN_OUTPUT_CHARS = 1 << 20
# Real templates are a few kilobytes; one of megabytes is not a chat template.
MAX_SOURCE_CHARS = 1 << 20


class UnusableTemplateError(LlamaChatError):
    """A chat template that can render no conversation: it does not compile, or it ran past
    a limit of time, output or memory."""


class TemplateRunner:
    """One template's renders, in a worker process of their own."""

    def __init__(self, source: str, origin: str, context_length: int) -> None:
        if len(source) > MAX_SOURCE_CHARS:
            raise UnusableTemplateError(
                f"the chat template of {origin} is {len(source):,} characters long, more than "
                f"the {MAX_SOURCE_CHARS:,} llama-chat accepts; {PICK_ANOTHER}"
            )
        self.source = source
        self.origin = origin
        self.max_chars = max(MIN_OUTPUT_CHARS, OUTPUT_CHARS_PER_TOKEN * context_length)
        self.refusal: str | None = None  # why every render is refused, once a limit was passed
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    def render(self, variables: dict[str, Any]) -> str:
        """The template's output; a LlamaChatError says what went wrong (an
        UnusableTemplateError where no conversation can render, from then on for every render)."""
        with self._lock:
            if self.refusal is None:
                answer = self._ask({"source": self.source, "variables": variables, "max_chars": self.max_chars})
                if "text" in answer:
                    return answer["text"]
                self._raise_for(answer)
            raise UnusableTemplateError(self.refusal)

    def _raise_for(self, answer: dict[str, Any]) -> None:
        """Raise what went wrong; past a limit, also close the worker and keep the refusal."""
        error, about = answer["error"], f"the chat template of {self.origin}"
        if error == "syntax":
            raise UnusableTemplateError(
                f"{about} has a syntax error on line {answer['line']}: {answer['message']}; {PICK_ANOTHER}"
            )
        if error == "invalid":
            raise UnusableTemplateError(f"{about} is invalid: {answer['message']}; {PICK_ANOTHER}")
        if error == "raised":
            raise LlamaChatError(f"{about} rejected the conversation: {answer['message']}")
        if error == "failed":
            raise LlamaChatError(f"{about} failed: {answer['message']}; {PICK_ANOTHER}")
        limits = {
            "output": f"wrote more than {self.max_chars:,} characters",
            "memory": f"needed more than {MEMORY_LIMIT_BYTES >> 20} MB of memory",
            "time": f"ran for more than {RENDER_SECONDS:g} s",
            "stopped": "crashed its renderer",
        }
        self.close()
        self.refusal = f"{about} {limits[error]}, so llama-chat stopped it; {PICK_ANOTHER}"

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._worker is None:
            self._worker = _Worker()
            weakref.finalize(self, self._worker.stop)  # no worker outlives its template
        try:
            answer = self._worker.ask(request, RENDER_SECONDS)
        except BaseException:  # Ctrl-C, or a request that could not be sent: start afresh next time
            self.close()
            raise
        return answer if answer is not None else {"error": "stopped"}


class _Worker:
    """The worker process and the thread that reads its answers."""

    def __init__(self) -> None:
        package_parent = str(Path(__file__).resolve().parents[2])  # where llama_chat is importable from
        environment = child_environment(PYTHONPATH=os.pathsep.join(
            [package_parent, *filter(None, [os.environ.get("PYTHONPATH")])]))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "llama_chat.text.template_worker", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment,
                # Its own session: Ctrl-C in the terminal is the chat's to handle, not the worker's.
                start_new_session=os.name == "posix",
            )
        except OSError as error:
            raise LlamaChatError(f"could not start the chat template's renderer: {error}") from None
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="template-answers").start()
        ready = self._next(START_SECONDS)
        if ready is None or "ready" not in ready:
            self.stop()
            raise LlamaChatError("the chat template's renderer did not start (is jinja2 installed?)")

    def ask(self, request: dict[str, Any], seconds: float) -> dict[str, Any] | None:
        """The answer; {"error": "time"} when none came in time (the process is then
        stopped); None if the process ended."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode("ascii") + b"\n")
            self.process.stdin.flush()
        except OSError:
            return None
        return self._next(seconds)

    def _next(self, seconds: float) -> dict[str, Any] | None:
        try:
            return self.answers.get(timeout=seconds)
        except queue.Empty:
            self.stop()
            return {"error": "time"}

    def _read(self) -> None:
        # The only reader of stdout, so the only one to close it (after the process ends).
        assert self.process.stdout is not None
        with self.process.stdout as answers:
            for line in answers:
                try:
                    self.answers.put(json.loads(line))
                except ValueError:  # cut off by a kill
                    break
        self.answers.put(None)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:  # a request still buffered for a process that has ended
                pass
