"""What llama-chat's own tools share in checking a call before it runs: the refusal they
raise among themselves, and a call's arguments held to the tool's schema.

The chat holds the model's arguments to each schema with its grammar engine; the check
here is for the calls that come some other way, so that a tool never meets a value it
cannot use (a KeyError or TypeError would be a traceback, not a line for the model).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from llama_chat.errors import LlamaChatError
from llama_chat.tools.tool import ToolSpec


class Refused(LlamaChatError):
    """A call a tool will not make, with the one line that says why and what to do."""


def refusal_of(check: Callable[[], object]) -> str | None:
    """The line `check` is refused with, or None where it passes."""
    try:
        check()
    except Refused as refused:
        return str(refused)
    return None


def check_arguments(spec: ToolSpec, arguments: Any) -> None:
    """Refuse arguments the spec's schema does not allow. The schemas of llama-chat's own
    tools use only this much: an object of strings and integers, some required, no others,
    strings with a minimum length and integers with a minimum and a maximum."""
    schema, name = spec.parameters, spec.name
    redo = f"call {name} again with the arguments its schema allows"
    if not isinstance(arguments, Mapping):
        raise Refused(f"{name}: its arguments must be a JSON object, not {_shown(arguments)}: {redo}")
    properties = schema["properties"]
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        raise Refused(f"{name}: it takes no argument {_shown(unknown[0])} (only {', '.join(properties)}): {redo}")
    missing = [key for key in schema.get("required", ()) if key not in arguments]
    if missing:
        raise Refused(f"{name}: the argument {missing[0]} is missing: {redo}")
    for key, value in arguments.items():
        if not _allowed(properties[key], value):
            raise Refused(f"{name}: {key} must be {_described(properties[key])}, not {_shown(value)}: {redo}")


def _allowed(rule: Mapping[str, Any], value: Any) -> bool:
    if rule["type"] == "string":
        return isinstance(value, str) and len(value) >= rule.get("minLength", 0)
    if rule["type"] == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and rule.get("minimum", value) <= value <= rule.get("maximum", value))
    raise AssertionError(f"a built-in tool's schema has a property of type {rule['type']}")


def _described(rule: Mapping[str, Any]) -> str:
    if rule["type"] == "string":
        return "a non-empty string" if rule.get("minLength", 0) > 0 else "a string"
    bounds = [f"at least {rule['minimum']}" if "minimum" in rule else "",
              f"at most {rule['maximum']}" if "maximum" in rule else ""]
    return " ".join(["an integer", " and ".join(filter(None, bounds))]).strip()


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:59] + "…"
