"""Waiting in tests for what another thread or process brings about, with no fixed sleep."""

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], seconds: float = 30.0) -> bool:
    """Whether `condition()` comes to hold within `seconds` (looked at every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
