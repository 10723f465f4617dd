"""An MCP server's tools as llama-chat's tools: its tool list checked (names, schemas,
sizes: the server is a stranger), and a tools/call result turned into text for the model."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_TOOLS = 128  # of one server: more would crowd the model's context anyway
MAX_DESCRIPTION_CHARS = 4096
MAX_SCHEMA_CHARS = 64 << 10
MAX_SCHEMA_DEPTH = 32  # schemas are walked (here, by the grammar engine) once per level
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # the MCP specification's rule for a tool's name

_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_ONE_SCHEMA = ("additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
               "contains", "propertyNames", "not", "if", "then", "else")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_TABLES = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class McpTool:
    """A tool of an MCP server's. It has no checks of its own (refusal and preview are None):
    what the tool does is the server's business, and the user is asked before each call."""

    def __init__(self, spec: ToolSpec, call: Callable[[str, dict[str, Any]], ToolResult]) -> None:
        """`spec.listed_name` is the tool's name on its server (spec.name may be its full name,
        and changes if another server lists the same name); `call` sends a tools/call and
        blocks until its result."""
        self.spec = spec
        self._call = call

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        return None

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        return None

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        """The server's result (an error result when the server fails, hangs or goes);
        KeyboardInterrupt while it waits cancels the request and is raised again."""
        return self._call(self.spec.listed_name or self.spec.name, dict(arguments))

    def __repr__(self) -> str:
        return f"McpTool({self.spec.name!r} of {self.spec.source!r})"


@dataclass(frozen=True)
class Listed:
    """A tool as its server lists it, checked and cut to size."""

    name: str
    description: str
    parameters: dict[str, Any]


def checked_tools(entries: Sequence[Any]) -> tuple[list[Listed], list[str]]:
    """Of the entries of a server's tool list, the tools fit to offer (of the first MAX_TOOLS
    entries), and what was wrong with the others, each a phrase ('tool "x" left out: ...')."""
    kept: list[Listed] = []
    problems = []
    if len(entries) > MAX_TOOLS:
        problems.append(f"it offers more than {MAX_TOOLS} tools; only the first {MAX_TOOLS} are used")
    for entry in entries[:MAX_TOOLS]:
        try:
            tool = types.Tool.model_validate(entry, by_name=False)
        except ValidationError:
            named = isinstance(entry, dict) and isinstance(entry.get("name"), str)
            what = f'tool "{printable(entry["name"])[:80]}"' if named else "a tool without a name"
            problems.append(f"{what} left out: its entry in the tool list is not an MCP tool")
            continue
        name = printable(tool.name)[:80]
        if not TOOL_NAME.fullmatch(tool.name):
            problems.append(f'tool "{name}" left out: a tool\'s name is 1 to 128 letters, digits, "_", "-" or "."')
        elif any(other.name == tool.name for other in kept):
            problems.append(f'tool "{name}" left out: the server lists two tools of that name')
        elif (problem := schema_problem(tool.input_schema)) is not None:
            problems.append(f'tool "{name}" left out: {problem}')
        else:
            description = tool.description or ""
            if len(description) > MAX_DESCRIPTION_CHARS:
                problems.append(f'tool "{name}": its description was cut to {MAX_DESCRIPTION_CHARS} characters')
                description = description[:MAX_DESCRIPTION_CHARS]
            kept.append(Listed(tool.name, description, tool.input_schema))
    return kept, problems


def schema_problem(schema: Any) -> str | None:
    """Why a tool's input schema cannot be offered (not an object schema, not JSON Schema,
    too deep or too large), or None. A light check: keywords it does not know pass."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return 'its input schema is not an object schema ({"type": "object", ...})'
    problem = _subschema_problem(schema, 0)
    if problem is not None:
        return f"its input schema is not valid JSON Schema ({problem})"
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        return f"its input schema is larger than {MAX_SCHEMA_CHARS} characters"
    return None


def _subschema_problem(schema: Any, depth: int) -> str | None:
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return "a schema that is neither an object nor true or false"
    if depth > MAX_SCHEMA_DEPTH:
        return f"nested more than {MAX_SCHEMA_DEPTH} levels deep"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [] if kind is None else [kind]
    if not all(isinstance(item, str) and item in _JSON_TYPES for item in kinds):
        return f'"type" {printable(json.dumps(kind))[:80]} names no JSON type'
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        return '"required" is not a list of property names'
    if not isinstance(schema.get("enum", []), list):
        return '"enum" is not a list'
    children = [schema[key] for key in _ONE_SCHEMA if key in schema]
    items = schema.get("items", True)
    children.extend(items if isinstance(items, list) else [items])  # a list: the tuple form of older drafts
    for key in _SCHEMA_LISTS:
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                return f'"{key}" is not a list of schemas'
            children.extend(schema[key])
    for key in _SCHEMA_TABLES:
        if key in schema:
            if not isinstance(schema[key], dict):
                return f'"{key}" is not an object of schemas'
            children.extend(schema[key].values())
    return next((problem for child in children if (problem := _subschema_problem(child, depth + 1))), None)


def result_text(result: types.CallToolResult) -> ToolResult:
    """A tools/call result as text: its text content joined; its structured content as JSON
    where there is no text; a one-line note for an image, audio or binary resource (their
    type and size, never their bytes)."""
    parts = [_content_text(block) for block in result.content]
    if result.structured_content is not None and not any(map(_is_text, result.content)):
        try:
            parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError):
            parts.insert(0, "[structured content that is not JSON]")
    return ToolResult("\n".join(parts), is_error=bool(result.is_error))


def cut(result: ToolResult, cap: int) -> ToolResult:
    """The result's first `cap` characters, with a note saying that the rest was cut."""
    text = result.text
    return ToolResult(f"{text[:cap]}\n[cut: the output was {len(text):,} characters; only the first {cap:,} are kept]",
                      result.is_error)


def printable(text: str) -> str:
    """A stranger's text made safe for one line of a terminal (control characters and line
    breaks become spaces)."""
    return "".join(character if character.isprintable() else " " for character in text).strip()


def _is_text(block: types.ContentBlock) -> bool:
    return isinstance(block, types.TextContent) or (
        isinstance(block, types.EmbeddedResource) and isinstance(block.resource, types.TextResourceContents))


def _content_text(block: types.ContentBlock) -> str:
    match block:
        case types.TextContent():
            return block.text
        case types.ImageContent() | types.AudioContent():
            return f"[{block.type}: {printable(block.mime_type)[:80]}, {_decoded_size(block.data):,} bytes]"
        case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
            return resource.text  # text the tool meant the model to read
        case types.EmbeddedResource(resource=types.BlobResourceContents() as resource):
            kind = printable(resource.mime_type or "unknown type")[:80]
            return f"[resource {printable(str(resource.uri))[:200]}: {kind}, {_decoded_size(resource.blob):,} bytes]"
        case types.ResourceLink():
            size = "" if block.size is None else f", {block.size:,} bytes"
            kind = printable(block.mime_type or "unknown type")[:80]
            return f"[link to resource {printable(str(block.uri))[:200]}: {kind}{size}]"
    return f"[content of type {printable(str(getattr(block, 'type', '?')))[:80]}]"


def _decoded_size(base64_text: str) -> int:
    data = base64_text.rstrip()
    return len(data) * 3 // 4 - data[-2:].count("=")
