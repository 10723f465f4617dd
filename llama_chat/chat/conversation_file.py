"""The conversation file that /save writes and /open reads.

JSON: the kind and version, the model it was made with, the sampling settings, the
token ids before the first exchange, then one message a line (a reply's token ids on its
line). Token ids let /open continue with the cache exactly where the conversation was.

Exchanges out of the context (dropped, or compacted) are "earlier", messages as above
without token ids, and "summary" the text that stands for the compacted ones; both optional.

A reply that called tools has "tool_rounds" on its line: a list of {"text": ..., "calls":
[{"id", "name", "arguments"}], "results": [{"text", "outcome"}]}, one result a call.

Where the conversation forks (see branches), "branches" follows, one fork a line:
{"exchange": N, "version": V, "others": [{"messages": [...], "branches": [...]}, ...]}:
at exchange N (from 1) of its list of messages, the other versions from there on, each
messages as above (that may fork again), and V (from 0) the place among them of the
version in the messages. Optional: a file without it has one version; one where it is
malformed opens without the other versions, and a note says why in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

from llama_chat.chat.exchange import CallResult, Exchange, Outcome, ToolRound
from llama_chat.chat.spans import Span, Spans
from llama_chat.disk_cache import staged
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError, SettingError
from llama_chat.text.tool_calls import ToolCall
from llama_chat.text.undecodable import has_undecodable
from llama_chat.untrusted_files import MAX_JSON_FILE_BYTES, parse_json, read_text_file, shown

FILE_KIND = "llama-chat conversation"
FILE_VERSION = 1


@dataclasses.dataclass
class SavedConversation:
    system: str | None
    exchanges: list[Exchange]
    head_ids: list[int] | None  # the ids before the first exchange; None: not known
    spans: Spans  # the ids of each exchange (other versions' too) where known
    settings: SamplingSettings
    model: dict  # path, name, chat_format and vocab_size of the model it was made with
    note: str | None = None  # why the other versions were not opened, when they were not
    tools: list[str] = dataclasses.field(default_factory=list)  # the names of the tools offered
    earlier: list[Exchange] = dataclasses.field(default_factory=list)  # out of the context
    summary: str | None = None  # what stands for the compacted exchanges in the context


def write_conversation(path: Path, saved: SavedConversation) -> None:
    try:
        with staged(path) as staging:  # whole or not at all: a crash mid-write keeps the file before
            staging.write_text(conversation_document(saved), encoding="utf-8")
    except OSError as error:
        raise LlamaChatError(f"cannot write {path}: {error.strerror or error}") from None


def conversation_document(saved: SavedConversation) -> str:
    """The conversation as the file holds it (the history keeps the same text)."""
    messages: list[dict] = [{"role": "system", "content": saved.system}] if saved.system else []
    data = {
        "kind": FILE_KIND,
        "version": FILE_VERSION,
        "model": saved.model,
        "settings": dataclasses.asdict(saved.settings),
        "head_ids": saved.head_ids,
        **({"tools": saved.tools} if saved.tools else {}),
        "messages": messages + _messages_of(saved.exchanges, saved.spans),
        "branches": _branches_of(saved.exchanges, saved.spans),
        **({"earlier": _messages_of(saved.earlier, Spans())} if saved.earlier else {}),
        **({"summary": saved.summary} if saved.summary else {}),
    }
    return _dumps(data)


def _messages_of(exchanges: Sequence[Exchange], spans: Spans) -> list[dict]:
    messages = []
    for exchange in exchanges:
        span = spans.get(exchange)
        messages.append({"role": "user", "content": exchange.user, "token_ids": span and span.user})
        reply = {"role": "assistant", "content": exchange.reply, "interrupted": exchange.interrupted,
                 "token_ids": span and span.reply}
        if exchange.rounds:
            reply["tool_rounds"] = [_round_of(tool_round) for tool_round in exchange.rounds]
        messages.append(reply)
    return messages


def _round_of(tool_round: ToolRound) -> dict:
    return {
        "text": tool_round.text,
        "calls": [{"id": call.id, "name": call.name, "arguments": dict(call.arguments)} for call in tool_round.calls],
        "results": [{"text": result.text, "outcome": str(result.outcome)} for result in tool_round.results],
    }


def _branches_of(exchanges: Sequence[Exchange], spans: Spans) -> list[dict]:
    """The forks of these exchanges, with every other version (and the forks in it)."""
    return [
        {"exchange": number, "version": exchange.version, "others": [
            {"messages": _messages_of(version, spans), "branches": _branches_of(version, spans)}
            for version in exchange.others
        ]}
        for number, exchange in enumerate(exchanges, 1) if exchange.others
    ]


def read_conversation(path: Path) -> SavedConversation:
    """A saved conversation, every part checked; one clear error for a file that is not one.
    Malformed "branches" leave the conversation without its other versions, and a note."""
    try:
        text = read_text_file(path, MAX_JSON_FILE_BYTES)
    except FileNotFoundError:
        raise LlamaChatError(f"cannot read {path}: no such file") from None
    return parse_conversation(text, path)


def parse_conversation(text: str, path: Path | str) -> SavedConversation:
    """A conversation document's text (see read_conversation); `path` names it in errors."""
    data = _parsed_json(text, path)
    spans = Spans()
    system, exchanges, head_ids = _conversation_from(data, path, spans)
    settings = _settings_from(data.get("settings"), path)
    model = _model_from(data.get("model"), path)
    note = None
    try:
        forks = _forks_from(data.get("branches", []), len(exchanges), path, spans)
    except LlamaChatError as error:
        reason = str(error).removeprefix(f"{path}: ")
        note = f"{path}: its other versions were not opened ('branches': {reason})"
    else:
        for number, place, others in forks:
            exchanges[number - 1].others, exchanges[number - 1].version = others, place
    tools = data.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(name, str) for name in tools):
        raise LlamaChatError(f"{path}: 'tools' must be a list of tool names")
    earlier, summary = data.get("earlier", []), data.get("summary")
    _check_messages(earlier, path)
    if summary is not None and (not isinstance(summary, str) or has_undecodable(summary)):
        raise LlamaChatError(f"{path}: 'summary' must be text")
    return SavedConversation(system, exchanges, head_ids, spans, settings, model, note, tools,
                             _exchanges_from(earlier, path, Spans()), summary)


