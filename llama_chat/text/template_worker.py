"""The process a model's chat template renders in: `python -m llama_chat.text.template_worker`.

A template is a program from a model file. Jinja's sandbox stops it reaching Python's
internals, but not looping for hours or building strings of gigabytes; so it runs in this
process, which the chat can kill (template_runner.py keeps the time) and whose memory is
capped here. Each request and each answer is one JSON object on one line; a request holds
the template's source (compiled once, then kept) and the variables to render it with.
"""

from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO

from jinja2 import Template, TemplateSyntaxError

from llama_chat.parent_watch import end_with_parent
from llama_chat.text.template_sandbox import TemplateRaised, sandboxed_environment

# Address space the renderer may use: real templates need a few MB beside Python's own.
MEMORY_LIMIT_BYTES = 512 << 20
_KEPT_TEMPLATES = 4  # sources compiled and kept (one per loaded model, and a draft's)


# A render past this much CPU time is ended by the system: twice the chat's own limit on
# its time (template_runner.RENDER_SECONDS), for a render whose chat is gone.
RENDER_CPU_SECONDS = 10


def limit_memory(limit: int) -> bool:
    """Cap this process's address space; False where the system has no such limit."""
    try:
        import resource
    except ImportError:  # Windows: the time and output limits still hold
        return False
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return True


class TemplateRenderer:
    """Answers render requests for templates it compiles once and keeps."""

    def __init__(self) -> None:
        self.environment = sandboxed_environment()
        self.templates: dict[str, Template] = {}

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            template = self._template(request["source"])
        except TemplateSyntaxError as error:
            return {"error": "syntax", "line": error.lineno, "message": str(error.message)}
        except MemoryError:
            return {"error": "memory"}
        except Exception as error:  # e.g. an unknown filter found while compiling, or nesting too deep
            return {"error": "invalid", "message": f"{type(error).__name__}: {error}"}
        try:
            return _render(template, request["variables"], request["max_chars"])
        except TemplateRaised as error:
            return {"error": "raised", "message": str(error)}
        except MemoryError:
            return {"error": "memory"}
        except Exception as error:  # the template is foreign code: any failure is the model's
            return {"error": "failed", "message": f"{type(error).__name__}: {error}"}

    def _template(self, source: str) -> Template:
        template = self.templates.get(source)
        if template is None:
            template = self.environment.from_string(source)
            if len(self.templates) >= _KEPT_TEMPLATES:
                self.templates.pop(next(iter(self.templates)))
            self.templates[source] = template
        return template


def limit_cpu(seconds: float) -> None:
    """Let this process use at most `seconds` more of CPU time (then the system ends it): a
    render's own bound, should its chat no longer be there to stop it."""
    try:
        import resource
    except ImportError:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used + seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _render(template: Template, variables: dict[str, Any], max_chars: int) -> dict[str, Any]:
    # Piece by piece, so that a template writing without end is stopped at the limit
    # rather than when memory runs out.
    pieces, total = [], 0
    for piece in template.generate(**variables):
        total += len(piece)
        if total > max_chars:
            return {"error": "output"}
        pieces.append(piece)
    return {"text": "".join(pieces)}


def _write(stream: BinaryIO, answer: dict[str, Any]) -> None:
    stream.write(json.dumps(answer).encode("ascii") + b"\n")
    stream.flush()


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer requests until the chat closes the pipe; after running out of memory, answer
    that and stop (the chat starts a fresh process when it needs one)."""
    renderer = TemplateRenderer()
    _write(answers, {"ready": limit_memory(MEMORY_LIMIT_BYTES)})
    for line in requests:
        limit_cpu(RENDER_CPU_SECONDS)
        answer = renderer.answer(json.loads(line))
        _write(answers, answer)
        if answer.get("error") == "memory":
            return


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the chat that started it: a render never outlives the chat
        end_with_parent(int(sys.argv[1]))
    serve(sys.stdin.buffer, sys.stdout.buffer)
