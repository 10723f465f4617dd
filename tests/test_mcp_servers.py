"""Tools from MCP servers: the config file that lists them, and their tools' lists and results."""

import base64
import json
import os
from pathlib import Path

import mcp_types as types
import pytest

from llama_chat import paths
from llama_chat.errors import LlamaChatError
from llama_chat.tools.mcp_config import HttpServerConfig, StdioServerConfig, is_loopback, read_config
from llama_chat.tools.mcp_tools import cut, result_text, schema_problem
from llama_chat.tools.tool import ToolResult


def _write(tmp_path: Path, document) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def test_a_config_with_both_kinds_of_server(tmp_path):
    path = _write(tmp_path, {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "some-server", "~/notes"], "env": {"LEVEL": "warn"},
                  "cwd": "work", "autoApprove": ["read"]},
        "off": {"command": "other", "disabled": True},
        "web": {"url": "http://127.0.0.1:8123/mcp", "type": "http", "headers": {"Authorization": "Bearer x"}},
        "web6": {"url": "https://[::1]/mcp", "type": "streamable-http"},
    }})
    assert read_config(path) == [
        StdioServerConfig("files", "npx", ("-y", "some-server", "~/notes"), {"LEVEL": "warn"}, tmp_path / "work"),
        HttpServerConfig("web", "http://127.0.0.1:8123/mcp", {"Authorization": "Bearer x"}),
        HttpServerConfig("web6", "https://[::1]/mcp"),
    ]


def test_vs_codes_servers_key_is_read_too(tmp_path):
    path = _write(tmp_path, {"servers": {"time": {"type": "stdio", "command": "mcp-server-time"}}})
    assert read_config(path) == [StdioServerConfig("time", "mcp-server-time")]


def test_a_missing_file(tmp_path):
    assert read_config(tmp_path / "mcp.json", missing_ok=True) == []
    with pytest.raises(LlamaChatError) as raised:
        read_config(tmp_path / "mcp.json")
    assert str(raised.value) == f"{tmp_path / 'mcp.json'}: no such file"


@pytest.mark.parametrize("document, problem", [
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ("[" * 40 + "]" * 40, "not valid JSON (nested more than 32 levels deep)"),
    ([], 'expected a JSON object with the servers under "mcpServers"'),
    ({"mcp": {}}, 'no "mcpServers": list the servers under it ({"mcpServers": {"NAME": ...}})'),
    ({"mcpServers": {}, "servers": {}}, 'both "mcpServers" and "servers": keep one of them'),
    ({"mcpServers": []}, '"mcpServers" should be an object of servers by name'),
    ({"servers": {"a": "npx"}}, 'server "a": expected an object with "command" or "url"'),
    ({"mcpServers": {"my server": {"command": "x"}}},
     'server "my server": use a name of letters, digits, "_", "-" and "." (at most 64 characters)'),
    ({"mcpServers": {"a": {"args": ["x"]}}},
     'server "a": give "command" (a program to start) or "url" (a server on this machine)'),
    ({"mcpServers": {"a": {"command": "x", "url": "http://localhost/"}}}, 'server "a": give "command" or "url", not both'),
    ({"mcpServers": {"a": {"command": ""}}}, 'server "a": "command" should be a program\'s name or path'),
    ({"mcpServers": {"a": {"command": "x", "args": "--fast"}}}, 'server "a": "args" should be a list of strings'),
    ({"mcpServers": {"a": {"command": "x", "args": ["--port", 80]}}}, 'server "a": "args" should be a list of strings'),
    ({"mcpServers": {"a": {"command": "x", "env": {"PORT": 80}}}},
     'server "a": "env" should map variable names to strings (write numbers in quotes)'),
    ({"mcpServers": {"a": {"command": "x", "cwd": 3}}}, 'server "a": "cwd" should be a folder\'s path'),
    ({"mcpServers": {"a": {"command": "x", "disabled": "yes"}}}, 'server "a": "disabled" should be true or false'),
    ({"mcpServers": {"a": {"command": "x", "type": "http"}}},
     'server "a": "type": "http" does not go with "command" (use "stdio" or leave "type" out)'),
    ({"mcpServers": {"a": {"url": "http://localhost/sse", "type": "sse"}}},
     'server "a": "type": "sse" (the old HTTP transport) is not supported; give the server\'s streamable HTTP '
     'address, with "type": "http" or no type'),
    ({"mcpServers": {"a": {"url": "ftp://localhost/mcp"}}},
     'server "a": "url" should start with http:// or https:// (it is "ftp://localhost/mcp")'),
    ({"mcpServers": {"a": {"url": 8123}}}, 'server "a": "url" should be a string such as "http://127.0.0.1:8123/mcp"'),
    ({"mcpServers": {"a": {"url": "http://localhost:99999/mcp"}}},
     'server "a": "url" has a port that is not a number from 0 to 65535'),
    ({"mcpServers": {"a": {"url": "http:///mcp"}}}, 'server "a": "url" names no host'),
    ({"mcpServers": {"a": {"url": "https://mcp.example.com/mcp"}}},
     'server "a": mcp.example.com is not this machine; llama-chat connects only to MCP servers on this machine '
     "(localhost, 127.0.0.0/8, ::1), which see the conversation"),
    ({"mcpServers": {"a": {"url": "http://10.0.0.2/mcp"}}},
     'server "a": 10.0.0.2 is not this machine; llama-chat connects only to MCP servers on this machine '
     "(localhost, 127.0.0.0/8, ::1), which see the conversation"),
    ({"mcpServers": {"a": {"url": "http://localhost/mcp", "headers": {"X-Retries": 3}}}},
     'server "a": "headers" should map header names to strings'),
])
def test_each_problem_of_a_config_is_one_line_naming_the_file_and_server(tmp_path, document, problem):
    path = _write(tmp_path, document)
    with pytest.raises(LlamaChatError) as raised:
        read_config(path)
    assert str(raised.value) == f"{path}: {problem}"


