"""Tool calls in the model's own format: how each family of models writes a call, how the
call is read back, and the grammar that holds a call to the tools offered.

Families (which one a model uses is read from its chat template, see `call_syntax_for`):
- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one block per call.
- llama3 (Llama 3.1, 3.2): the reply is one JSON object `{"name": ..., "parameters": {...}}`,
  after `<|python_tag|>` where the vocabulary has it.
- phi4 (Phi-4-mini): `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>`;
  its template takes the tools as JSON text in the system message.
- granite (Granite 3): `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`.
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
- described: any other model. The tools are described in the system prompt (DESCRIBED_TOOLS),
  calls are written as hermes writes them, and results come back in a user message inside
  `<tool_response>` blocks.

The grammar lets the model write any text, or open a call; from the opening on, the tool's
name is one of the offered names and its arguments follow that tool's JSON Schema, written
as `json.dumps` writes JSON (`", "` and `": "`), which is also how templates write calls
back (`tojson`). After its calls the reply ends.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llama_chat.text.tokenizer import Tokenizer
from llama_chat.tools.tool import ToolSpec

# JSON written as json.dumps writes it: what the families were trained on, and what templates'
# tojson writes back, so that a call reads the same when the conversation is rendered again.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_TEXT = "/(?s:.*)/"
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name, its arguments, and an id that pairs it with
    its result (nine letters and digits: what the strictest templates accept)."""

    name: str
    arguments: Mapping[str, Any]
    id: str

    def as_message_part(self) -> dict[str, Any]:
        """The call as chat templates take it in an assistant message's `tool_calls`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class CallSyntax:
    """How one family writes its calls."""

    name: str
    opening: str  # what opens the calls ("": the reply itself is the call)
    closing: str = ""  # what closes each call (or the list of calls)
    arguments_key: str = "arguments"
    listed: bool = False  # the calls written as one JSON list after one opening
    native: bool = True  # the template takes the tools (False: described in the system prompt)
    tools_in_system: bool = False  # the template reads the tools as JSON text in the system message

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        """The calls as this family writes them (and as the grammar holds them)."""
        objects = [{"name": call.name, self.arguments_key: dict(call.arguments)} for call in calls]
        if self.listed:
            return f"{self.opening}{json.dumps(objects, ensure_ascii=False)}{self.closing}"
        if not self.opening:
            return json.dumps(objects[0], ensure_ascii=False)
        return "\n".join(f"{self.opening}\n{json.dumps(one, ensure_ascii=False)}\n{self.closing}" for one in objects)


HERMES = CallSyntax("hermes", "<tool_call>", "</tool_call>")
LLAMA3 = CallSyntax("llama3", "", arguments_key="parameters")
PHI4 = CallSyntax("phi4", "<|tool_call|>", "<|/tool_call|>", listed=True, tools_in_system=True)
GRANITE = CallSyntax("granite", "<|tool_call|>", listed=True)
MISTRAL = CallSyntax("mistral", "[TOOL_CALLS]", listed=True)
DESCRIBED = CallSyntax("described", "<tool_call>", "</tool_call>", native=False)
SYNTAXES = {syntax.name: syntax for syntax in (HERMES, LLAMA3, PHI4, GRANITE, MISTRAL, DESCRIBED)}

# How a model whose template takes no tools is told of them (appended to the system prompt).
DESCRIBED_TOOLS = """\
You can call tools. Each is described by a JSON object on a line of its own between <tools> and </tools>:
<tools>
{tools}
</tools>
To call a tool, write only this, with the tool's name and its arguments as a JSON object:
<tool_call>
{{"name": "TOOL NAME", "arguments": {{"ARGUMENT": "VALUE"}}}}
</tool_call>
Each result comes back between <tool_response> and </tool_response>. When no tool is needed, answer directly."""


def call_syntax_for(template: str | None, tokenizer: Tokenizer) -> CallSyntax:
    """The family a model's chat template writes calls in; `DESCRIBED` where the template
    takes no tools or writes them in no format known here."""
    if template is None or not re.search(r"\btools\b", template):
        return DESCRIBED
    if "[TOOL_CALLS]" in template and "[ARGS]" not in template:
        return MISTRAL
    if "<|tool|>" in template and tokenizer.token_id("<|tool_call|>") is not None:
        return PHI4
    if "<|tool_call|>" in template:
        return GRANITE if "<|start_of_role|>" in template else PHI4
    if "<tool_call>" in template:
        return HERMES
    if _PYTHON_TAG in template or ("ipython" in template and '"parameters"' in template):
        return LLAMA3
    return DESCRIBED


def tool_declarations(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as chat templates take them (transformers' and llama.cpp's `tools` list)."""
    return [
        {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                          "parameters": dict(tool.parameters)}}
        for tool in tools
    ]


