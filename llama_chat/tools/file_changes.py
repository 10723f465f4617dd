"""A change to a text file, as the user sees it before saying yes (a unified diff) and as
it is made (all at once: the new text goes to a file beside the old one, which then takes
its place, so that no one ever reads half of it)."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import secrets
from pathlib import Path

_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")  # lines end at "\n" alone, as the tools count them
NO_NEWLINE = "\\ No newline at end of file\n"


def lines_of(text: str) -> list[str]:
    """`text` cut into lines, each with its own ending."""
    return _LINE.findall(text)


def unified_diff(old: str | None, new: str, shown: str) -> str:
    """The change from `old` (None: no file yet) to `new` in the file shown as `shown`."""
    if old == new:
        return f"no change: {shown} already holds this text\n"
    if old is None and not new:
        return f"a new, empty file: {shown}\n"
    diff = difflib.unified_diff(lines_of(old or ""), lines_of(new), "/dev/null" if old is None else shown, shown)
    return "".join(line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}" for line in diff)


def write_atomically(path: Path, text: str) -> None:
    """Put `text` in the file at `path` (resolved) in one step, making the folders it needs;
    an existing file keeps its permissions. OSError passes through, with nothing left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = None  # a new file's, from the umask as open() applies it
    # A name of its own beside the file: short, whatever the file's is, and no one else's.
    temporary = path.with_name(f".{path.name[:64]}.{secrets.token_hex(6)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(text.encode("utf-8"))
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
