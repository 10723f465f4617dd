"""Tools end to end, in the chat on a pseudo-terminal and in a one-shot reply, with real MCP
servers (mcp-server-time; the npm filesystem server where npm is on the machine) and a tiny
model trained here to call them (tests/calling_gguf.py): the call is shown and asked about,
yes runs it and the reply uses its result, no is told to the model, and no server is left
running when the chat ends."""

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from llama_chat.tools.mcp_config import StdioServerConfig
from llama_chat.tools.mcp_servers import McpServers

from .calling_gguf import (
    DECLINED_ANSWER,
    FOLDERS_ANSWER,
    FOLDERS_QUESTION,
    TIME_QUESTION,
    day_answer,
    write_calling_model,
)
from .npm_server import HAS_NPM, install_filesystem_server
from .terminal import Terminal

TOOLS = ["get_current_time", *(["list_allowed_directories"] if HAS_NPM else [])]
SECONDS = 120


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The MCP config, the folder the filesystem server may read, and the trained model."""
    folder = tmp_path_factory.mktemp("tools-chat")
    servers = {"time": {"command": str(Path(sys.executable).parent / "mcp-server-time")}}
    shared = folder / "shared"
    shared.mkdir()
    if HAS_NPM:
        command = install_filesystem_server(folder / "npm")
        servers["files"] = {"command": str(command), "args": [str(shared)]}
    config = folder / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    configs = [StdioServerConfig(name, entry["command"], tuple(entry.get("args", ())))
               for name, entry in servers.items()]
    with McpServers(configs) as running:  # the tools as the chat will offer them, and what the listing says
        assert running.wait_ready(SECONDS)
        tools = {tool.spec.name: tool for tool in running.tools()}
        listing = tools["list_allowed_directories"].run({}).text if HAS_NPM else None
    model = write_calling_model(folder / "caller.gguf", [tools[name].spec for name in TOOLS], listing, paris_day())
    return config, model, shared


def chat_command(setup, *extra: str) -> list[str]:
    config, model, _ = setup
    return [sys.executable, "-m", "llama_chat", "-m", str(model), "--compile", "off", "--temperature", "0",
            "--quantize", "none", "--kv-dtype", "float32",
            "--mcp-config", str(config), "--tools", ",".join(TOOLS), *extra]


def paris_day() -> str:
    return datetime.now(ZoneInfo("Europe/Paris")).strftime("%A")


def servers_of(pid: int) -> list[int]:
    """The guards of the chat's MCP servers (children of any of its threads running the guard)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    children = [child for task in tasks for child in (task / "children").read_text().split()]
    return [int(child) for child in children
            if b"llama_chat/tools/guard.py" in Path(f"/proc/{child}/cmdline").read_bytes()]


def test_the_chat_asks_runs_on_yes_tells_the_model_of_no_and_leaves_nothing(setup):
    chat = Terminal(chat_command(setup), {"COLUMNS": "200", "LINES": "50", "TERM": "xterm"})
    try:
        assert chat.read_prompt(SECONDS, 0), chat.text()
        # The servers start in the background; /mcp says when they are ready.
        deadline = time.monotonic() + SECONDS
        while True:
            shown = chat.answer(b"/mcp\r", b"> ", SECONDS).decode(errors="replace")
            if "time: ready" in shown and (not HAS_NPM or "files: ready" in shown):
                break
            assert time.monotonic() < deadline, chat.text()
            chat.read_until(b"\0never", 0.5)  # a moment before asking again
        guards = servers_of(chat.pid)
        assert len(guards) == len(TOOLS)

        asked = chat.answer(TIME_QUESTION.encode() + b"\r", b"run get_current_time?", SECONDS).decode()
        assert '⚙ get_current_time (MCP server "time") {"timezone": "Europe/Paris"}' in asked
        answered = chat.answer(b"y\r", b"tok/s", SECONDS).decode()
        assert "→ get_current_time: ran" in answered
        assert day_answer(paris_day()) in answered, answered  # the reply uses what the server said
        assert "1 tool call" in answered

        chat.answer(b"/clear\r", b"> ", SECONDS)
        chat.answer(TIME_QUESTION.encode() + b"\r", b"run get_current_time?", SECONDS)
        declined = chat.answer(b"n\r", b"tok/s", SECONDS).decode()
        assert "→ get_current_time: declined" in declined and DECLINED_ANSWER in declined

        if HAS_NPM:
            _, _, shared = setup
            chat.answer(b"/clear\r", b"> ", SECONDS)
            asked = chat.answer(FOLDERS_QUESTION.encode() + b"\r", b"run list_allowed_directories?", SECONDS).decode()
            assert '⚙ list_allowed_directories (MCP server "files") {}' in asked
            listed = chat.answer(b"a\r", b"tok/s", SECONDS).decode()
            assert str(shared.resolve()) in listed and FOLDERS_ANSWER in listed

        chat.type(b"/quit\r")
        assert chat.exit_code(SECONDS) == 0
        assert [guard for guard in guards if Path(f"/proc/{guard}").exists()] == []
    finally:
        chat.kill()


def test_a_one_shot_reply_declines_unless_allowed_ahead(setup):
    command = chat_command(setup, "-p", TIME_QUESTION)
    declined = subprocess.run(command, capture_output=True, text=True, timeout=SECONDS * 2)
    assert declined.returncode == 0, declined.stderr
    assert declined.stdout == DECLINED_ANSWER + "\n"
    assert "llama-chat: declined get_current_time: nobody can be asked with -p; allow it ahead with " \
           "--allow-tools get_current_time" in declined.stderr
    allowed = subprocess.run([*command, "--allow-tools", "get_current_time"], capture_output=True, text=True,
                             timeout=SECONDS * 2)
    assert allowed.stdout == day_answer(paris_day()) + "\n", allowed.stderr