def described_tools(tools: Iterable[ToolSpec]) -> str:
    """The text that tells a model whose template takes no tools what it may call."""
    lines = "\n".join(json.dumps(declaration, ensure_ascii=False) for declaration in tool_declarations(tools))
    return DESCRIBED_TOOLS.format(tools=lines)


def call_schema(syntax: CallSyntax, tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """The JSON Schema of one call: one of the offered names, with that tool's arguments."""
    choices = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, syntax.arguments_key: dict(tool.parameters)},
            "required": ["name", syntax.arguments_key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return {"anyOf": choices} if len(choices) > 1 else choices[0]


class ToolChoice(enum.StrEnum):
    """Whether a reply may call (auto), must open with calls (required) or may not (none)."""

    AUTO = "auto"
    REQUIRED = "required"
    NONE = "none"


def call_grammar(
    syntax: CallSyntax, tools: Sequence[ToolSpec], tokenizer: Tokenizer, choice: ToolChoice = ToolChoice.AUTO
) -> str:
    """llguidance's grammar for a reply: free text, or text and then calls to these tools in
    the family's format (auto); calls from its start (required); free text in which the
    opening may not be written (none)."""
    opening_is_token = _is_control_token(tokenizer, syntax.opening)
    text = _free_text(syntax, tokenizer, opening_is_token)
    if choice == ToolChoice.NONE or not tools:
        return f"%llguidance {{}}\nstart: text\n{text}"
    schema = {**call_schema(syntax, tools), "x-guidance": _JSON_STYLE}
    if syntax.listed:
        schema = {"type": "array", "items": call_schema(syntax, tools), "minItems": 1, "x-guidance": _JSON_STYLE}
    one_call = f"%json {json.dumps(schema)}"
    closing = _literal(tokenizer, syntax.closing)
    free = "text | " if choice == ToolChoice.AUTO else ""
    if not syntax.opening:  # llama3: the whole reply is the call
        tag = f'{_literal(tokenizer, _PYTHON_TAG)}? ' if tokenizer.token_id(_PYTHON_TAG) is not None else ""
        body = f"start: {free}{tag}{one_call}\n"
    elif opening_is_token:
        before = "text " if choice == ToolChoice.AUTO else ""
        body = f"start: {free}{before}{_literal(tokenizer, syntax.opening)} {one_call} {closing}\n"
    else:  # an opening spelt in text: the free text ends lazily at its first appearance
        opening = json.dumps(syntax.opening)
        head = "head" if choice == ToolChoice.AUTO else opening
        body = (
            f"start: {free}{head} call (\"\\n\" {opening} call)*\n"
            f"head[lazy]: /(?s:.*)/ {opening}\n"
            f"call: \"\\n\" {one_call} \"\\n\" {closing}\n"
        )
    return f"%llguidance {{}}\n{body}{text}"


def _free_text(syntax: CallSyntax, tokenizer: Tokenizer, opening_is_token: bool) -> str:
    """The rules for text that is not a call: any text without the opening, and the control
    tokens a reply may hold (thinking markers, say) other than those that end it or open a call."""
    if not syntax.opening:
        pattern = f"{_ANY_TEXT} & ~/\\s*[{{](?s:.*)/"  # llama3: text that does not start as JSON
    elif opening_is_token:
        pattern = _ANY_TEXT
    else:
        pattern = f"{_ANY_TEXT} & ~/(?s:.*){re.escape(syntax.opening)}(?s:.*)/"
    reserved = {tokenizer.token_id(name) for name in (syntax.opening, syntax.closing, _PYTHON_TAG) if name}
    specials = sorted(
        token for token in (tokenizer.token_id(name) for name in tokenizer.special_token_names())
        if token is not None and token not in tokenizer.stop_ids and token not in reserved
        and tokenizer.token_bytes(token) is None
    )
    rules = f"TEXT: {pattern}\n"
    if specials:
        ids = ",".join(map(str, specials))
        return f"text: TEXT (<[{ids}]> TEXT)*\n{rules}"
    return f"text: TEXT\n{rules}"


def _is_control_token(tokenizer: Tokenizer, name: str) -> bool:
    token = tokenizer.token_id(name) if name else None
    return token is not None and tokenizer.token_bytes(token) is None


def _literal(tokenizer: Tokenizer, text: str) -> str:
    """`text` in a grammar rule: the control token (by id) where the vocabulary has one, else the text."""
    if not text:
        return ""
    return f"<[{tokenizer.token_id(text)}]>" if _is_control_token(tokenizer, text) else json.dumps(text)


# Reading calls back


class CallReadError(ValueError):
    """Text that opened a call but holds none that parses (a reply cut off mid-call)."""


@dataclass(frozen=True)
class ReadReply:
    """A reply read for calls: the text before them, and the calls (none: an answer)."""

    text: str
    calls: tuple[ToolCall, ...] = ()


def read_calls(syntax: CallSyntax, text: str, first_id: int = 1) -> ReadReply:
    """The calls a reply holds, numbered from `first_id`. Text with no opening is an answer;
    text that opens calls that do not parse raises CallReadError."""
    if not syntax.opening:
        stripped = text.removeprefix(_PYTHON_TAG).strip()
        if not stripped.startswith("{"):
            return ReadReply(text)
        return ReadReply("", _calls_from([_json_object(stripped)], syntax, first_id))
    start = text.find(syntax.opening)
    if start < 0:
        return ReadReply(text)
    before, rest = text[:start], text[start:]
    if syntax.listed:
        body = rest[len(syntax.opening):]
        body = body[: body.rfind(syntax.closing)] if syntax.closing and syntax.closing in body else body
        try:
            objects = json.loads(body)
        except json.JSONDecodeError as error:
            raise CallReadError(f"the calls do not parse ({error.msg})") from None
        if not isinstance(objects, list) or not objects:
            raise CallReadError("the calls are not a list of calls")
        return ReadReply(before, _calls_from(objects, syntax, first_id))
    pattern = re.compile(re.escape(syntax.opening) + r"(.*?)" + re.escape(syntax.closing), re.DOTALL)
    objects = [_json_object(match.group(1).strip()) for match in pattern.finditer(rest)]
    if not objects:
        raise CallReadError(f"a call was opened with {syntax.opening} but not closed")
    return ReadReply(before, _calls_from(objects, syntax, first_id))


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CallReadError(f"a call does not parse ({error.msg})") from None


def _calls_from(objects: list[Any], syntax: CallSyntax, first_id: int) -> tuple[ToolCall, ...]:
    calls = []
    for number, value in enumerate(objects, first_id):
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise CallReadError("a call names no tool")
        arguments = value.get(syntax.arguments_key, {})
        if not isinstance(arguments, dict):
            raise CallReadError(f"the arguments of a call to {value['name']} are not a JSON object")
        calls.append(ToolCall(value["name"], arguments, call_id(number)))
    return tuple(calls)


def call_id(number: int) -> str:
    """The id of the conversation's call `number`: nine letters and digits."""
    return f"call{number:05d}"
