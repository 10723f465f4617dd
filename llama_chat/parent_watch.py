"""A child process of llama-chat's that serves only it (a decode step compiling, a template
renderer, a kernel build, a tensor-parallel rank) ends when the process that started it
ends, however that ends: killed, its terminal closed, or crashed. The parent names itself
on the child's command line; the child watches from a thread of its own whether it still
has that parent (Linux's parent-death signal would fire when the starting thread ends, not
the process). A stranger's command (an MCP server, a shell command) cannot watch: the
guard (tools/guard.py) watches for it."""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_SECONDS = 0.25  # how soon an orphaned child notices


def end_with_parent(parent: int | None) -> None:
    """Watch `parent` (None: started by hand, nothing to watch); once this process has
    another parent, end it, and with it its process group where it leads one (the tools it
    started: a build's compilers take SIGTERM from the build tool)."""
    if parent is None:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGKILL)  # whatever SIGTERM left running here

    threading.Thread(target=watch, name="parent watch", daemon=True).start()
