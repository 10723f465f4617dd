"""Tools from MCP servers: the config file, real servers (mcp-server-time; the npm filesystem
server where npm is), servers that misbehave in every way a stranger's can, and no server
process left once the servers are closed or the chat is killed."""

import base64
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import mcp_types as types
import pytest

from llama_chat import paths
from llama_chat.errors import LlamaChatError
from llama_chat.tools.mcp_config import HttpServerConfig, StdioServerConfig, is_loopback, read_config
from llama_chat.tools.mcp_servers import McpServers, ServerState
from llama_chat.tools.mcp_stdio import MAX_MESSAGE_BYTES
from llama_chat.tools.mcp_tools import MAX_TOOLS, cut, result_text, schema_problem
from llama_chat.tools.tool import ToolResult

from .npm_server import HAS_NPM, install_filesystem_server
from .waiting import wait_until

# An asyncio transport left open to the garbage collector can print an error on the terminal:
# a failure here, as is the warning that it was left open.
pytestmark = [pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.filterwarnings("error::ResourceWarning")]

READY_SECONDS = 60  # generous: a server written in Python takes a second or two to start on a busy machine
GONE_SECONDS = 30  # generous too: a server left behind would run on for good, so ending at all is what counts

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
# "stubborn") it lists "echo"; otherwise "act", which does what its argument says.
RAW_SERVER = r'''
import json, sys, time
behaviour = sys.argv[1]

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
    """A hand-written server behaving as told."""
    return lambda name, behaviour="echo": StdioServerConfig(name, sys.executable, (str(scripts["raw"]), behaviour))


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
    ({"mcpServers": {"my server": {"command": "x"}}},
     'server "my server": use a name of letters, digits, "_", "-" and "." (at most 64 characters)'),
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
    with McpServers([sdk("slow")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        started = tmp_path / "started"

        def interrupt_once_the_call_is_in():
            if wait_until(started.exists, READY_SECONDS):
                os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_the_call_is_in, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            _tool(servers, "wait").run({"seconds": 60})
        assert wait_until((tmp_path / "cancelled").exists, 10)
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


def test_tools_of_the_same_name_stay_apart(raw):
    with McpServers([raw("one"), raw("two")], reserved_names=["act"]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        tools = {tool.spec.name: tool for tool in servers.tools()}
        # The server ready first keeps the name; the other's tool has its server's name before it.
        first = tools["echo"].spec.source
        later = {"one": "two", "two": "one"}[first]
        assert sorted(tools) == ["echo", f"{later}__echo"]
        assert tools[f"{later}__echo"].spec.source == later
        assert tools[f"{later}__echo"].run({"text": "hi"}) == ToolResult("hi")
        assert servers.take_notices() == [f'MCP server "{later}": tool "echo" is called "{later}__echo" here: '
                                          f'server "{first}" has a tool of that name']
        _closed_leaving_nothing(servers)


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


def test_an_http_server_that_is_not_there(raw):
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    with McpServers([HttpServerConfig("web", url), raw("fine")]) as servers:
        assert servers.wait_ready(READY_SECONDS)
        detail = f"could not start: cannot reach {url} (All connection attempts failed)"
        assert _states(servers)["web"] == (ServerState.FAILED, detail)
        assert servers.take_notices() == [f'MCP server "web" {detail}']
        _still_works(servers)
        _closed_leaving_nothing(servers)
