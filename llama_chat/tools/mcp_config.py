"""The MCP servers a person lists in a JSON file, read and checked before any of them starts.

The file has the shape other MCP clients read (Claude Desktop, VS Code, llama-server):

    {"mcpServers": {
        "notes": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~/notes"],
                  "env": {"LOG_LEVEL": "warn"}, "cwd": "~/notes"},
        "search": {"url": "http://127.0.0.1:8123/mcp", "type": "http", "headers": {"Authorization": "Bearer x"}}}}

VS Code's top-level "servers" is read as "mcpServers". An entry with "disabled": true is
left out, and keys that other clients use ("autoApprove", "timeout"...) are ignored. A
relative "cwd" is taken from the file's folder. A server reached by url must run on this
machine (localhost, 127.0.0.0/8, ::1): the conversation goes to it, and llama-chat keeps
conversations on the machine it runs on. Each problem is one line naming the file, the
server and what to change.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llama_chat.errors import LlamaChatError
from llama_chat.tools.tool import BUILT_IN

MAX_CONFIG_BYTES = 1 << 20  # a list of servers is a few kilobytes
MAX_NESTING = 32  # the format nests four levels; json.loads recurses once per level
# A name goes into notices and tool names: SERVER__TOOL is one server's tool, whatever the tool's name.
SERVER_NAME = re.compile(r"(?!.*__)[A-Za-z0-9_.-]{0,63}[A-Za-z0-9.-]")
HTTP_TYPES = ("http", "streamable-http", "streamableHttp")  # the spellings clients use for streamable HTTP

# A string literal (possessive, so that no backtracking piles up) or a run of characters
# that are neither brackets nor quotes: what is left after removing them is the brackets.
_NOT_A_BRACKET = re.compile(r'"(?:[^"\\]++|\\[\s\S])*+"|[^"\[\]{}]++')


@dataclass(frozen=True)
class StdioServerConfig:
    """A server llama-chat starts, speaking MCP on the server's standard input and output."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # added to the few variables every server gets
    cwd: Path | None = None


