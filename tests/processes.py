"""Finding the processes a test's command started, however they detached: by a marker of
the test's own in their command line or environment."""

import os
import signal
import time
from pathlib import Path

import pytest

MARK = "LLAMA_CHAT_TEST_MARK"  # a command exports it, and every process it starts inherits it


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be collected."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def marked(marker: str) -> list[int]:
    """The live processes with `marker` in their command line or environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not alive(int(entry)):
            continue
        try:
            if any(marker.encode() in Path(f"/proc/{entry}/{part}").read_bytes() for part in ("cmdline", "environ")):
                found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


@pytest.fixture
def marker():
    """A marker of the test's own; what a failed test left running is killed after it."""
    marker = f"marked-{os.getpid()}-{time.monotonic_ns()}"
    yield marker
    for pid in marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
