"""The tools that look without changing anything: read_file (a text file's lines) and
list_directory (a folder's entries), each within bounds that keep a reply's context whole."""

from __future__ import annotations

import codecs
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.places import FileTool, existing_file, existing_folder
from llama_chat.tools.text_files import error_reason, open_regular, sniff_binary
from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_LINES = 2000  # the most lines read_file gives at once
MAX_BYTES = 256 * 1024  # ... and the most bytes
MAX_ENTRIES = 1000  # the most entries list_directory gives
CAPS = f"{MAX_LINES} lines or {MAX_BYTES // 1024} KiB"
_SKIP_CHUNK = 1 << 16  # a line passed over is read this much at a time, however long it is


class ReadFile(FileTool):
    """read_file: a text file's lines, from an offset, at most MAX_LINES or MAX_BYTES at once."""

    spec = ToolSpec(
        name="read_file",
        description=(
            f"Read a text file. Gives its lines as they are, at most {CAPS} at a time, with a note at the end "
            "saying how to read on when the file is longer. Binary files are refused."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1,
                         "description": "The file: relative to the working folder, or absolute."},
                "offset": {"type": "integer", "minimum": 1, "description": "The first line to give (1: the first)."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LINES,
                          "description": "How many lines to give (all from offset on, up to the caps, if left out)."},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    )

    def _run(self, path: Path, arguments: Mapping[str, Any]) -> ToolResult:
        shown = self.folders.shown(path)
        try:
            with open_regular(path) as file:
                return _lines(file, shown, arguments.get("offset", 1), arguments.get("limit"))
        except OSError as error:
            return ToolResult(f"read_file: cannot read {shown} ({error_reason(error)})", is_error=True)

    def _checked(self, arguments: Mapping[str, Any]) -> Path:
        check_arguments(self.spec, arguments)
        given = arguments["path"]
        path = existing_file(self.folders, "read_file", given)
        try:
            binary = sniff_binary(path)
        except OSError as error:
            raise Refused(f"read_file: cannot read {given} ({error_reason(error)})") from None
        if binary:
            raise Refused(f"read_file: {given} is a binary file (not UTF-8 text): read_file reads text files only")
        return path


def _lines(file: io.BufferedReader, shown: str, offset: int, limit: int | None) -> ToolResult:
    """The lines of `file` from `offset` on: `limit` of them, or as many as the caps allow."""
    passed = _pass_lines(file, offset - 1)
    taken: list[bytes] = []
    budget = MAX_BYTES
    past_bytes = False  # the next line would pass MAX_BYTES
    long_line = False  # the first line alone passes it: its start is given
    while len(taken) < (limit or MAX_LINES):
        line = file.readline(budget + 1)
        if not line:
            break
        if len(line) > budget:
            past_bytes = True
            long_line = not taken
            if long_line:
                taken.append(line[:budget])
                if not line.endswith(b"\n"):
                    _pass_lines(file, 1)  # the rest of it
            break
        taken.append(line)
        budget -= len(line)
    if not taken:
        if passed == 0:
            return ToolResult(f"[{shown} is empty]")
        return ToolResult(f"read_file: offset {offset} is past the end of {shown}, which has {passed} "
                          f"line{'s' if passed != 1 else ''}: give an offset from 1 to {passed}", is_error=True)
    try:  # a long line's start may end inside a character: that character is left out
        text = codecs.getincrementaldecoder("utf-8")().decode(b"".join(taken), final=not long_line)
    except UnicodeDecodeError:
        return ToolResult(f"read_file: {shown} is not all UTF-8 text (lines {offset} to {offset + len(taken) - 1} "
                          "have bytes that are not): read_file reads text files only", is_error=True)
    last = offset + len(taken) - 1
    read_on = f"read on with offset={last + 1}"
    if long_line:
        more = f": {read_on}" if file.peek(1) else ""
        return _noted(text, f"[line {last} of {shown} is longer than {MAX_BYTES // 1024} KiB, the most read_file "
                            f"gives at a time; only its start is shown{more}]")
    if past_bytes or (limit is None and len(taken) == MAX_LINES and file.peek(1)):
        return _noted(text, f"[lines {offset} to {last} of {shown} are shown, as read_file gives at most {CAPS} "
                            f"at a time: {read_on}]")
    return ToolResult(text)


def _noted(text: str, note: str) -> ToolResult:
    """`text` with a note on a line of its own after it."""
    return ToolResult(f"{text}\n{note}" if not text.endswith("\n") else f"{text}{note}")


def _pass_lines(file: io.BufferedReader, count: int) -> int:
    """Pass over `count` lines of `file`, however long; how many there were."""
    for passed in range(count):
        line = file.readline(_SKIP_CHUNK)
        if not line:
            return passed
        while not line.endswith(b"\n"):
            line = file.readline(_SKIP_CHUNK)
            if not line:
                break
    return count


class ListDirectory(FileTool):
    """list_directory: a folder's entries by name, at most MAX_ENTRIES."""

    spec = ToolSpec(
        name="list_directory",
        description=(
            "List a folder's entries, sorted by name: a folder with a / after its name, a file with its size, "
            "a link with where it points. At most 1000 entries."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "default": ".",
                         "description": "The folder: relative to the working folder, or absolute (the working "
                                        "folder, '.', if left out)."},
            },
            "required": [],
            "additionalProperties": False,
        },
    )

    def _run(self, path: Path, arguments: Mapping[str, Any]) -> ToolResult:
        shown = self.folders.shown(path)
        try:
            with os.scandir(path) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            return ToolResult(f"list_directory: cannot list {shown} ({error_reason(error)})", is_error=True)
        if not entries:
            return ToolResult(f"[{shown} is empty]")
        lines = [_entry(entry) for entry in entries[:MAX_ENTRIES]]
        if len(entries) > MAX_ENTRIES:
            lines.append(f"[the first {MAX_ENTRIES} of {len(entries)} entries are shown: "
                         "search_files finds the others by a pattern]")
        return ToolResult("\n".join(lines))

    def _checked(self, arguments: Mapping[str, Any]) -> Path:
        check_arguments(self.spec, arguments)
        return existing_folder(self.folders, "list_directory", arguments.get("path", "."))


def _entry(entry: os.DirEntry[str]) -> str:
    """One entry as a line: `name/`, `name  N bytes`, `name -> target`."""
    try:
        if entry.is_symlink():
            return f"{entry.name} -> {os.readlink(entry.path)}"
        if entry.is_dir(follow_symlinks=False):
            return f"{entry.name}/"
        if entry.is_file(follow_symlinks=False):
            return f"{entry.name}  {entry.stat(follow_symlinks=False).st_size:,} bytes"
    except OSError:  # gone since the folder was listed
        return entry.name
    return f"{entry.name}  (a pipe, socket or device)"