@dataclass(frozen=True)
class HttpServerConfig:
    """A server already running on this machine, reached by streamable HTTP."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


ServerConfig = StdioServerConfig | HttpServerConfig


def read_config(path: Path, *, missing_ok: bool = False) -> list[ServerConfig]:
    """The servers the file lists, in its order, the disabled ones left out; [] for a file
    that does not exist when `missing_ok`. Every problem is a LlamaChatError of one line."""
    text = _read_text(path, missing_ok)
    if text is None:
        return []
    table = _server_table(path, _parse(path, text))
    configs = []
    for name, entry in table.items():
        config = _server(path, name, entry)
        if config is not None:
            configs.append(config)
    return configs


def is_loopback(host: str) -> bool:
    """Whether a URL's host is this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_text(path: Path, missing_ok: bool) -> str | None:
    try:
        # O_NONBLOCK: a FIFO named as the file is refused below instead of waited on.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise LlamaChatError(f"{path}: no such file") from None
    except OSError as error:
        raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error})") from None
    with open(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise LlamaChatError(f"{path}: not a regular file")
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise LlamaChatError(f"{path}: more than {MAX_CONFIG_BYTES} bytes, far more than a list of servers takes")
    try:
        return data.decode("utf-8-sig")  # some editors start a UTF-8 file with a byte order mark
    except UnicodeDecodeError:
        raise LlamaChatError(f"{path}: not UTF-8 text") from None


def _parse(path: Path, text: str) -> Any:
    depth = 0
    for bracket in _NOT_A_BRACKET.sub("", text):
        depth += 1 if bracket in "[{" else -1 if bracket in "]}" else 0
        if depth > MAX_NESTING:
            raise LlamaChatError(f"{path}: not valid JSON (nested more than {MAX_NESTING} levels deep)")
    try:
        return json.loads(text)
    except ValueError as error:
        raise LlamaChatError(f"{path}: not valid JSON ({error})") from None


def _server_table(path: Path, document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise LlamaChatError(f'{path}: expected a JSON object with the servers under "mcpServers"')
    keys = [key for key in ("mcpServers", "servers") if key in document]
    if not keys:
        raise LlamaChatError(f'{path}: no "mcpServers": list the servers under it ({{"mcpServers": {{"NAME": ...}}}})')
    if len(keys) == 2:
        raise LlamaChatError(f'{path}: both "mcpServers" and "servers": keep one of them')
    table = document[keys[0]]
    if not isinstance(table, dict):
        raise LlamaChatError(f'{path}: "{keys[0]}" should be an object of servers by name')
    return table


def _server(path: Path, name: str, entry: Any) -> ServerConfig | None:
    where = f"{path}: server {json.dumps(name)}"
    if not SERVER_NAME.fullmatch(name):
        raise LlamaChatError(f'{where}: use a name of letters, digits, "_", "-" and "." (at most 64 characters), '
                             'with no "__" and no "_" at its end (a tool\'s full name is SERVER__TOOL)')
    if name == BUILT_IN:
        raise LlamaChatError(f"{where}: that is what llama-chat's own tools are called; use another name")
    if not isinstance(entry, dict):
        raise LlamaChatError(f'{where}: expected an object with "command" or "url"')
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise LlamaChatError(f'{where}: "disabled" should be true or false')
    if disabled:
        return None
    if "command" in entry and "url" in entry:
        raise LlamaChatError(f'{where}: give "command" or "url", not both')
    if "command" not in entry and "url" not in entry:
        raise LlamaChatError(f'{where}: give "command" (a program to start) or "url" (a server on this machine)')
    kind = entry.get("type")
    if "command" in entry:
        _check_type(where, kind, ("stdio",), "command")
        return _stdio_server(path, where, name, entry)
    _check_type(where, kind, HTTP_TYPES, "url")
    return _http_server(where, name, entry)


def _check_type(where: str, kind: Any, fitting: tuple[str, ...], field_name: str) -> None:
    if kind is None or kind in fitting:
        return
    if kind == "sse" and field_name == "url":
        raise LlamaChatError(f'{where}: "type": "sse" (the old HTTP transport) is not supported; '
                             "give the server's streamable HTTP address, with \"type\": \"http\" or no type")
    raise LlamaChatError(f'{where}: "type": {json.dumps(kind)} does not go with "{field_name}" '
                         f'(use "{fitting[0]}" or leave "type" out)')


def _stdio_server(path: Path, where: str, name: str, entry: dict[str, Any]) -> StdioServerConfig:
    command = entry["command"]
    if not isinstance(command, str) or not command.strip():
        raise LlamaChatError(f'{where}: "command" should be a program\'s name or path')
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise LlamaChatError(f'{where}: "args" should be a list of strings')
    env = entry.get("env", {})
    if not _is_string_table(env):
        raise LlamaChatError(f'{where}: "env" should map variable names to strings (write numbers in quotes)')
    cwd = entry.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise LlamaChatError(f'{where}: "cwd" should be a folder\'s path')
    folder = None if cwd is None else path.parent / Path(cwd).expanduser()
    return StdioServerConfig(name=name, command=command, args=tuple(args), env=dict(env), cwd=folder)


def _http_server(where: str, name: str, entry: dict[str, Any]) -> HttpServerConfig:
    url = entry["url"]
    if not isinstance(url, str):
        raise LlamaChatError(f'{where}: "url" should be a string such as "http://127.0.0.1:8123/mcp"')
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise LlamaChatError(f'{where}: "url" should start with http:// or https:// (it is {json.dumps(url)})')
    try:
        host, _ = parts.hostname, parts.port
    except ValueError:
        raise LlamaChatError(f'{where}: "url" has a port that is not a number from 0 to 65535') from None
    if not host:
        raise LlamaChatError(f'{where}: "url" names no host')
    if not is_loopback(host):
        raise LlamaChatError(f"{where}: {host} is not this machine; llama-chat connects only to MCP servers "
                             "on this machine (localhost, 127.0.0.0/8, ::1), which see the conversation")
    headers = entry.get("headers", {})
    if not _is_string_table(headers):
        raise LlamaChatError(f'{where}: "headers" should map header names to strings')
    return HttpServerConfig(name=name, url=url, headers=dict(headers))


def _is_string_table(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())
