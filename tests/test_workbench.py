"""The chat as a workbench: replies copied to the clipboard through the terminal (OSC 52),
files read into a message."""

import base64
import builtins
import errno
import io
import os
import re
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QType
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from rich.console import Console

from llama_chat.chat.attachments import MAX_FILE_BYTES, Attachment
from llama_chat.chat.session import Session
from llama_chat.cli import main
from llama_chat.repl.app import ChatCompleter
from llama_chat.repl.clipboard import known_to_accept, last_code_block, osc52

from .terminal import Terminal
from .test_gguf import tiny_hf_model, write_gguf
from .test_history_chat import kept_document
from .test_repl import chat, script_replies
from .test_session import GREEDY, chat_model

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
        chat.answer(b"/copy\r", b"no reply to copy yet", 30)
        chat.answer(b"hello\r", b"tok/s", 60)
        assert chat.read_prompt(30, after=chat.output.rindex(b"tok/s"))
        written = chat.answer(b"/copy\r", b"to the clipboard", 30)
        copied = clipboard_writes(written)
        # The reply as the history keeps it (after every input).
        kept = kept_document(tmp_path / "state")
        assert copied == [kept["messages"][1]["content"]] and copied[0], written
        assert f"copied {len(copied[0])} characters to the clipboard".encode() in written
        assert (b"not known to accept it (OSC 52)" in written) is note
        assert b"\x1b]52" not in chat.answer(b"/copy code\r", b"no code block", 30)
    finally:
        chat.kill()


def clipboard_writes(output: bytes | str) -> list[str]:
    """The texts OSC 52 sequences in the output put on the clipboard, decoded."""
    data = output.encode() if isinstance(output, str) else output
    return [base64.b64decode(payload, validate=True).decode() for payload in
            re.findall(rb"\x1b\]52;c;([A-Za-z0-9+/=]*)\x07", data)]


def test_copy_puts_the_reply_and_its_last_code_block_on_the_clipboard_whole(monkeypatch):
    """What /copy and /copy code write decodes to the reply's answer (its thinking left out)
    and to its last code block, character for character."""
    model = chat_model()
    thought = "<think>the user wants code</think>"
    reply = "Voilà, in two languages:\n" + REPLY + " — ✓"
    script_replies(monkeypatch, model, thought + reply)
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    code, output = chat(Session(model, GREEDY), "show me", "/copy", "/copy code", "/quit", console=console)
    assert code == 0
    assert clipboard_writes(output) == [reply, "first = 1\nsecond = 2\n"]
    assert f"copied {len(reply)} characters to the clipboard" in output
    assert "copied 21 characters to the clipboard" in output


# --- files read into a message -------------------------------------------------------------


@pytest.fixture
def files(tmp_path):
    (tmp_path / "notes.txt").write_text("the sky is blue\n")
    (tmp_path / "code.py").write_text("x = '```'\nprint(x)\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "big.txt").write_text("word " * 5000)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")  # read, it would wait for a writer
    return tmp_path


def test_read_puts_each_file_into_the_next_message_with_its_name(files):
    session = Session(chat_model(), GREEDY, context_size=512)
    code, shown = chat(session, f"/read {files}/notes.txt {files}/code.py", "/read", "what is in them?", "/quit")
    assert code == 0
    assert re.search(r"read \S*notes.txt: \d+ tokens for the next message; \d+ tokens of room left", shown)
    assert "read for the next message: " in shown and "code.py (" in shown
    sent = session.conversation.exchanges[0].user
    assert sent.startswith(f"{files}/notes.txt:\n```\nthe sky is blue\n```\n")
    # A fence longer than the backticks inside the file.
    assert f"{files}/code.py:\n````\nx = '```'\nprint(x)\n````\n" in sent and sent.endswith("\nwhat is in them?")
    tokens = [int(t) for t in re.findall(r": (\d+) tokens for the next message", shown)]
    blocks = [Attachment(str(files / name), (files / name).read_text(), 0).block() for name in ("notes.txt", "code.py")]
    assert tokens == [len(session.model.tokenizer.encode(block)) for block in blocks]
    _, shown = chat(session, "/read", "again", "/quit")
    assert "no files read for the next message" in shown and session.conversation.exchanges[1].user == "again"


@pytest.mark.parametrize("name, message", [
    ("image.png", r"image.png holds NUL bytes: it is a binary file, not text"),
    ("latin1.txt", r"latin1.txt is not UTF-8 text \(byte 3 is not\); /read takes text files"),
    ("missing.txt", r"missing.txt: no such file"),
    ("folder", r"folder is a folder; /read takes text files"),
    ("pipe", r"pipe is not a regular file \(a pipe or a device\); /read takes text files"),
    ("big.txt", r"big.txt is 250\d\d tokens; the context has room for \d+ more"),
    ("*.csv", r"\*.csv: no file matches"),
    ("notes.txt/inner", r"notes.txt/inner: cannot be read \(Not a directory\)"),
])
def test_read_refuses_in_one_line_and_nothing_is_added(files, name, message):
    session = Session(chat_model(), GREEDY, context_size=512)
    code, shown = chat(session, f"/read {files}/{name}", "hello", "/quit")
    assert code == 0 and re.search(message, shown), shown
    assert session.conversation.exchanges[0].user == "hello" and "Traceback" not in shown


