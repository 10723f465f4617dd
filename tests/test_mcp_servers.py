"""Tools from MCP servers: the config file, real servers (mcp-server-time; the npm filesystem
server where npm is), servers that misbehave in every way a stranger's can, and no server
process left once the servers are closed or the chat is killed."""

import argparse
import base64
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import mcp_types as types
import pytest

from llama_chat import paths
from llama_chat.chat.exchange import CallResult, Outcome
from llama_chat.chat.session import Session
from llama_chat.chat.tool_runner import DECLINED, Answer
from llama_chat.cli.chat import chat_parser
from llama_chat.cli.tool_options import add_tool_arguments, tool_use_from
from llama_chat.errors import LlamaChatError
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools.mcp_config import HttpServerConfig, StdioServerConfig, is_loopback, read_config
from llama_chat.tools.mcp_servers import McpServers, ServerState
from llama_chat.tools.mcp_stdio import MAX_MESSAGE_BYTES
from llama_chat.tools.mcp_tools import MAX_TOOLS, cut, result_text, schema_problem
from llama_chat.tools.tool import ToolResult

from .npm_server import HAS_NPM, install_filesystem_server
from .signals import ctrl_c_raises
from .test_session import chat_model
from .waiting import wait_until

# An asyncio transport left open to the garbage collector can print an error on the terminal:
# a failure here, as is the warning that it was left open.
pytestmark = [pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.filterwarnings("error::ResourceWarning")]

READY_SECONDS = 60  # generous: a server written in Python takes a second or two to start on a busy machine
GONE_SECONDS = 30  # generous too: a server left behind would run on for good, so ending at all is what counts
CALL_SECONDS = 300  # a call's limit where the test waits for what the call brings about

# A server written with the SDK: each tool is one way of behaving. "exit" as its argument: it
# exits at once, saying why on stderr.
SDK_SERVER = '''
import os, sys
import anyio
from mcp.server.mcpserver import MCPServer

if sys.argv[1] == "exit":
    print("no configuration found", file=sys.stderr)
    sys.exit(2)
marks = sys.argv[2]
server = MCPServer("test", log_level="WARNING")

@server.tool()
def say(text: str) -> str:
    """Say the text back."""
    return text

@server.tool()
async def wait(seconds: float) -> str:
    """Wait; a file says that the call came, another that it was cancelled."""
    open(os.path.join(marks, "started"), "w").close()
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        open(os.path.join(marks, "cancelled"), "w").close()
        raise
    return "waited"

@server.tool()
def flood(size: int) -> str:
    """A long text."""
    return "x" * size

@server.tool()
def crash() -> str:
    """Exit in the middle of the call."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)

server.run()
'''

