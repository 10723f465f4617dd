"""search_files: the files under a folder whose paths match a glob pattern, and the lines
of those files that hold a piece of text.

The walk goes from folder descriptor to folder descriptor (each opened in the one before,
never through a link), and reads each file through its folder's descriptor, so a folder
swapped for a link while it runs leads nowhere. It never follows a link to a folder (no
loops, and no way out of the folders the tools may use), takes a link to a file only where
the file is inside them, and passes over folders whose names start with a dot (.git, .venv:
many files, seldom wanted) unless the pattern or the path names them. It is bounded: in
the pattern's parts, in depth, in the entries looked at and in time, with a note of what
was left out.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from itertools import islice
from typing import Any

from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.folders import FILE, FOLDER, OTHER, Place
from llama_chat.tools.places import Call, FileTool, existing_folder
from llama_chat.tools.text_files import NotText, TooLarge, open_regular, open_regular_in, read_text
from llama_chat.tools.time_limit import TimeLimit
from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_MATCHES = 200  # the most paths or lines a search gives
MAX_SEARCHED_BYTES = 8 << 20  # a larger file is not searched for text
MAX_LINE_CHARS = 400  # a longer line is shown around the text found in it
MAX_PARTS = 32  # the most names (and **) a pattern may have
MAX_DEPTH = 32  # the most folders deep a walk goes below the folder searched
MAX_LOOKED_AT = 100_000  # the most entries (files and folders) a search looks at
MAX_NAME = 255  # the longest part of a pattern: the longest name a file can have
_TOO_LARGE = f"over {MAX_SEARCHED_BYTES >> 20} MiB"
_LINK = "link"  # an entry that is a link, for _Walk
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
Found = tuple[tuple[str, ...], Callable[[], io.BufferedReader]]  # a file's names below the start, how to open it


class SearchFiles(FileTool):
    """search_files: paths matching a glob, or with `text`, the lines holding it."""

    spec = ToolSpec(
        name="search_files",
        description=(
            "Find files by a glob pattern and, given text, the lines of those files that hold it. The pattern is "
            "matched against each file's path from the folder searched: * and ? match within a name, [abc] one of "
            "the characters, ** any number of folders ('**/*.py': every Python file; 'src/*.js': the JavaScript "
            "files right in src). Without text, gives the paths that match; with it, a line 'path:line: text' for "
            "each line holding the text exactly (case and all). Binary files are skipped, and folders whose names "
            f"start with a dot (.git, .venv) unless the pattern names them or path is one. At most {MAX_MATCHES} "
            f"results, {MAX_DEPTH} folders deep."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1,
                            "description": "A glob matched against paths from the folder searched, like **/*.py."},
                "text": {"type": "string", "minLength": 1,
                         "description": "Text on one line to find in the matching files (plain text, not a regex)."},
                "path": {"type": "string", "minLength": 1, "default": ".",
                         "description": "The folder to search in (the working folder, '.', if left out)."},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    )

    def _run(self, checked: tuple[Place, list[str]], arguments: Mapping[str, Any], call: Call) -> ToolResult:
        start, parts = checked
        pattern, text, where = arguments["pattern"], arguments.get("text"), self.folders.shown(start.path)
        nothing = f"[no file in {where} matches {pattern}]"
        walk = _Walk(self, start, parts, call.limit)
        files = call.opened.enter_context(contextlib.closing(walk.files()))  # its folders closed with the call
        if text is None:
            paths = [self._shown(start, names) for names, _ in islice(files, MAX_MATCHES + 1)]
            return ToolResult(_listed(paths, "paths", nothing) + walk.notes())
        found: list[str] = []
        searched, passed_over = 0, {"binary": 0, _TOO_LARGE: 0, "unreadable": 0}
        for names, opened in files:
            try:
                with opened() as file:
                    lines = read_text(file, MAX_SEARCHED_BYTES).split("\n")
            except (NotText, TooLarge, OSError) as error:
                passed_over[_passed_over_as(error)] += 1
                continue
            searched += 1
            shown = self._shown(start, names)
            found.extend(f"{shown}:{number}: {_around(line, text)}" for number, line in enumerate(lines, 1)
                         if text in line)
            if len(found) > MAX_MATCHES:
                break
        if searched:
            files_searched = f"{searched} file{'s' if searched != 1 else ''}"
            nothing = f'[no line of the {files_searched} in {where} matching {pattern} holds "{text}"]'
        skipped = ", ".join(f"{count} {why}" for why, count in passed_over.items() if count)
        return ToolResult(_listed(found, "lines", nothing) + (f"\n[files not searched: {skipped}]" if skipped else "")
                          + walk.notes())

    def _shown(self, start: Place, names: tuple[str, ...]) -> str:
        return self.folders.shown(start.path.joinpath(*names))

    def _checked(self, arguments: Mapping[str, Any], call: Call) -> tuple[Place, list[str]]:
        check_arguments(self.spec, arguments)
        folder = existing_folder(self.folders, "search_files", arguments.get("path", "."))
        pattern = arguments["pattern"]
        if "\n" in arguments.get("text", ""):
            raise Refused("search_files: text must be on one line: search for one line of it")
        parts: list[str] = []
        for part in pattern.split("/"):
            if part not in ("", ".") and not (part == "**" and parts[-1:] == ["**"]):  # **/** is **, matched once
                parts.append(part)
        if pattern.startswith("/") or ".." in parts or not parts:
            raise Refused(f"search_files: the pattern {pattern} is not a path inside the folder searched: give "
                          "one like **/*.py, and the folder as path")
        if len(parts) > MAX_PARTS:
            raise Refused(f"search_files: the pattern has {len(parts)} parts (names and **), more than the "
                          f"{MAX_PARTS} a pattern may have: give a shorter one")
        longest = max(map(len, parts))
        if longest > MAX_NAME:
            raise Refused(f"search_files: a part of the pattern is {longest} characters long, longer than a name can "
                          f"be ({MAX_NAME}): give a shorter one")
        return folder, parts


@dataclass
class _Walk:
    """The regular files under the folder at `start` that a pattern's `parts` match, in a
    steady order (each folder's own files before its folders'), each with how to open it;
    and what the bounds left out."""

    tool: SearchFiles
    start: Place
    parts: list[str]
    limit: TimeLimit
    looked_at: int = 0
    too_deep: int = 0
    stopped: str = ""  # why the walk stopped before its end

    def files(self) -> Iterator[Found]:
        try:
            folder = self.start.open(_FOLDER)
        except OSError:  # gone, or a link now, since it was checked
            self.stopped = "its folder changed while it was searched"
            return
        try:
            yield from self._in(folder, (), _closure(self.parts, {0}))
        finally:
            os.close(folder)

    def notes(self) -> str:
        """What the walk left out, a line each (or nothing)."""
        notes = []
        if self.too_deep:
            notes.append(f"[{self.too_deep} folder{'s' if self.too_deep != 1 else ''} more than {MAX_DEPTH} levels "
                         "deep not searched: search from a deeper path]")
        if self.stopped:
            notes.append(f"[the search stopped early, as {self.stopped}: what it found by then is above; narrow the "
                         "pattern or the folder]")
        return "".join(f"\n{note}" for note in notes)

    def _in(self, folder: int, names: tuple[str, ...], states: frozenset[int]) -> Iterator[Found]:
        entries = self._entries(folder)
        for name, kind in entries:
            if self._out_of_time():  # the entries looked at are given, but not past the time
                return
            if kind in (FILE, _LINK) and len(self.parts) in _step(self.parts, states, name, is_folder=False):
                opened = self._file(folder, (*names, name), kind == _LINK)
                if opened is not None:
                    yield (*names, name), opened
        for name, kind in entries:
            after = _step(self.parts, states, name, is_folder=True) if kind == FOLDER else frozenset()
            if self.stopped or not any(state < len(self.parts) for state in after):
                continue
            if len(names) >= MAX_DEPTH:
                self.too_deep += 1
                continue
            try:
                inner = os.open(name, _FOLDER, dir_fd=folder)  # a link in its place now is refused: passed over
            except OSError:
                continue
            try:
                yield from self._in(inner, (*names, name), after)
            finally:
                os.close(inner)

    def _entries(self, folder: int) -> list[tuple[str, str]]:
        """The entries of the folder open as `folder`, sorted by name, each with what it is
        (FOLDER, FILE, a link, OTHER), within the bounds on entries and time."""
        entries: list[tuple[str, str]] = []
        try:
            listing = os.scandir(folder)
        except OSError:  # unreadable: passed over
            return entries
        with listing:
            for entry in listing:
                self.looked_at += 1
                if self.looked_at > MAX_LOOKED_AT:
                    self.stopped = self.stopped or f"it had looked at {MAX_LOOKED_AT:,} files and folders"
                if self.stopped or self._out_of_time():
                    break
                try:
                    entries.append((entry.name, _kind(entry)))
                except OSError:  # gone since it was listed
                    continue
        return sorted(entries)

    def _out_of_time(self) -> bool:
        if not self.limit.passed():
            return False
        self.stopped = self.stopped or f"{self.limit.seconds:g} s passed, the time limit for a tool call"
        return True

    def _file(self, folder: int, names: tuple[str, ...], is_link: bool) -> Callable[[], io.BufferedReader] | None:
        """How to open the file an entry names; None where it is no regular file inside the
        folders. A link is followed as a path given to a tool is, and opened beneath its folder."""
        if not is_link:
            return lambda: open_regular_in(folder, names[-1])
        try:
            place = self.tool.folders.place("search_files", str(self.start.path.joinpath(*names)))
            if place.kind() != FILE:
                return None
        except (Refused, OSError):
            return None
        return lambda: open_regular(place)


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return _LINK
    if entry.is_dir(follow_symlinks=False):
        return FOLDER
    return FILE if entry.is_file(follow_symlinks=False) else OTHER


def _closure(parts: list[str], states: set[int] | frozenset[int]) -> frozenset[int]:
    """`states` (each how many of the pattern's parts are matched so far) with those a **
    lets through by matching no name."""
    closed = set(states)
    for state in states:
        while state < len(parts) and parts[state] == "**":
            state += 1
            closed.add(state)
    return frozenset(closed)


def _step(parts: list[str], states: frozenset[int], name: str, is_folder: bool) -> frozenset[int]:
    """The states after one more name of a path: ** takes any name, but a folder whose name
    starts with a dot only a part starting with a dot takes. A path costs so its names times
    the pattern's parts, however many ** the pattern has."""
    hidden = is_folder and name.startswith(".")
    after = set()
    for state in states:
        if state == len(parts):
            continue
        part = parts[state]
        if part == "**":
            if not hidden:
                after.add(state)
        elif fnmatchcase(name, part) and (not hidden or part.startswith(".")):
            after.add(state + 1)
    return _closure(parts, after)


def _passed_over_as(error: Exception) -> str:
    if isinstance(error, NotText):
        return "binary"
    return _TOO_LARGE if isinstance(error, TooLarge) else "unreadable"


def _around(line: str, text: str) -> str:
    """`line` without a carriage return at its end, or where it is long, the part of it
    around the first `text`."""
    line = line.removesuffix("\r")
    if len(line) <= MAX_LINE_CHARS:
        return line
    start = max(0, line.index(text) - MAX_LINE_CHARS // 4)
    end = start + MAX_LINE_CHARS
    return f"{'…' if start else ''}{line[start:end]}{'…' if end < len(line) else ''}"


def _listed(results: list[str], kind: str, nothing: str) -> str:
    """The results, capped at MAX_MATCHES with a note, or `nothing` where there are none."""
    if not results:
        return nothing
    if len(results) > MAX_MATCHES:
        results = [*results[:MAX_MATCHES], f"[the first {MAX_MATCHES} {kind} found are shown; there are more: "
                                           "narrow the pattern, the text or the folder]"]
    return "\n".join(results)