def test_read_refuses_a_file_past_its_byte_cap_without_reading_it(files, monkeypatch):
    """One byte over MAX_FILE_BYTES is refused by its size alone; a file of exactly that size
    is read (and then refused as the binary file it is: sparse files hold NUL bytes)."""
    at_cap, over_cap = files / "at_cap.txt", files / "over_cap.txt"
    for path, size in ((at_cap, MAX_FILE_BYTES), (over_cap, MAX_FILE_BYTES + 1)):
        with open(path, "wb") as file:
            file.truncate(size)  # sparse: no disk space, nothing written
    read = []
    real_read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: read.append(path.name) or real_read_bytes(path))
    session = Session(chat_model(), GREEDY, context_size=512)
    code, shown = chat(session, f"/read {over_cap}", f"/read {at_cap}", "hello", "/quit")
    assert code == 0 and "Traceback" not in shown
    assert f"{over_cap} is {(MAX_FILE_BYTES + 1) / 1e6:.1f} MB, more than any context holds" in shown
    assert f"{at_cap} holds NUL bytes: it is a binary file, not text" in shown
    assert read == ["at_cap.txt"]  # the file over the cap was never read
    assert session.conversation.exchanges[0].user == "hello"


def test_read_of_a_file_it_may_not_open_is_one_line_and_the_chat_goes_on(files, monkeypatch):
    """A file without read permission. As root, permissions deny nothing, so the open is told
    to refuse as the system refuses anyone else."""
    secret = files / "secret.txt"
    secret.write_text("hidden\n")
    secret.chmod(0)

    def refusing(real_open):
        def opened(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.fspath(file) == str(secret):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
            return real_open(file, *args, **kwargs)
        return opened

    monkeypatch.setattr(io, "open", refusing(io.open))
    monkeypatch.setattr(builtins, "open", refusing(builtins.open))
    session = Session(chat_model(), GREEDY, context_size=512)
    code, shown = chat(session, f"/read {secret}", f"/read {files}/notes.txt", "hello", "/quit")
    assert code == 0 and "Traceback" not in shown
    assert f"{secret}: cannot be read (Permission denied)" in shown
    assert session.conversation.exchanges[0].user == f"{files}/notes.txt:\n```\nthe sky is blue\n```\n\nhello"


def test_read_takes_globs_and_quoted_paths_and_clear_lets_go(files):
    (files / "with space.txt").write_text("spaced\n")
    session = Session(chat_model(), GREEDY, context_size=512)
    _, shown = chat(session, f"/read {files}/*.py '{files}/with space.txt'", "/read clear", "hi", "/quit")
    assert shown.count("for the next message;") == 2 and "no files read for the next message" in shown
    assert session.conversation.exchanges[0].user == "hi"


def test_a_message_refused_for_length_keeps_the_files_read(files):
    session = Session(chat_model(), GREEDY, context_size=128)
    _, shown = chat(session, f"/read {files}/notes.txt", "x " * 400, "short", "/quit")
    assert "more than the context" in shown
    user = session.conversation.exchanges[0].user
    assert user.startswith(f"{files}/notes.txt:") and user.endswith("short")


def test_paths_complete_for_the_last_word_of_read(files):
    completer = ChatCompleter()
    text = f"/read {files}/notes.txt {files}/co"
    completions = list(completer.get_completions(Document(text), CompleteEvent()))
    assert [completion.text for completion in completions] == ["de.py"]


def test_file_flag_goes_into_the_one_shot_message(files, monkeypatch, capsys):
    sent = []
    real_send = Session.send
    monkeypatch.setattr(Session, "send", lambda self, text: sent.append(text) or real_send(self, text))
    model_file = write_gguf(files / "tiny.gguf", tiny_hf_model(seed=5), qtype=QType.F32)
    argv = ["-m", str(model_file), "--compile", "off", "--max-tokens", "2", "-p", "summarise"]
    assert main([*argv, "-f", str(files / "notes.txt")]) == 0
    assert sent == [f"{files}/notes.txt:\n```\nthe sky is blue\n```\n\nsummarise"]
    assert f"llama-chat: read {files}/notes.txt: " in capsys.readouterr().err
    assert main([*argv, "-f", str(files / "image.png")]) == 1
    assert "image.png holds NUL bytes" in capsys.readouterr().err and len(sent) == 1
