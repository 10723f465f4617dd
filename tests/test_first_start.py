"""A new install's first minutes: llama-chat's kernels build in the background while the chat
runs on PyTorch's, and the chat moves onto them once they are built; a one-shot reply sees
its build through; and a chat killed (SIGKILL, or SIGHUP as a closed terminal sends) while
its kernels build or its decode step compiles leaves nothing of llama-chat's running."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyte
import pytest

from llama_chat import environment

from .signals import as_a_foreground_job
from .terminal import Terminal
from .test_gguf import QType, tiny_hf_model, write_gguf

BUILD_SECONDS = 600  # a build with one compiler at a time, at the lowest priority, on a busy machine
# For the work of a chat that was killed to end. Its processes notice within a quarter of a
# second (parent_watch.py), but run at the lowest priority: on a busy machine they may wait
# for a core for seconds. What counts is that they end.
ENDING_SECONDS = 120


def fresh_kernels(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine where nothing is built yet (the run's own cache apart)."""
    variables = {**os.environ, "LLAMA_CHAT_CACHE": str(tmp_path / "cache"),
                 "LLAMA_CHAT_KERNELS_DIR": str(tmp_path / "kernels")}
    for inherited in ("LLAMA_CHAT_KERNELS", environment.LOADED_LIBRARY):
        variables.pop(inherited, None)
    return variables


def built_library(tmp_path: Path) -> list[Path]:
    """The libraries a build has put in place. The compiler links its output in a work folder
    beside them first; only a library in place has its record (written just before it)."""
    libraries = (tmp_path / "kernels").glob("*/llama_chat_kernels.so")
    return [library for library in libraries if library.with_name(library.name + ".sha256").exists()]


def group_members(group: int) -> list[int]:
    """The live processes of a process group (zombies left out), read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def ends_within(group: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(group)


STARTS_A_BUILD = (
    "import time\n"
    "from llama_chat import environment\n"
    "from llama_chat.kernels import native_build, native_state\n"
    "from llama_chat.paths import configure\n"
    "configure(environment.folders())\n"
    "native_state.load_or_build()\n"
    "print(native_build.started_build()[1].pid, flush=True)\n"
    "time.sleep(600)\n"
)

STARTS_A_COMPILE = (
    "import sys, time\n"
    "import llama_chat\n"
    "from llama_chat import environment\n"
    "from llama_chat.paths import configure\n"
    "configure(environment.folders())\n"  # the test's cache, and the run's kernels
    "model = llama_chat.load(sys.argv[1], device='cpu')\n"
    "runner = model.runner\n"
    "runner.compile(background=True)\n"
    "while runner.pending.process is None:\n"
    "    time.sleep(0.01)\n"
    "print(runner.pending.process.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.parametrize("work", ["build", "compile"])
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGHUP"])
def test_work_in_the_background_ends_with_the_chat(tmp_path, work, signal_name):
    """The chat killed while its kernels build or its decode step compiles: the child and
    everything it started (compilers) are gone."""
    if work == "build":
        arguments, variables = ["-c", STARTS_A_BUILD], fresh_kernels(tmp_path)
    else:
        # A cache of the test's own, where no compiled step is kept yet: the compile starts.
        model = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(), qtype=QType.Q8_0)
        arguments = ["-c", STARTS_A_COMPILE, str(model)]
        variables = {**os.environ, "LLAMA_CHAT_CACHE": str(tmp_path / "cache")}
    chat = subprocess.Popen([sys.executable, *arguments], env=variables, stdout=subprocess.PIPE, text=True,
                            preexec_fn=as_a_foreground_job)
    try:
        child = int(chat.stdout.readline())
        assert group_members(child)  # at work, in a process group of its own
        chat.send_signal(getattr(signal, signal_name))
        chat.wait(timeout=60)
        assert ends_within(child, ENDING_SECONDS), f"left running: {group_members(child)}"
    finally:
        chat.kill()
        chat.wait()
        chat.stdout.close()


def test_a_one_shot_reply_sees_its_build_through(tmp_path):
    path = write_gguf(tmp_path / "q4_0.gguf", tiny_hf_model(seed=5), qtype=QType.Q4_0)
    command = [sys.executable, "-m", "llama_chat", "--model", str(path), "-p", "hi", "--max-tokens", "4",
               "--temperature", "0", "--compile", "off"]
    result = subprocess.run(command, env=fresh_kernels(tmp_path), capture_output=True, text=True,
                            timeout=BUILD_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the reply came first, on PyTorch's kernels
    assert "llama-chat: finishing the build of llama-chat's kernels, once (Ctrl-C leaves it for the next run)" \
        in result.stderr
    assert len(built_library(tmp_path)) == 1


def screen_of(output: bytes) -> list[str]:
    """What a terminal of 200 columns shows after these bytes (redraws applied)."""
    screen = pyte.Screen(200, 60)
    pyte.ByteStream(screen).feed(output)
    return [line.rstrip() for line in screen.display if line.strip()]


def command_output(chat: Terminal, line: bytes) -> str:
    """What a slash command writes, up to the next prompt."""
    sent = len(chat.output)
    chat.type(line + b"\r")
    assert chat.read_prompt(120, sent + len(line)), chat.text()
    return chat.output[sent:].decode(errors="replace")


def test_the_chat_moves_onto_the_kernels_once_they_are_built(tmp_path):
    path = write_gguf(tmp_path / "q4_0.gguf", tiny_hf_model(seed=5), qtype=QType.Q4_0)
    command = [sys.executable, "-m", "llama_chat", "--model", str(path), "--temperature", "0",
               "--max-tokens", "4", "--compile", "off"]
    chat = Terminal(command, {**fresh_kernels(tmp_path), "COLUMNS": "200", "TERM": "xterm"})
    try:
        assert chat.read_prompt(120, 0), chat.text()
        first = command_output(chat, b"/device")
        assert "building in the background" in first
        assert b"tok/s" in chat.answer(b"hello\r", b"tok/s", 120)
        deadline = time.monotonic() + BUILD_SECONDS
        while not built_library(tmp_path):  # the prompt waits; the build goes on
            assert time.monotonic() < deadline, "the kernels were not built"
            chat.read_until(b"\0never", 1.0)
        moved = chat.answer(b"hello again\r", b"tok/s", 300).decode(errors="replace")
        assert "llama-chat's kernels are built: q4_0.gguf runs on cpu" in moved, "\n".join(screen_of(chat.output))
        assert "(the conversation goes on)" in moved
        device = command_output(chat, b"/device")
        shown = "\n".join(screen_of(device.encode()))
        assert "building in the background" not in shown and "weights" in shown
        chat.type(b"/quit\r")
        assert chat.exit_code(60) == 0
    finally:
        chat.kill()
