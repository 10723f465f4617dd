"""The tools that look without changing anything: read_file (a text file's lines) and
list_directory (a folder's entries), each within bounds that keep a reply's context whole."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.folders import Place
from llama_chat.tools.places import Call, FileTool, existing_file, existing_folder
from llama_chat.tools.text_files import READ_BUFFER, NotText, error_reason, open_regular, sniff_binary
from llama_chat.tools.time_limit import TimeLimit
from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_LINES = 2000  # the most lines read_file gives at once
MAX_BYTES = 256 * 1024  # ... and the most bytes
MAX_ENTRIES = 1000  # the most entries list_directory gives
CAPS = f"{MAX_LINES} lines or {MAX_BYTES // 1024} KiB"
MAX_PASSED_BYTES = 256 << 20  # the furthest into a file read_file reads to find the line asked for


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

    def _run(self, checked: tuple[Place, io.BufferedReader], arguments: Mapping[str, Any], call: Call) -> ToolResult:
        place, file = checked
        shown = self.folders.shown(place.path)
        offset = arguments.get("offset", 1)
        try:
            return _lines(file, shown, offset, arguments.get("limit"), call.limit)
        except OSError as error:
            return ToolResult(f"read_file: cannot read {shown} ({error_reason(error)})", is_error=True)
        except NotText:
            return ToolResult(f"read_file: {shown} is binary past its start (it holds NUL bytes, as a sparse or binary "
                              "file does): read_file reads text files only", is_error=True)
        except _TooFar:
            return ToolResult(f"read_file: line {offset} of {shown} lies more than {MAX_PASSED_BYTES >> 20} MiB into "
                              "it, further than read_file goes to find a line: run_command can read there (tail or "
                              "sed -n, say)", is_error=True)

    def _checked(self, arguments: Mapping[str, Any], call: Call) -> tuple[Place, io.BufferedReader]:
        check_arguments(self.spec, arguments)
        given = arguments["path"]
        place = existing_file(self.folders, "read_file", given)
        try:
            file = call.opened.enter_context(open_regular(place))
            binary = sniff_binary(file)
        except OSError as error:
            raise Refused(f"read_file: cannot read {given} ({error_reason(error)})") from None
        if binary:
            raise Refused(f"read_file: {given} is a binary file (not UTF-8 text): read_file reads text files only")
        return place, file


class _TooFar(Exception):
    """A line further into a file than read_file goes (MAX_PASSED_BYTES)."""


def _lines(file: io.BufferedReader, shown: str, offset: int, limit: int | None, time_limit: TimeLimit) -> ToolResult:
    """The lines of `file` from `offset` on: `limit` of them, or as many as the caps allow.
    NotText where a NUL byte is met, _TooFar where the offset lies too far in."""
    passed = _pass_lines(file, offset - 1, time_limit)
    taken: list[bytes] = []
    budget = MAX_BYTES
    past_bytes = False  # the next line would pass MAX_BYTES
    long_line = False  # the first line alone passes it: its start is given
    line_ended = True  # ... and whether the part read of it holds its end
    while len(taken) < (limit or MAX_LINES):
        line = file.readline(budget + 1)
        if not line:
            break
        if b"\0" in line:  # NUL bytes decode as UTF-8, but are no text (a sparse file's holes, say)
            raise NotText()
        if len(line) > budget:
            past_bytes = True
            long_line = not taken
            if long_line:
                taken.append(line[:budget])
                line_ended = line.endswith(b"\n")
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
        more = ""
        with contextlib.suppress(NotText, _TooFar):  # where the rest cannot be passed over, no more is offered
            if not line_ended:
                _pass_lines(file, 1, time_limit)
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


def _pass_lines(file: io.BufferedReader, count: int, time_limit: TimeLimit) -> int:
    """Pass over `count` lines of `file`, however long, a buffer at a time; how many there
    were (a last line without its line break counts). NotText where a NUL byte is passed,
    _TooFar past MAX_PASSED_BYTES, and the time limit's refusal once it has passed."""
    passed, passed_bytes, open_line = 0, 0, False
    while passed < count:
        time_limit.check()
        chunk = file.peek(READ_BUFFER)
        if not chunk:
            return passed + int(open_line)
        wanted = count - passed
        if chunk.count(b"\n") >= wanted:
            end = -1
            for _ in range(wanted):
                end = chunk.index(b"\n", end + 1)
            chunk = chunk[:end + 1]
        if b"\0" in chunk:
            raise NotText()
        passed_bytes += len(chunk)
        if passed_bytes > MAX_PASSED_BYTES:
            raise _TooFar()
        file.read(len(chunk))
        passed += chunk.count(b"\n")
        open_line = not chunk.endswith(b"\n")
    return passed


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

    def _run(self, place: Place, arguments: Mapping[str, Any], call: Call) -> ToolResult:
        shown = self.folders.shown(place.path)
        try:
            listing = _listing(place, call.limit)
        except OSError as error:
            return ToolResult(f"list_directory: cannot list {shown} ({error_reason(error)})", is_error=True)
        if not listing.lines:
            return ToolResult(f"[{shown} is empty]")
        lines = listing.lines
        if listing.count > MAX_ENTRIES:
            lines.append(f"[the first {MAX_ENTRIES} of {listing.count} entries are shown: "
                         "search_files finds the others by a pattern]")
        return ToolResult("\n".join(lines))

    def _checked(self, arguments: Mapping[str, Any], call: Call) -> Place:
        check_arguments(self.spec, arguments)
        return existing_folder(self.folders, "list_directory", arguments.get("path", "."))


@dataclass
class _Listing:
    lines: list[str]  # the first MAX_ENTRIES entries by name, each as a line
    count: int  # how many there are


def _listing(place: Place, time_limit: TimeLimit) -> _Listing:
    """The folder at `place`, listed through its descriptor: every entry is looked at in the
    folder that was opened, whatever takes its name's place since."""
    folder = place.open(os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = []
        with os.scandir(folder) as entries:
            for number, entry in enumerate(entries):
                if number % 1000 == 0:
                    time_limit.check()
                names.append(entry.name)
        names.sort()
        return _Listing([_entry(folder, name) for name in names[:MAX_ENTRIES]], len(names))
    finally:
        os.close(folder)


def _entry(folder: int, name: str) -> str:
    """One entry of the folder open as `folder` as a line: `name/`, `name  N bytes`, `name -> target`."""
    try:
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(found.st_mode):
            return f"{name} -> {os.readlink(name, dir_fd=folder)}"
        if stat.S_ISDIR(found.st_mode):
            return f"{name}/"
        if stat.S_ISREG(found.st_mode):
            return f"{name}  {found.st_size:,} bytes"
    except OSError:  # gone since the folder was listed
        return name
    return f"{name}  (a pipe, socket or device)"
