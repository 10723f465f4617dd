"""The conversation file that /save writes and /open reads.

JSON: the kind and version, the model it was made with, the sampling settings, the
token ids before the first exchange, then one message a line (a reply's token ids on its
line). Token ids let /open continue with the cache exactly where the conversation was.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from llama_chat.chat.exchange import Exchange
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError, SettingError
from llama_chat.text.undecodable import has_undecodable
from llama_chat.paths import staged

FILE_KIND = "llama-chat conversation"
FILE_VERSION = 1


@dataclasses.dataclass
class SavedConversation:
    system: str | None
    exchanges: list[Exchange]
    head_ids: list[int] | None  # the ids before the first exchange; None: not known
    settings: SamplingSettings
    model: dict  # path, name, chat_format and vocab_size of the model it was made with


def write_conversation(path: Path, saved: SavedConversation) -> None:
    messages: list[dict] = [{"role": "system", "content": saved.system}] if saved.system else []
    for exchange in saved.exchanges:
        messages.append({"role": "user", "content": exchange.user, "token_ids": exchange.user_ids})
        messages.append({
            "role": "assistant", "content": exchange.reply, "interrupted": exchange.interrupted,
            "token_ids": exchange.reply_ids,
        })
    data = {
        "kind": FILE_KIND,
        "version": FILE_VERSION,
        "model": saved.model,
        "settings": dataclasses.asdict(saved.settings),
        "head_ids": saved.head_ids,
        "messages": messages,
    }
    try:
        with staged(path) as staging:  # whole or not at all: a crash mid-write keeps the file before
            staging.write_text(_dumps(data), encoding="utf-8")
    except OSError as error:
        raise LlamaChatError(f"cannot write {path}: {error.strerror or error}") from None


def read_conversation(path: Path) -> SavedConversation:
    """A saved conversation, every part checked; one clear error for a file that is not one."""
    data = _read_json(path)
    system, exchanges, head_ids = _conversation_from(data, path)
    settings = _settings_from(data.get("settings"), path)
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    return SavedConversation(system, exchanges, head_ids, settings, model)


def _dumps(data: dict) -> str:
    """Indented JSON with one message per line (token id lists would take a line per id)."""
    header = json.dumps({key: value for key, value in data.items() if key != "messages"}, ensure_ascii=False, indent=1)
    messages = ",\n  ".join(json.dumps(message, ensure_ascii=False) for message in data["messages"])
    return header[: -len("\n}")] + ',\n "messages": [\n  ' + messages + "\n ]\n}\n"


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise LlamaChatError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise LlamaChatError(f"{path} is not a llama-chat conversation (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise LlamaChatError(f"{path} is not a llama-chat conversation (bad JSON on line {error.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != FILE_KIND:
        raise LlamaChatError(f"{path} is not a llama-chat conversation (made by /save)")
    if data.get("version") != FILE_VERSION:
        raise LlamaChatError(
            f"{path} has conversation format version {data.get('version')}; this llama-chat reads {FILE_VERSION}"
        )
    return data


def _token_ids(value: object, path: Path) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(token, int) and not isinstance(token, bool) for token in value):
        return list(value)
    raise LlamaChatError(f"{path}: token_ids must be a list of whole numbers")


def _conversation_from(data: dict, path: Path) -> tuple[str | None, list[Exchange], list[int] | None]:
    """System prompt, exchanges and head ids from a saved conversation, checked."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise LlamaChatError(f"{path}: 'messages' must be a list of messages")
    if not all(isinstance(m.get("content"), str) for m in messages):
        raise LlamaChatError(f"{path}: every message needs a text 'content'")
    for number, message in enumerate(messages, 1):
        if has_undecodable(message["content"]):
            raise LlamaChatError(
                f"{path}: message {number} holds characters that are not text (lone surrogates); not opened"
            )
    system = None
    if messages and messages[0].get("role") == "system":
        system, messages = messages[0]["content"], messages[1:]
    roles = [m.get("role") for m in messages]
    if len(roles) % 2 or roles != ["user", "assistant"] * (len(roles) // 2):
        raise LlamaChatError(
            f"{path}: after an optional system message, messages must alternate user, assistant"
        )
    exchanges = [
        Exchange(
            user=asked["content"], reply=answered["content"], interrupted=bool(answered.get("interrupted")),
            user_ids=_token_ids(asked.get("token_ids"), path), reply_ids=_token_ids(answered.get("token_ids"), path),
        )
        for asked, answered in zip(messages[::2], messages[1::2])
    ]
    return system, exchanges, _token_ids(data.get("head_ids"), path)


def _settings_from(values: object, path: Path) -> SamplingSettings:
    if not isinstance(values, dict):
        raise LlamaChatError(f"{path}: 'settings' must be an object")
    known = {field.name for field in dataclasses.fields(SamplingSettings)}
    try:
        return SamplingSettings(**{name: value for name, value in values.items() if name in known})
    except SettingError as error:
        raise LlamaChatError(f"{path}: {error}") from None
