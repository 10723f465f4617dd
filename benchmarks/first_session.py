"""A new user's first chat, turn by turn: llama-chat started from a fresh home folder (nothing
built: its kernels build and its decode step compiles in the background), a message every
20 seconds, each turn's decode speed read off its statistics line. Then, in the same run,
what the chat does once everything is built (the steady state) and its eager rate on
llama-chat's kernels (--compile off), each in a new session of the same home.

    python benchmarks/first_session.py --turns 10 --every 20
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import select
import shutil
import statistics
import sys
import tempfile
import time

# A new question each turn: a repeated one would be drafted by prompt lookup from the last reply.
MESSAGES = [f"Tell me about {topic}, in a few sentences.\r".encode() for topic in (
    "the sea", "mountains", "rivers", "deserts", "forests", "the moon", "volcanoes", "glaciers", "islands", "caves",
    "storms", "rainbows", "tides", "comets", "coral reefs", "the wind")]
SPEED = re.compile(rb"(\d+) tokens, ([\d.]+) tok/s")


class Chat:
    """llama-chat on a pseudo-terminal."""

    def __init__(self, arguments: list[str], home: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ.update(HOME=home, COLUMNS="120", LINES="40", TERM="xterm")
            for variable in ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "LLAMA_CHAT_CACHE",
                             "LLAMA_CHAT_KERNELS_DIR"):
                os.environ.pop(variable, None)
            os.execv(sys.executable, [sys.executable, "-m", "llama_chat", *arguments])
        self.output = b""

    def read_for(self, seconds: float, until: bytes | None = None, after: int = 0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until and until in self.output[after:]):
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                self.output += data
                if b"\x1b[6n" in data:  # prompt_toolkit asks where the cursor is
                    os.write(self.fd, b"\x1b[1;1R")

    def turn(self, number: int) -> tuple[int, float]:
        """Send message `number`; (tokens, tok/s) of the reply."""
        start = len(self.output)
        os.write(self.fd, MESSAGES[number % len(MESSAGES)])
        self.read_for(600, b"tok/s", start)
        self.read_for(1, b"> ", len(self.output) - 4)
        found = SPEED.findall(self.output[start:])
        if not found:
            raise RuntimeError(self.output[start:].decode(errors="replace"))
        tokens, speed = found[-1]
        return int(tokens), float(speed)

    def close(self) -> None:
        os.write(self.fd, b"/quit\r")
        self.read_for(30)
        os.waitpid(self.pid, 0)


def session(arguments: list[str], home: str, turns: int, every: float) -> list[tuple[float, int, float]]:
    """(seconds since start, tokens, tok/s) of each turn, a message every `every` seconds."""
    started = time.monotonic()
    chat = Chat(arguments, home)
    try:
        chat.read_for(600, b"(/help")
        results = []
        for number in range(turns):
            wait = started + number * every - time.monotonic()
            if wait > 0:
                chat.read_for(wait)
            moment = time.monotonic() - started
            tokens, speed = chat.turn(number)
            results.append((moment, tokens, speed))
            print(f"  {moment:6.1f} s: {tokens} tokens at {speed:.1f} tok/s", flush=True)
        return results
    finally:
        chat.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--every", type=float, default=20.0)
    options = parser.parse_args()
    home = tempfile.mkdtemp(prefix="llama-chat-home-")
    common = ["--temperature", "0", "--max-tokens", "96", "--lookup", "0"]  # decode alone, no drafts
    try:
        print("a fresh home folder, nothing built:")
        first = session(common, home, options.turns, options.every)
        print("the same home, everything built (steady state):")
        steady = statistics.median(speed for _, _, speed in session(common, home, 4, 0))
        print("the same home, --compile off (eager, on llama-chat's kernels):")
        eager = statistics.median(speed for _, _, speed in session([*common, "--compile", "off"], home, 4, 0))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    later = [speed for moment, _, speed in first if moment >= 60]
    print(f"steady state {steady:.1f} tok/s, eager on llama-chat's kernels {eager:.1f} tok/s")
    print(f"first turn {first[0][2]:.1f} tok/s: {first[0][2] / eager:.0%} of the eager rate")
    if later:
        print(f"turns after the first minute: {min(later) / steady:.0%} to {max(later) / steady:.0%} of the steady state")
    return 0


if __name__ == "__main__":
    sys.exit(main())