def _dumps(data: dict) -> str:
    """Indented JSON with one message per line (token id lists would take a line per id),
    then one fork per line, if any."""
    listed = ["messages", "branches"] if data["branches"] else ["messages"]
    kept = {key: value for key, value in data.items() if key not in ("messages", "branches")}
    text = json.dumps(kept, ensure_ascii=False, indent=1)[: -len("\n}")]
    for key in listed:
        items = ",\n  ".join(json.dumps(item, ensure_ascii=False) for item in data[key])
        text += f',\n "{key}": [\n  {items}\n ]'
    return text + "\n}\n"


def _parsed_json(text: str, path: Path | str) -> dict:
    try:
        data = parse_json(text)
    except json.JSONDecodeError as error:
        raise LlamaChatError(f"{path} is not a llama-chat conversation (bad JSON on line {error.lineno})") from None
    except ValueError as error:
        raise LlamaChatError(f"{path} is not a llama-chat conversation (JSON {error})") from None
    if not isinstance(data, dict) or data.get("kind") != FILE_KIND:
        raise LlamaChatError(f"{path} is not a llama-chat conversation (made by /save)")
    if data.get("version") != FILE_VERSION:
        raise LlamaChatError(
            f"{path} has conversation format version {shown(data.get('version'))}; this llama-chat reads {FILE_VERSION}"
        )
    return data


def _token_ids(value: object, path: Path) -> list[int] | None:
    """Ids as saved: whether they fit the model's vocabulary and text is the session's to check."""
    if value is None:
        return None
    if isinstance(value, list) and all(type(token) is int and token >= 0 for token in value):
        return value
    raise LlamaChatError(f"{path}: token_ids must be a list of whole numbers from 0 up")


def _conversation_from(
    data: dict, path: Path, spans: Spans
) -> tuple[str | None, list[Exchange], list[int] | None]:
    """System prompt, exchanges and head ids from a saved conversation, checked (the
    exchanges' ids into `spans`)."""
    messages = data.get("messages")
    _check_messages(messages, path)
    system = None
    if messages and messages[0].get("role") == "system":
        system, messages = messages[0]["content"], messages[1:]
    return system, _exchanges_from(messages, path, spans), _token_ids(data.get("head_ids"), path)


def _check_messages(messages: object, path: Path) -> None:
    """Each message an object with text content (roles are _exchanges_from's to check)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise LlamaChatError(f"{path}: 'messages' must be a list of messages")
    if not all(isinstance(m.get("content"), str) for m in messages):
        raise LlamaChatError(f"{path}: every message needs a text 'content'")
    if not all(isinstance(m.get("interrupted", False), bool) for m in messages):
        raise LlamaChatError(f"{path}: a message's 'interrupted' must be true or false")
    for number, message in enumerate(messages, 1):
        if has_undecodable(message["content"]):
            raise LlamaChatError(
                f"{path}: message {number} holds characters that are not text (lone surrogates); not opened"
            )


def _exchanges_from(messages: list[dict], path: Path, spans: Spans) -> list[Exchange]:
    """The exchanges of a list of messages, their ids (where both parts are known) into `spans`."""
    roles = [m.get("role") for m in messages]
    if len(roles) % 2 or roles != ["user", "assistant"] * (len(roles) // 2):
        raise LlamaChatError(
            f"{path}: after an optional system message, messages must alternate user, assistant"
        )
    exchanges = []
    for asked, answered in zip(messages[::2], messages[1::2]):
        exchange = Exchange(
            user=asked["content"], reply=answered["content"], interrupted=answered.get("interrupted", False),
            rounds=[_round_from(value, path) for value in _list(answered.get("tool_rounds", []), "tool_rounds", path)],
        )
        user_ids, reply_ids = _token_ids(asked.get("token_ids"), path), _token_ids(answered.get("token_ids"), path)
        if user_ids is not None and reply_ids is not None:
            spans[exchange] = Span(user_ids, reply_ids)
        exchanges.append(exchange)
    return exchanges


def _list(value: object, name: str, path: Path) -> list:
    if not isinstance(value, list):
        raise LlamaChatError(f"{path}: '{name}' must be a list")
    return value


def _round_from(value: object, path: Path) -> ToolRound:
    """A round of tool calls, checked: text, calls with an id, a name and arguments, and a
    result (text and outcome) for each call."""
    wrong = f"{path}: a tool round must be an object with a text 'text', 'calls' and one of 'results' a call"
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        raise LlamaChatError(wrong)
    calls, results = _list(value.get("calls"), "calls", path), _list(value.get("results"), "results", path)
    if len(calls) != len(results) or not calls:
        raise LlamaChatError(wrong)
    read_calls = []
    for call in calls:
        if not (isinstance(call, dict) and isinstance(call.get("id"), str) and isinstance(call.get("name"), str)
                and isinstance(call.get("arguments"), dict)):
            raise LlamaChatError(f"{path}: a tool call needs a text 'id' and 'name' and an object 'arguments'")
        read_calls.append(ToolCall(call["name"], call["arguments"], call["id"]))
    read_results = []
    outcomes = {str(outcome) for outcome in Outcome}
    for result in results:
        if not (isinstance(result, dict) and isinstance(result.get("text"), str) and result.get("outcome") in outcomes):
            raise LlamaChatError(
                f"{path}: a tool result needs a text 'text' and an 'outcome' ({', '.join(sorted(outcomes))})"
            )
        read_results.append(CallResult(result["text"], Outcome(result["outcome"])))
    texts = [value["text"], *(result.text for result in read_results),
             *(json.dumps([call.id, call.name, call.arguments], ensure_ascii=False) for call in read_calls)]
    if any(has_undecodable(text) for text in texts):
        raise LlamaChatError(f"{path}: a tool round holds characters that are not text (lone surrogates); not opened")
    return ToolRound(value["text"], read_calls, read_results)


def _forks_from(
    value: object, count: int, path: Path, spans: Spans
) -> list[tuple[int, int, list[list[Exchange]]]]:
    """(exchange number, place, other versions) of each fork in a list of `count` exchanges."""
    if not isinstance(value, list) or not all(isinstance(fork, dict) for fork in value):
        raise LlamaChatError(f"{path}: 'branches' must be a list of forks")
    forks, seen = [], set()
    for fork in value:
        number, place, others = fork.get("exchange"), fork.get("version"), fork.get("others")
        if type(number) is not int or not 1 <= number <= count or number in seen:
            raise LlamaChatError(
                f"{path}: a fork's 'exchange' must be one of its messages' exchanges (1 to {count}), once"
            )
        if not isinstance(others, list) or not others or not all(isinstance(other, dict) for other in others):
            raise LlamaChatError(f"{path}: a fork's 'others' must be a list of versions")
        if type(place) is not int or not 0 <= place <= len(others):
            raise LlamaChatError(f"{path}: a fork's 'version' must be from 0 to {len(others)}")
        seen.add(number)
        forks.append((number, place, [_version_from(other, path, spans) for other in others]))
    return forks


def _version_from(data: dict, path: Path, spans: Spans) -> list[Exchange]:
    """Another version's exchanges, with their own forks."""
    messages = data.get("messages")
    _check_messages(messages, path)
    exchanges = _exchanges_from(messages, path, spans)
    if not exchanges:
        raise LlamaChatError(f"{path}: a version in 'branches' needs messages")
    for number, place, others in _forks_from(data.get("branches", []), len(exchanges), path, spans):
        exchanges[number - 1].others, exchanges[number - 1].version = others, place
    return exchanges


def _settings_from(values: object, path: Path) -> SamplingSettings:
    if not isinstance(values, dict):
        raise LlamaChatError(f"{path}: 'settings' must be an object")
    known = {field.name: values[field.name] for field in dataclasses.fields(SamplingSettings) if field.name in values}
    for name, value in known.items():
        # SamplingSettings checks types and ranges; not that a number is finite or fits a seed.
        if (type(value) is float and not math.isfinite(value)) or (type(value) is int and value >= 2**63):
            raise LlamaChatError(f"{path}: {name} must be a finite number below 2**63, not {shown(value)}")
    try:
        return SamplingSettings(**known)
    except SettingError as error:
        raise LlamaChatError(f"{path}: {error}") from None


# What a conversation file says of the model it was made with, and the type of each.
_MODEL_FIELDS = {"path": str, "name": str, "chat_format": str, "vocab_size": int}


def _model_from(value: object, path: Path) -> dict:
    """The 'model' object (missing in files by hand: nothing known), its fields checked: they
    decide whether the token ids are kept, and name the model in one-line notes."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(_model_field_fits(name, field) for name, field in value.items()):
        raise LlamaChatError(f"{path}: 'model' must be an object of the text path, name, chat_format and vocab_size")
    return value


def _model_field_fits(name: str, value: object) -> bool:
    kind = _MODEL_FIELDS.get(name)
    if kind is None or value is None:
        return True
    return type(value) is kind and (kind is not str or value.isprintable())
