"""The Jinja environment a model's chat template renders in: sandboxed, with Hugging Face's settings.

A template comes from a model file, so it is foreign code: the sandbox refuses every unsafe
attribute, and the globals are the few that Hugging Face's renderer offers templates.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: Hugging Face marks the assistant's part of a
    training example with it; for a prompt it only renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class Sandbox(ImmutableSandboxedEnvironment):
    """A sandbox that stops at the first reach for an unsafe attribute (`__class__`, private
    names, list.append...) instead of rendering it as empty text."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


class TemplateRaised(TemplateError):
    """The template called raise_exception(message)."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's version: unlike Jinja's it does not HTML-escape "<" and ">".
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(pattern: str) -> str:
    return datetime.now().strftime(pattern)


def sandboxed_environment() -> Sandbox:
    # The settings Hugging Face renders chat templates with, so templates come out the same.
    environment = Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, "jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment
