"""A command started under the guard ends with the chat that started it, however the chat
ends, and takes what it started with it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llama_chat.tools.guard import CANNOT_START, guarded


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be collected."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# How long a command may take to end once it should: its sleepers would run for 300 s, so
# ending at all is what counts, and a busy machine may take more than a moment.
ENDING_SECONDS = 30
# What a chat that ends takes with it is gone within this: the target nothing of llama-chat's
# outlives a chat by (the guard looks for its chat every 50 ms).
WITH_THE_CHAT_SECONDS = 2.0


def _ended(*pids: int, seconds: float = ENDING_SECONDS) -> bool:
    """Whether the processes end within `seconds` (looked at every 50 ms)."""
    deadline = time.monotonic() + seconds
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(_alive, pids))


def _wait_for_line(stream) -> str:
    line = stream.readline()
    assert line, "the command wrote nothing"
    return line.strip()


def test_the_command_gets_the_streams_and_its_exit_status_comes_back():
    run = subprocess.run(guarded([sys.executable, "-c", "import sys; print(input()[::-1]); sys.exit(3)"]),
                         input="olleh\n", capture_output=True, text=True, timeout=30)
    assert (run.stdout, run.returncode) == ("hello\n", 3)


def test_a_command_that_cannot_start_says_so():
    run = subprocess.run(guarded(["/no/such/command"]), capture_output=True, text=True, timeout=30)
    assert run.returncode == CANNOT_START
    assert run.stderr == "cannot run /no/such/command: No such file or directory\n"


def test_what_the_command_leaves_running_is_ended_with_it():
    # The shell starts a sleeper in the background, says its pid and ends.
    run = subprocess.run(guarded(["sh", "-c", "sleep 300 & echo $!"]), capture_output=True, text=True, timeout=30)
    sleeper = int(run.stdout)
    assert _ended(sleeper)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGHUP"])
def test_the_command_ends_with_the_chat(signal_name):
    """A chat killed (or its terminal closed) while a command runs: the command and what it
    started go with it."""
    chat = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys\n"
         "from llama_chat.tools.guard import guarded\n"
         "command = subprocess.Popen(guarded(['sh', '-c', 'sleep 300 & echo $!; exec sleep 301']),"
         " stdout=subprocess.PIPE, text=True)\n"
         "print(command.pid, command.stdout.readline().strip(), flush=True)\n"
         "command.wait()"],
        stdout=subprocess.PIPE, text=True,
    )
    guard, sleeper = map(int, _wait_for_line(chat.stdout).split())
    assert _alive(guard) and _alive(sleeper)
    chat.send_signal(getattr(signal, signal_name))
    chat.wait()
    assert _ended(guard, sleeper, seconds=WITH_THE_CHAT_SECONDS)


def test_stopping_the_guard_stops_the_command():
    command = subprocess.Popen(guarded(["sh", "-c", "sleep 300 & echo $!; exec sleep 301"]),
                               stdout=subprocess.PIPE, text=True)
    sleeper = int(_wait_for_line(command.stdout))
    command.terminate()
    assert command.wait(timeout=ENDING_SECONDS) == 128 + signal.SIGTERM
    assert _ended(sleeper)


def test_ctrl_c_in_the_terminal_does_not_reach_the_command():
    command = subprocess.Popen(guarded(["sh", "-c", "echo ready; exec sleep 300"]), stdout=subprocess.PIPE, text=True)
    assert _wait_for_line(command.stdout) == "ready"
    assert os.getpgid(command.pid) != os.getpgrp()
    command.terminate()
    command.wait(timeout=5)
