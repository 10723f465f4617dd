"""The chat as a workbench: replies copied to the clipboard through the terminal (OSC 52),
files read into a message."""

import base64
import os
import re
import sys

import pytest
from gguf import GGMLQuantizationType as QType

from llama_chat.repl.clipboard import known_to_accept, last_code_block, osc52

from .terminal import Terminal
from .test_gguf import tiny_hf_model, write_gguf

REPLY = "Here:\n```python\nprint('a')\n```\nand\n~~~\nfirst = 1\nsecond = 2\n~~~\ndone"


def test_the_last_fenced_block_is_the_code_copied():
    assert last_code_block(REPLY) == "first = 1\nsecond = 2\n"
    assert last_code_block("```sh\nls\n```") == "ls\n"
    assert last_code_block("no code, only `inline`") is None
    assert last_code_block("```\nnever closed") is None


def test_osc52_carries_the_text_in_base64_for_the_clipboard():
    assert osc52("héllo") == "\x1b]52;c;" + base64.b64encode("héllo".encode()).decode() + "\a"


@pytest.mark.parametrize("environment, known", [
    ({"TERM": "xterm-kitty"}, True), ({"TERM": "screen", "TMUX": "/tmp/tmux-0/default,1,0"}, True),
    ({"TERM_PROGRAM": "iTerm.app", "TERM": "xterm-256color"}, True), ({"WT_SESSION": "x"}, True),
    ({"TERM": "xterm-256color"}, False), ({"TERM_PROGRAM": "Apple_Terminal"}, False), ({}, False),
])
def test_terminals_known_to_accept_a_clipboard_write(environment, known):
    assert known_to_accept(environment) is known


def chat_in_terminal(tmp_path, environment: dict[str, str]) -> Terminal:
    model_file = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5), qtype=QType.F32)
    command = [sys.executable, "-m", "llama_chat", "-m", str(model_file), "--compile", "off", "--temperature", "0",
               "--max-tokens", "8"]
    quiet = {name: "" for name in ("TMUX", "KITTY_WINDOW_ID", "WT_SESSION", "TERM_PROGRAM", "ALACRITTY_WINDOW_ID",
                                   "WEZTERM_PANE")}
    chat = Terminal(command, {**quiet, "XDG_STATE_HOME": str(tmp_path / "state"), **environment})
    assert chat.read_until(b"Ctrl-D leaves", 60), chat.text()
    return chat


@pytest.mark.parametrize("term, note", [("xterm-256color", True), ("xterm-kitty", False)])
def test_copy_writes_the_last_reply_as_osc_52(tmp_path, term, note):
    chat = chat_in_terminal(tmp_path, {"TERM": term})
    try:
        sent = len(chat.output)
        chat.type(b"/copy\r")
        assert chat.read_until(b"no reply to copy yet", 30, after=sent), chat.text()
        sent = len(chat.output)
        chat.type(b"hello\r")
        assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
        assert chat.read_prompt(30, after=chat.output.index(b"tok/s", sent))
        sent = len(chat.output)
        chat.type(b"/copy\r")
        assert chat.read_until(b"to the clipboard", 30, after=sent), chat.text()
        written = chat.output[sent:]
        sequence = re.search(rb"\x1b\]52;c;([A-Za-z0-9+/=]*)\x07", written)
        assert sequence is not None, written
        copied = base64.b64decode(sequence[1]).decode()
        assert copied and f"copied {len(copied)} characters to the clipboard".encode() in written
        assert (b"not known to accept it (OSC 52)" in written) is note
        sent = len(chat.output)
        chat.type(b"/copy code\r")
        assert chat.read_until(b"no code block", 30, after=sent), chat.text()
        assert b"\x1b]52" not in chat.output[sent:]
    finally:
        chat.kill()