# A server speaking JSON-RPC by hand, for what the SDK's server would not do. As "echo" (or
# "stubborn") it lists "echo"; otherwise "act", which does what its argument says. Given a
# file's path after that, it answers initialize only once that file exists.
RAW_SERVER = r'''
import json, os, sys, time
behaviour = sys.argv[1]
gate = sys.argv[2] if len(sys.argv) > 2 else None

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

def text(words, error=False):
    return {"content": [{"type": "text", "text": words}], "isError": error}

ECHO = {"name": "echo", "description": "Say the text back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}

def tools():
    listed = [ECHO] if behaviour in ("echo", "stubborn") else [dict(ECHO, name="act", description="Do the thing.")]
    if behaviour == "many":
        listed[0:0] = [
            dict(ECHO, name="wordy", description="w" * 100_000),
            dict(ECHO, name="huge_schema", inputSchema={"type": "object", "properties": {
                f"p{n}": {"type": "string", "description": "d" * 100} for n in range(1000)}}),
            dict(ECHO, name="not_object", inputSchema={"type": "string"}),
            dict(ECHO, name="bad_type", inputSchema={"type": "object", "properties": {"a": {"type": "text"}}}),
            dict(ECHO, name="bad name"),
            {"name": "no_schema"},
        ]
        listed += [dict(ECHO, name=f"tool_{n}") for n in range(5000)]
    return listed

def ask(method, params):
    """A request of the server's to the client; the error message it got back."""
    send({"jsonrpc": "2.0", "id": method, "method": method, "params": params})
    while True:
        reply = json.loads(sys.stdin.readline())
        if reply.get("id") == method:
            return reply.get("error", {}).get("message", "answered")

def act(request):
    if behaviour == "garbage":
        send({"jsonrpc": "2.0", "id": request["id"], "result": "not an object"})
    elif behaviour == "ask":
        refusals = [
            ask("sampling/createMessage", {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                                           "maxTokens": 10}),
            ask("elicitation/create", {"message": "Your name?", "requestedSchema": {
                "type": "object", "properties": {"name": {"type": "string"}}}}),
            ask("roots/list", {}),
        ]
        send({"jsonrpc": "2.0", "id": request["id"], "result": text("; ".join(refusals), error=True)})
    elif behaviour == "endless":
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "'
                         % json.dumps(request["id"]))
        while True:
            sys.stdout.write("x" * 65536)

for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request or "method" not in request or behaviour == "silent":
        continue
    if request["method"] == "initialize":
        while gate and not os.path.exists(gate):
            time.sleep(0.01)
        if behaviour == "garbage":
            print("this is not JSON-RPC", flush=True)
            print('{"jsonrpc": "2.0", "method": 12}', flush=True)
        send({"jsonrpc": "2.0", "id": request["id"], "result": {
            "protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": behaviour, "version": "1"}}})
    elif request["method"] == "tools/list":
        send({"jsonrpc": "2.0", "id": request["id"], "result": {"tools": tools()}})
    elif request["method"] == "tools/call" and request["params"]["name"] == "echo":
        send({"jsonrpc": "2.0", "id": request["id"], "result": text(request["params"]["arguments"]["text"])})
    elif request["method"] == "tools/call":
        act(request)
    else:
        send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no such method"}})
if behaviour == "stubborn":
    time.sleep(3600)  # its input closed, it goes on
'''

HTTP_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("web", log_level="INFO")

@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b