def test_a_config_that_is_not_a_regular_file_is_refused_unread(tmp_path):
    fifo = tmp_path / "mcp.json"
    os.mkfifo(fifo)  # opened for reading, it would wait for a writer
    with pytest.raises(LlamaChatError) as raised:
        read_config(fifo)
    assert str(raised.value) == f"{fifo}: not a regular file"


@pytest.mark.parametrize("host, loopback", [
    ("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
    ("128.0.0.1", False), ("0.0.0.0", False), ("::", False), ("localhost.example.com", False), ("10.1.2.3", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_the_default_config_file_follows_xdg_config_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert paths.mcp_config_path() == tmp_path / "llama-chat" / "mcp.json"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.mcp_config_path() == tmp_path / "home" / ".config" / "llama-chat" / "mcp.json"


# Results and schemas, without a server


def test_a_result_as_text():
    image = base64.b64encode(b"\x89PNG" + bytes(996)).decode()
    result = types.CallToolResult(content=[
        types.TextContent(text="first"),
        types.ImageContent(data=image, mime_type="image/png"),
        types.AudioContent(data=base64.b64encode(bytes(10)).decode(), mime_type="audio/wav"),
        types.EmbeddedResource(resource=types.BlobResourceContents(
            uri="file:///a.bin", mime_type="application/octet-stream", blob=base64.b64encode(bytes(7)).decode())),
        types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///a.txt", text="resource text")),
        types.ResourceLink(uri="file:///b.csv", name="b", mime_type="text/csv", size=12345),
        types.TextContent(text="last"),
    ], structured_content={"ignored": "there is text"}, is_error=True)
    assert result_text(result) == ToolResult(
        "first\n[image: image/png, 1,000 bytes]\n[audio: audio/wav, 10 bytes]\n"
        "[resource file:///a.bin: application/octet-stream, 7 bytes]\nresource text\n"
        "[link to resource file:///b.csv: text/csv, 12,345 bytes]\nlast", is_error=True)


def test_structured_content_is_the_text_where_there_is_no_text():
    result = types.CallToolResult(content=[types.ImageContent(data="AAAA", mime_type="image/gif")],
                                  structured_content={"temperature": 21.5, "city": "Zürich"})
    assert result_text(result) == ToolResult('{"temperature": 21.5, "city": "Zürich"}\n[image: image/gif, 3 bytes]')


def test_a_cut_result_says_so():
    assert cut(ToolResult("abcdefghij", is_error=True), 4) == ToolResult(
        "abcd\n[cut: the output was 10 characters; only the first 4 are kept]", is_error=True)


@pytest.mark.parametrize("schema, problem", [
    ({"type": "object"}, None),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": ["integer", "null"]}]},
                                       "b": {"type": "array", "items": {"$ref": "#/$defs/c"}}},
      "$defs": {"c": True}, "required": ["a"], "x-unknown": {"type": 5}}, None),
    ({"properties": {}}, 'its input schema is not an object schema ({"type": "object", ...})'),
    ({"type": "array"}, 'its input schema is not an object schema ({"type": "object", ...})'),
    ({"type": "object", "properties": {"a": {"type": "text"}}},
     'its input schema is not valid JSON Schema ("type" "text" names no JSON type)'),
    ({"type": "object", "properties": {"a": 3}},
     "its input schema is not valid JSON Schema (a schema that is neither an object nor true or false)"),
    ({"type": "object", "required": "a"}, 'its input schema is not valid JSON Schema ("required" is not a list of '
                                          "property names)"),
    ({"type": "object", "properties": []}, 'its input schema is not valid JSON Schema ("properties" is not an object '
                                           "of schemas)"),
    ({"type": "object", "anyOf": []}, 'its input schema is not valid JSON Schema ("anyOf" is not a list of schemas)'),
    ({"type": "object", "properties": {"a": {"items": {"enum": "x"}}}},
     'its input schema is not valid JSON Schema ("enum" is not a list)'),
])
def test_input_schemas_are_checked(schema, problem):
    assert schema_problem(schema) == problem


def test_a_deep_schema_is_refused_before_anything_recurses_through_it():
    schema: dict = {"type": "object"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    assert schema_problem(schema) == "its input schema is not valid JSON Schema (nested more than 32 levels deep)"
