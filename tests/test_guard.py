"""A command started under the guard ends with the chat that started it, however the chat
ends, and takes what it started with it, however that detached; a command run_command
runs ends with its call, even one that stops or kills its guard."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from llama_chat.tools.folders import Folders
from llama_chat.tools.guard import CANNOT_START, children, guarded, state
from llama_chat.tools.shell_tool import RunCommand
from llama_chat.tools.tool import ToolResult

from .processes import MARK, marked, marker  # noqa: F401  (marker: a fixture)
from .signals import as_a_foreground_job, ctrl_c_raises
from .waiting import wait_until

# How long a command may take to end once it should: its sleepers would run for 300 s, so
# ending at all is what counts, and a busy machine may take more than a moment.
ENDING_SECONDS = 30
# What a chat that ends takes with it is gone within this: the target nothing of llama-chat's
# outlives a chat by (the guard looks for its chat every 50 ms). And what a command started is
# gone within this once its call has returned.
WITH_THE_CHAT_SECONDS = 2.0
# Each command starts a process that sleeps for minutes, detached in a way of its own, and
# waits until it is (the file "detached" says so); every process it starts carries its marker.
SLEEPER = "sh -c 'touch detached; exec sleep 300'"
DETACHED = "until [ -e detached ]; do sleep 0.01; done"
DETACHING = {
    "background": f"{SLEEPER} &",
    "double fork": f"({SLEEPER} &)",
    "nohup": f"nohup {SLEEPER} > /dev/null 2>&1 &",
    "setsid": f"setsid {SLEEPER} &",
    "setsid, forked": f"setsid -f {SLEEPER}",
    "setpgid": f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); open(\"detached\", \"w\"); "
               "time.sleep(300)' &",
    "ignoring TERM and HUP": f"{sys.executable} -c 'import os, signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); signal.signal(signal.SIGHUP, signal.SIG_IGN); os.setsid(); "
                             "open(\"detached\", \"w\"); time.sleep(300)' &",
}
# One that clears its environment: its marker on its command line.
BARE_SLEEPER = f"{sys.executable} -c 'import time; open(\"detached\", \"w\"); time.sleep(300)' ${MARK}"
AGAINST_THE_GUARD = {
    "stopping its guard": f"kill -STOP $PPID; setsid {SLEEPER} &",
    "killing its guard": f"kill -KILL $PPID; (setsid {SLEEPER} &)",
    "killing its guard, then clearing its environment": f"kill -KILL $PPID; (env -i setsid {BARE_SLEEPER} &)",
    "clearing its environment, then killing its guard": f"(env -i setsid {BARE_SLEEPER} &); sleep 0.5; "
                                                        "kill -KILL $PPID",
}


def _detaching(marker: str, way: str, then: str) -> str:
    return f"export {MARK}={marker}\n{(DETACHING | AGAINST_THE_GUARD)[way]}\n{DETACHED}\n{then}"


def _zombie_children() -> list[int]:
    return [pid for pid in children(os.getpid()) if state(pid) == "Z"]


def _wait_for_line(stream) -> str:
    line = stream.readline()
    assert line, "the command wrote nothing"
    return line.strip()


# The guard


def test_the_command_gets_the_streams_and_its_exit_status_comes_back():
    run = subprocess.run(guarded([sys.executable, "-c", "import sys; print(input()[::-1]); sys.exit(3)"]),
                         input="olleh\n", capture_output=True, text=True, timeout=30)
    assert (run.stdout, run.returncode) == ("hello\n", 3)


def test_a_command_that_cannot_start_says_so():
    run = subprocess.run(guarded(["/no/such/command"]), capture_output=True, text=True, timeout=30)
    assert run.returncode == CANNOT_START
    assert run.stderr == "cannot run /no/such/command: No such file or directory\n"


def test_the_command_starts_as_any_program_does():
    """No signal ignored or held: Python ignores SIGPIPE for itself, and `yes` would complain
    of a broken pipe."""
    run = subprocess.run(guarded(["sh", "-c", "yes | head -1; grep -E '^Sig(Blk|Ign)' /proc/self/status"]),
                         capture_output=True, text=True, timeout=30, preexec_fn=as_a_foreground_job)
    assert (run.stdout, run.stderr) == ("y\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n", "")


@pytest.mark.parametrize("way", DETACHING)
def test_what_the_command_leaves_running_is_ended_with_it(tmp_path, marker, way):
    run = subprocess.run(guarded(["sh", "-c", _detaching(marker, way, "echo done")]), cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert (run.stdout, run.returncode) == ("done\n", 0)
    assert marked(marker) == []  # gone by the time the guard has ended


def test_the_command_ends_with_the_chat(tmp_path, marker):
    """A chat killed (or its terminal closed) while a command runs: the command and what it
    started go with it, however that detached."""
    chat = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys\n"
         "from llama_chat.tools.guard import guarded\n"
         "command = subprocess.Popen(guarded(['sh', '-c', sys.argv[1]]), stdout=subprocess.PIPE)\n"
         "print(command.stdout.readline().decode().strip(), flush=True)\n"
         "command.wait()",
         _detaching(marker, "setsid", "echo started; exec sleep 301")],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    assert _wait_for_line(chat.stdout) == "started"
    chat.kill()
    chat.wait()
    assert wait_until(lambda: not marked(marker), WITH_THE_CHAT_SECONDS), marked(marker)


def test_stopping_the_guard_stops_the_command(tmp_path, marker):
    command = subprocess.Popen(guarded(["sh", "-c", _detaching(marker, "setsid", "echo started; exec sleep 301")]),
                               stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    assert _wait_for_line(command.stdout) == "started"
    command.terminate()
    assert command.wait(timeout=ENDING_SECONDS) == 128 + signal.SIGTERM
    assert marked(marker) == []  # gone by the time the guard has ended


def test_ctrl_c_in_the_terminal_does_not_reach_the_command():
    command = subprocess.Popen(guarded(["sh", "-c", "echo ready; exec sleep 300"]), stdout=subprocess.PIPE, text=True)
    assert _wait_for_line(command.stdout) == "ready"
    assert os.getpgid(command.pid) != os.getpgrp()
    command.terminate()
    command.wait(timeout=5)


# A command run_command runs, and what it started, end with its call

LIMIT = 1.0  # the time limit of the commands below that run on past it
ENDINGS = {"ends": "echo done", "runs on": "exec sleep 300"}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("way", [*DETACHING, *AGAINST_THE_GUARD])
def test_nothing_a_command_starts_outlives_its_call(tmp_path, marker, way, ending):
    run = RunCommand(Folders(tmp_path), seconds=LIMIT)
    zombies = _zombie_children()
    started = time.monotonic()
    result = run.run({"command": _detaching(marker, way, ENDINGS[ending])})
    took = time.monotonic() - started
    assert wait_until(lambda: not marked(marker), WITH_THE_CHAT_SECONDS), (result, marked(marker))
    assert took < LIMIT + 2.0, result  # the limit held, with the moment ending it takes
    assert _zombie_children() == zombies  # what came to this process (a killed guard's) is collected
    if way in DETACHING:  # one against its guard is ended at once (below)
        assert result == (ToolResult("done\n[exit status 0]") if ending == "ends" else ToolResult(
            f"[stopped after {LIMIT:g} s, the time limit for a command, with all it started: make it quicker, "
            "or ask the user to run it]", is_error=True))


@pytest.mark.parametrize("way", AGAINST_THE_GUARD)
def test_a_command_that_stops_or_kills_its_guard_is_ended_at_once(tmp_path, marker, way):
    """The run ends as soon as the chat sees, long before the limit, with all the command
    started, and says why."""
    run = RunCommand(Folders(tmp_path), seconds=ENDING_SECONDS)
    started = time.monotonic()
    result = run.run({"command": _detaching(marker, way, "exec sleep 300")})
    assert time.monotonic() - started < ENDING_SECONDS / 2
    assert result == ToolResult("[ended, with all it started, as it stopped or killed the process that watches it "
                                "(its parent): leave that process alone]", is_error=True)
    assert wait_until(lambda: not marked(marker), WITH_THE_CHAT_SECONDS), marked(marker)


def test_ctrl_c_ends_the_command_with_all_it_started_however_detached(tmp_path, marker):
    """Ctrl-C (SIGINT in the thread where the run waits) once the command has detached its
    sleeper: both are gone when KeyboardInterrupt goes on."""
    def interrupt() -> None:
        if wait_until((tmp_path / "detached").exists, ENDING_SECONDS):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    run = RunCommand(Folders(tmp_path), seconds=ENDING_SECONDS * 2)
    with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
        run.run({"command": _detaching(marker, "setsid", "exec sleep 301")})
    thread.join()
    assert wait_until(lambda: not marked(marker), WITH_THE_CHAT_SECONDS), marked(marker)