server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
'''


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("servers")
    written = {}
    for name, source in (("sdk", SDK_SERVER), ("raw", RAW_SERVER), ("http", HTTP_SERVER)):
        written[name] = folder / f"{name}_server.py"
        written[name].write_text(source)
    return written


@pytest.fixture
def raw(scripts):
    """A hand-written server behaving as told (ready once `gate` exists, where one is given)."""
    return lambda name, behaviour="echo", gate=None: StdioServerConfig(
        name, sys.executable, (str(scripts["raw"]), behaviour, *([str(gate)] if gate else [])))


@pytest.fixture
def sdk(scripts, tmp_path):
    """The SDK server (marks in tmp_path), or with "exit" one that exits at once."""
    return lambda name, behaviour="serve": StdioServerConfig(
        name, sys.executable, (str(scripts["sdk"]), behaviour, str(tmp_path)))


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be collected."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> set[int]:
    children, found, waiting = _children(), set(), [pid]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.add(child)
            waiting.append(child)
    return found


def _server_processes() -> set[int]:
    """This process's MCP servers: the guards it started and everything under them."""
    found = set()
    for pid in _descendants(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"llama_chat/tools/guard.py" in command:
            found |= {pid} | _descendants(pid)
    return found


def _closed_leaving_nothing(servers: McpServers) -> None:
    """Close the servers; not one of their processes may be left, nor anything of theirs
    that would complain when collected (see pytestmark)."""
    processes = _server_processes()
    assert processes, "no server process was running"
    servers.close()
    assert wait_until(lambda: not any(map(_alive, processes)), GONE_SECONDS), [pid for pid in processes if _alive(pid)]
    gc.collect()


def _tool(servers: McpServers, name: str):
    return next(tool for tool in servers.tools() if tool.spec.name == name)


def _states(servers: McpServers) -> dict[str, tuple[ServerState, str]]:
    return {status.name: (status.state, status.detail) for status in servers.status()}


def _still_works(servers: McpServers) -> None:
    """The well-behaved server "fine" beside a misbehaving one answers still."""
    assert _tool(servers, "echo").spec.source == "fine"
    assert _tool(servers, "echo").run({"text": "still here"}) == ToolResult("still here")


# The config file


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
    *[({"mcpServers": {name: {"command": "x"}}},
       f'server "{name}": use a name of letters, digits, "_", "-" and "." (at most 64 characters), with no "__" '
       'and no "_" at its end (a tool\'s full name is SERVER__TOOL)') for name in ("my server", "a__b", "a_", "")],
    ({"mcpServers": {"built-in": {"command": "x"}}},
     'server "built-in": that is what llama-chat\'s own tools are called; use another name'),
    ({"mcpServers": {"a": {"args": ["x"]}}},
     'server "a": give "command" (a program to start) or "url" (a server on this machine)'),
    ({"mcpServers": {"a": {"command": "x", "url": "http://localhost/"}}},
     'server "a": give "command" or "url", not both'),
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



def test_a_relative_xdg_config_home_is_ignored(monkeypatch, tmp_path):
    # A cloned repository holding llama-chat/mcp.json, the chat started in it with
    # XDG_CONFIG_HOME set to a relative path that names it there.
    repository = tmp_path / "repository"
    (repository / "llama-chat").mkdir(parents=True)
    _write(repository / "llama-chat", {"mcpServers": {"planted": {"command": sys.executable, "args": ["-c", ""]}}})
    monkeypatch.chdir(repository)
    monkeypatch.setenv("XDG_CONFIG_HOME", ".")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    parser = argparse.ArgumentParser()
    add_tool_arguments(parser)
    servers = tool_use_from(parser.parse_args([])).toolbox.servers
    if servers is not None:
        servers.close()
    assert servers is None  # the planted file was not read
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


# A real server


def test_mcp_server_time():
    command = str(Path(sys.executable).parent / "mcp-server-time")
    with McpServers([StdioServerConfig("time", command)]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        assert _states(servers) == {"time": (ServerState.READY, "2 tools")}
        assert sorted(tool.spec.name for tool in servers.tools()) == ["convert_time", "get_current_time"]
        tool = _tool(servers, "get_current_time")
        assert tool.spec.source == "time" and tool.refusal({}) is None and tool.preview({}) is None
        assert tool.spec.parameters["properties"]["timezone"]["type"] == "string"
        result = tool.run({"timezone": "Europe/Paris"})
        assert not result.is_error
        assert json.loads(result.text)["timezone"] == "Europe/Paris"
        _closed_leaving_nothing(servers)
        assert _states(servers) == {"time": (ServerState.STOPPED, "stopped")}
        assert servers.take_notices() == []


if HAS_NPM:
    @pytest.fixture(scope="module")
    def filesystem_server(tmp_path_factory) -> Path:
        return install_filesystem_server(tmp_path_factory.mktemp("npm"))

    def test_the_npm_filesystem_server(filesystem_server, tmp_path):
        """Collected only where npm is on the machine (CI has it)."""
        shared = tmp_path / "shared"
        (shared / "inside").mkdir(parents=True)
        (shared / "note.txt").write_text("written by the test\n")
        with McpServers([StdioServerConfig("files", str(filesystem_server), (str(shared),))]) as servers:
            assert servers.wait_ready(READY_SECONDS), servers.status()
            assert _states(servers)["files"][0] is ServerState.READY
            listing = _tool(servers, "list_directory").run({"path": str(shared)})
            assert not listing.is_error
            assert sorted(listing.text.splitlines()) == ["[DIR] inside", "[FILE] note.txt"]
            names = {tool.spec.name for tool in servers.tools()}
            reader = _tool(servers, "read_text_file" if "read_text_file" in names else "read_file")
            assert reader.run({"path": str(shared / "note.txt")}) == ToolResult("written by the test\n")
            _closed_leaving_nothing(servers)


# Servers from strangers


def test_servers_that_cannot_start(raw, sdk, tmp_path):
    servers = McpServers([
        StdioServerConfig("missing", "no-such-mcp-server"), sdk("quits", "exit"),
        StdioServerConfig("nowhere", sys.executable, cwd=tmp_path / "no-such-folder"), raw("fine"),
    ])
    with servers:
        assert servers.wait_ready(READY_SECONDS)
        missing = "could not start: it exited with status 127: cannot run no-such-mcp-server: No such file or directory"
        quits = "could not start: it exited with status 2: no configuration found"
        nowhere = f"could not start: cannot start it in {tmp_path / 'no-such-folder'} (No such file or directory)"
        assert _states(servers) == {"missing": (ServerState.FAILED, missing), "quits": (ServerState.FAILED, quits),
                                    "nowhere": (ServerState.FAILED, nowhere), "fine": (ServerState.READY, "1 tool")}
        assert sorted(servers.take_notices()) == sorted([
            f'MCP server "missing" {missing}', f'MCP server "quits" {quits}', f'MCP server "nowhere" {nowhere}'])
        assert servers.status()[1].stderr == ("no configuration found",)
        assert [tool.spec.source for tool in servers.tools()] == ["fine"]
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_what_a_server_writes_on_stderr_is_kept_short_and_off_the_terminal(raw, capfd):
    writer = "import sys; sys.stderr.write('x' * 100000 + '\\n\\x1b[31mlast words\\n'); sys.exit(1)"
    with McpServers([StdioServerConfig("noisy", sys.executable, ("-c", writer)), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        # A line is kept to its first 300 characters; control characters become spaces.
        assert servers.status()[0].stderr == ("x" * 300, "[31mlast words")
        assert servers.take_notices() == ['MCP server "noisy" could not start: it exited with status 1: [31mlast words']
        _still_works(servers)
        _closed_leaving_nothing(servers)
    assert capfd.readouterr() == ("", "")


def test_a_server_that_never_answers_initialize(raw):
    with McpServers([raw("silent", "silent"), raw("fine")], start_timeout_seconds=3) as servers:
        assert servers.wait_ready(READY_SECONDS)
        assert servers.take_notices() == ['MCP server "silent" could not start: it did not answer within 3 s']
        assert _states(servers)["silent"] == (ServerState.FAILED, "could not start: it did not answer within 3 s")
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_a_call_that_hangs_is_cancelled_at_the_time_limit(sdk, raw, tmp_path):
    with McpServers([sdk("slow"), raw("fine")], timeout_seconds=2) as servers:
        assert servers.wait_ready(READY_SECONDS)
        result = _tool(servers, "wait").run({"seconds": 60})  # a minute: it ends a test that would hang
        assert result == ToolResult('MCP server "slow" did not answer within 2 s; the request was cancelled',
                                    is_error=True)
        assert servers.take_notices() == [
            'MCP server "slow" did not answer a call to "wait" within 2 s; the request was cancelled']
        assert wait_until((tmp_path / "cancelled").exists, 10)  # the server heard: its tool was stopped
        assert _tool(servers, "say").run({"text": "after"}) == ToolResult("after")
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_ctrl_c_while_a_call_waits_cancels_the_request(sdk, tmp_path):
    # The call's limit is the test's: Ctrl-C comes once the server has the call, however
    # long a busy machine takes to get it there.
    with McpServers([sdk("slow")], timeout_seconds=CALL_SECONDS) as servers, ctrl_c_raises():
        assert servers.wait_ready(READY_SECONDS)
        started, returned = tmp_path / "started", threading.Event()

        def interrupt_once_the_call_is_in():
            if wait_until(lambda: started.exists() or returned.is_set(), CALL_SECONDS) and not returned.is_set():
                os.kill(os.getpid(), signal.SIGINT)

        interrupter = threading.Thread(target=interrupt_once_the_call_is_in, daemon=True)
        interrupter.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                _tool(servers, "wait").run({"seconds": CALL_SECONDS})
        finally:
            returned.set()
            interrupter.join()
        assert wait_until((tmp_path / "cancelled").exists, GONE_SECONDS)
        assert servers.take_notices() == []
        assert _tool(servers, "say").run({"text": "after"}) == ToolResult("after")
        _closed_leaving_nothing(servers)


def test_a_huge_result_is_cut(sdk, raw):
    with McpServers([sdk("big"), raw("fine")], output_cap=1000) as servers:
        assert servers.wait_ready(READY_SECONDS)
        result = _tool(servers, "flood").run({"size": 3 << 20})
        assert result == ToolResult("x" * 1000 + "\n[cut: the output was 3,145,728 characters; only the first 1,000 "
                                    "are kept]")
        assert servers.take_notices() == ['MCP server "big": the output of "flood" (3,145,728 characters) was cut '
                                          "to 1,000"]
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_a_server_writing_without_end_is_stopped(raw):
    with McpServers([raw("endless", "endless"), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        processes = _server_processes()
        ending = f"wrote a message of more than {MAX_MESSAGE_BYTES >> 20} MiB and was stopped"
        # Its answer is the error, not the time limit's.
        assert _tool(servers, "act").run({"text": "go"}) == ToolResult(
            f'MCP server "endless" {ending}, before it answered', is_error=True)
        assert servers.take_notices() == [f'MCP server "endless" {ending}']
        assert _states(servers)["endless"] == (ServerState.EXITED, ending)
        assert [tool.spec.source for tool in servers.tools()] == ["fine"]
        _still_works(servers)
        _closed_leaving_nothing(servers)
        assert not any(map(_alive, processes))


def test_a_server_that_crashes_during_a_call(sdk, raw):
    with McpServers([sdk("fragile"), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        crash = _tool(servers, "crash")
        ending = "exited with status 3: crashing on purpose"
        assert crash.run({}) == ToolResult(f'MCP server "fragile" {ending}, before it answered', is_error=True)
        assert servers.take_notices() == [f'MCP server "fragile" {ending}']
        assert _states(servers)["fragile"] == (ServerState.EXITED, ending)
        assert servers.status()[0].stderr[-1] == "crashing on purpose"
        # A tool of the server kept from before it ended says it is gone.
        assert crash.run({}) == ToolResult(f'MCP server "fragile" is not running ({ending})', is_error=True)
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_a_server_writing_lines_that_are_not_json_rpc(raw):
    with McpServers([raw("garbage", "garbage"), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        assert _states(servers)["garbage"] == (ServerState.READY, "1 tool")
        # A malformed answer fails its call at once, not at the time limit.
        assert _tool(servers, "act").run({"text": "go"}) == ToolResult(
            'MCP server "garbage" answered with an error: its answer was not a valid JSON-RPC message', is_error=True)
        assert servers.take_notices() == [
            'MCP server "garbage" wrote a line that is not JSON-RPC; lines like it are ignored']
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_a_server_asking_for_sampling_elicitation_and_roots_is_refused(raw):
    with McpServers([raw("asking", "ask"), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        assert _tool(servers, "act").run({"text": "go"}) == ToolResult(
            "Sampling not supported; Elicitation not supported; List roots not supported", is_error=True)
        assert servers.take_notices() == [
            f'MCP server "asking" asked for {method}, which llama-chat does not offer; it was refused'
            for method in ("sampling/createMessage", "elicitation/create", "roots/list")]
        _still_works(servers)
        _closed_leaving_nothing(servers)


def test_a_server_with_a_huge_list_of_tools(raw):
    with McpServers([raw("many", "many"), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        kept = MAX_TOOLS - 5  # five of the first are left out
        assert _states(servers)["many"] == (ServerState.READY, f"{kept} tools")
        offered = [tool for tool in servers.tools() if tool.spec.source == "many"]
        # Of the first MAX_TOOLS entries, seven come before tool_0.
        assert [tool.spec.name for tool in offered] == ["wordy", "act"] + [f"tool_{n}" for n in range(MAX_TOOLS - 7)]
        assert len(offered[0].spec.description) == 4096
        assert servers.take_notices() == [f'MCP server "many": {problem}' for problem in (
            f"it offers more than {MAX_TOOLS} tools; only the first {MAX_TOOLS} are used",
            'tool "wordy": its description was cut to 4096 characters',
            'tool "huge_schema" left out: its input schema is larger than 65536 characters',
            'tool "not_object" left out: its input schema is not an object schema ({"type": "object", ...})',
            'tool "bad_type" left out: its input schema is not valid JSON Schema ("type" "text" names no JSON type)',
            'tool "bad name" left out: a tool\'s name is 1 to 128 letters, digits, "_", "-" or "."',
            'tool "no_schema" left out: its entry in the tool list is not an MCP tool',
        )]
        _still_works(servers)
        _closed_leaving_nothing(servers)


@pytest.mark.parametrize("first", ["one", "two"])
def test_a_name_two_servers_list_is_their_full_names_whichever_was_ready_first(raw, tmp_path, first):
    gates = {name: tmp_path / name for name in ("one", "two")}
    later = {"one": "two", "two": "one"}[first]
    with McpServers([raw("one", gate=gates["one"]), raw("two", gate=gates["two"])], reserved_names=["act"]) as servers:
        gates[first].touch()
        assert wait_until(lambda: _states(servers)[first][0] is ServerState.READY, READY_SECONDS)
        assert [tool.spec.name for tool in servers.tools()] == ["echo"]  # no other lists it yet
        gates[later].touch()
        assert servers.wait_ready(READY_SECONDS)
        tools = {tool.spec.name: tool for tool in servers.tools()}
        assert sorted(tools) == ["one__echo", "two__echo"]
        assert [tools[f"{name}__echo"].spec.source for name in ("one", "two")] == ["one", "two"]
        assert tools[f"{later}__echo"].run({"text": "hi"}) == ToolResult("hi")
        assert sorted(servers.take_notices()) == [
            'MCP server "one": tool "echo" is called "one__echo" here: server "two" has a tool of that name',
            'MCP server "two": tool "echo" is called "two__echo" here: server "one" has a tool of that name']
        _closed_leaving_nothing(servers)


class Asking:
    """Answers each question about a call as told, and keeps the names of the calls asked about."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def show_call(self, call, tool, preview) -> None:
        pass

    def ask(self, call, tool):
        self.asked.append(call.name)
        return self.answers.pop(0)

    def show_result(self, call, result) -> None:
        pass


def _gated_chat(scripts, tmp_path, *flags: str):
    """The tools of a chat started with `flags` and servers "one" and "two" that both list
    "echo", each ready once its gate (a file in tmp_path named after it) exists."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        name: {"command": sys.executable, "args": [str(scripts["raw"]), "echo", str(tmp_path / name)]}
        for name in ("one", "two")}}))
    return tool_use_from(chat_parser().parse_args(["--mcp-config", str(config), *flags]))


def _call(name: str) -> ToolCall:
    return ToolCall(name, {"text": "hi"}, "call00001")


@pytest.mark.parametrize("first", ["one", "two"])
def test_consent_by_a_name_two_servers_list_is_refused_and_held_by_full_names(scripts, tmp_path, first):
    later = {"one": "two", "two": "one"}[first]
    tools = _gated_chat(scripts, tmp_path, "--allow-tools", "echo")
    session, view = Session(chat_model()), Asking(Answer.ALWAYS, Answer.NO)
    servers = tools.toolbox.servers
    try:
        (tmp_path / first).touch()
        assert wait_until(lambda: _states(servers)[first][0] is ServerState.READY, READY_SECONDS)
        assert tools.sync(session) == [] and session.offered_names() == ["echo"]
        # A server still starting may list "echo" too: the name allowed ahead allows nothing
        # yet. Asked, the user allows this tool always: its full name is kept.
        ran = tools.runner(session, view).run_call(_call("echo"))
        assert (ran.text, ran.outcome) == ("hi", Outcome.RAN)
        assert view.asked == ["echo"] and tools.consent.always == {f"{first}__echo"}
        (tmp_path / later).touch()
        assert servers.wait_ready(READY_SECONDS)
        notes = tools.sync(session)
        assert notes[-1] == ("--allow-tools echo: 2 tools are called that (one__echo, two__echo); none of them runs "
                             "without asking: allow one by its full name")
        assert sorted(session.offered_names()) == ["one__echo", "two__echo"]
        runner = tools.runner(session, view)
        assert runner.run_call(_call(f"{first}__echo")).outcome == Outcome.RAN  # allowed always, not asked
        assert runner.run_call(_call(f"{later}__echo")) == CallResult(DECLINED, Outcome.DECLINED)
        assert view.asked == ["echo", f"{later}__echo"]
        _closed_leaving_nothing(servers)
    finally:
        tools.close()


def test_a_full_name_allowed_ahead_runs_that_servers_tool_alone(scripts, tmp_path):
    tools = _gated_chat(scripts, tmp_path, "--allow-tools", "two__echo")
    session, view = Session(chat_model()), Asking(Answer.NO, Answer.NO)
    servers = tools.toolbox.servers
    try:
        (tmp_path / "two").touch()
        assert wait_until(lambda: _states(servers)["two"][0] is ServerState.READY, READY_SECONDS)
        tools.sync(session)
        assert tools.runner(session, view).run_call(_call("echo")).outcome == Outcome.RAN  # two's, by its own name
        (tmp_path / "one").touch()
        assert servers.wait_ready(READY_SECONDS)
        assert not any(note.startswith("--allow-tools") for note in tools.sync(session))
        runner = tools.runner(session, view)
        assert runner.run_call(_call("two__echo")).outcome == Outcome.RAN
        assert runner.run_call(_call("one__echo")).outcome == Outcome.DECLINED
        assert view.asked == ["one__echo"]
        _closed_leaving_nothing(servers)
    finally:
        tools.close()


def test_a_tool_named_like_one_of_the_chats_own(raw):
    with McpServers([raw("fine")], reserved_names=["echo"]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        assert [tool.spec.name for tool in servers.tools()] == ["fine__echo"]
        assert servers.take_notices() == [
            'MCP server "fine": tool "echo" is called "fine__echo" here: llama-chat has a tool of that name']
        _closed_leaving_nothing(servers)


def test_a_server_that_ignores_its_input_closing_is_stopped_anyway(raw):
    with McpServers([raw("stubborn", "stubborn")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        _closed_leaving_nothing(servers)
        assert _states(servers) == {"stubborn": (ServerState.STOPPED, "stopped")}
        assert servers.take_notices() == []


def test_closing_while_servers_start(raw, sdk):
    servers = McpServers([sdk("starting"), raw("silent", "silent")])
    servers.start()
    assert wait_until(lambda: len(_server_processes()) >= 4, READY_SECONDS)  # two guards, two servers
    _closed_leaving_nothing(servers)
    assert {state for state, _ in _states(servers).values()} == {ServerState.STOPPED}
    assert servers.tools() == []
    assert servers.take_notices() == []


def test_the_servers_end_with_a_killed_chat(scripts):
    """The chat killed while its servers run (SIGKILL: it cleans nothing up): soon after, no
    process of theirs is left."""
    chat = subprocess.Popen([sys.executable, "-c", (
        "import sys\n"
        "from llama_chat.tools.mcp_config import StdioServerConfig\n"
        "from llama_chat.tools.mcp_servers import McpServers\n"
        "servers = McpServers([StdioServerConfig(name, sys.executable, (sys.argv[1], 'echo')) for name in 'ab'])\n"
        "servers.start()\n"
        "print(servers.wait_ready(60), flush=True)\n"
        "sys.stdin.read()\n"
    ), str(scripts["raw"])], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with chat:
        try:
            assert chat.stdout.readline() == "True\n"
            processes = _descendants(chat.pid)
            assert len(processes) == 4  # two guards, two servers
            chat.kill()
            chat.wait()
            assert wait_until(lambda: not any(map(_alive, processes)), GONE_SECONDS), [
                pid for pid in processes if _alive(pid)]
        finally:
            chat.kill()


# Streamable HTTP


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_on_this_machine_reached_by_streamable_http(scripts, raw):
    port = _free_port()
    web = subprocess.Popen([sys.executable, str(scripts["http"]), str(port)], stderr=subprocess.PIPE, text=True)
    drain = threading.Thread(target=web.stderr.read)  # its request log must not fill the pipe
    try:
        for line in web.stderr:  # uvicorn says when it listens
            if "Uvicorn running on" in line:
                break
        drain.start()
        url = f"http://127.0.0.1:{port}/mcp"
        with McpServers([HttpServerConfig("web", url), raw("fine")]) as servers:
            assert servers.wait_ready(READY_SECONDS)
            assert _states(servers)["web"] == (ServerState.READY, "1 tool")
            add = _tool(servers, "add")
            assert add.spec.source == "web"
            assert add.run({"a": 2, "b": 3}) == ToolResult("5")
            assert servers.take_notices() == []
            _still_works(servers)
            servers.close()
            assert _states(servers)["web"] == (ServerState.STOPPED, "stopped")
    finally:
        web.kill()
        web.wait()
        if drain.is_alive():
            drain.join()
        web.stderr.close()


FLOOD_MIB = 600  # one answer's size, far past the bound

# The chat, alone in a process of its own so that its memory is its own: one call to the
# flooding server's tool, and how far its peak resident memory rose above where it was
# (the peak is reset before the call: Linux's clear_refs).
FLOODED_CHAT = """
import json, re, sys
from pathlib import Path
from llama_chat.tools.mcp_config import HttpServerConfig
from llama_chat.tools.mcp_servers import McpServers

def kib(field):
    return int(re.search(field + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1))

with McpServers([HttpServerConfig("flood", sys.argv[1])], timeout_seconds=600) as servers:
    assert servers.wait_ready(60), servers.status()
    flood = servers.tools()[0]
    Path("/proc/self/clear_refs").write_text("5")
    before = kib("VmRSS")
    result = flood.run({})
    grown = kib("VmHWM") - before
    print(json.dumps({"grown_mib": grown / 1024, "result": [result.text, result.is_error]}))
"""


class _FloodingServer(BaseHTTPRequestHandler):
    """A streamable-HTTP MCP server whose one tool answers with a JSON body of FLOOD_MIB,
    made as it is sent (chunked, no length said, gzipped where the server's `encoding`
    says so, whatever the client asked for), until the client hangs up."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in request:  # a notification
            return self._answer(202, b"")
        if request["method"] == "initialize":
            result = {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "flood", "version": "1"}}
        elif request["method"] == "tools/list":
            result = {"tools": [{"name": "flood", "inputSchema": {"type": "object"}}]}
        elif request["method"] == "tools/call":
            return self._flood(request["id"])
        else:
            body = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no such method"}}
            return self._answer(200, json.dumps(body).encode())
        self._answer(200, json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode())

    def do_GET(self) -> None:
        self._answer(405, b"")

    def do_DELETE(self) -> None:
        self._answer(405, b"")

    def log_message(self, *_) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _flood(self, request_id: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        if self.server.encoding == "gzip":
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        packer = zlib.compressobj(wbits=31) if self.server.encoding == "gzip" else None
        mebibyte = b"a" * (1 << 20)
        body = [b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "' % request_id,
                *[mebibyte] * FLOOD_MIB, b'"}]}}']
        try:
            for part in body:
                self.server.sent += len(part)
                self._chunk(packer.compress(part) if packer else part)
            self._chunk(packer.flush() if packer else b"")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client hung up
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        if data:  # an empty chunk would end the body
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


@pytest.mark.parametrize(("encoding", "refusal"), [
    ("identity", f"its answer is larger than {MAX_MESSAGE_BYTES >> 20} MiB, the most llama-chat reads of one answer"),
    ("gzip", "its answer is compressed (gzip), though llama-chat asks for answers uncompressed"),
], ids=["plain", "gzip"])
def test_an_http_servers_flood_is_cut_off_at_the_bound(encoding, refusal):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FloodingServer)
    server.sent, server.encoding = 0, encoding
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
        chat = subprocess.run([sys.executable, "-c", FLOODED_CHAT, url], capture_output=True, text=True, timeout=600)
        assert chat.returncode == 0, chat.stderr
        measured = json.loads(chat.stdout)
        assert measured["result"] == [
            f'MCP server "flood" answered with an error: Failed to parse JSON response: {refusal}', True]
        assert measured["grown_mib"] < 100
        if encoding == "identity":  # (gzip's whole flood fits in the socket's buffers)
            assert server.sent < FLOOD_MIB / 4 * (1 << 20)  # it stopped reading at the bound
    finally:
        server.shutdown()
        server.server_close()
        serving.join()


def test_an_http_server_that_is_not_there(raw):
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    with McpServers([HttpServerConfig("web", url), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        detail = f"could not start: cannot reach {url} (All connection attempts failed)"
        assert _states(servers)["web"] == (ServerState.FAILED, detail)
        assert servers.take_notices() == [f'MCP server "web" {detail}']
        _still_works(servers)
        _closed_leaving_nothing(servers)
