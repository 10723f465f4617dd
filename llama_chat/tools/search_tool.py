"""search_files: the files under a folder whose paths match a glob pattern, and the lines
of those files that hold a piece of text.

The walk never follows a link to a folder (no loops, and no way out of the folders the
tools may use), takes a link to a file only where the file is inside them, and passes
over folders whose names start with a dot (.git, .venv: many files, seldom wanted) unless
the search starts in one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from itertools import islice
from pathlib import Path
from typing import Any

from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.places import FileTool, existing_folder
from llama_chat.tools.text_files import NotText, TooLarge, read_text
from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_MATCHES = 200  # the most paths or lines a search gives
MAX_SEARCHED_BYTES = 8 << 20  # a larger file is not searched for text
MAX_LINE_CHARS = 400  # a longer line is shown around the text found in it
_TOO_LARGE = f"over {MAX_SEARCHED_BYTES >> 20} MiB"
_WILDCARDS = frozenset("*?[")


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
            f"start with a dot (.git, .venv) unless path is one. At most {MAX_MATCHES} results."
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

    def _run(self, checked: Any, arguments: Mapping[str, Any]) -> ToolResult:
        folder, parts = checked
        pattern, text, where = arguments["pattern"], arguments.get("text"), self.folders.shown(folder)
        nothing = f"[no file in {where} matches {pattern}]"
        files = self._matching(folder, parts)
        if text is None:
            return ToolResult(_listed([self.folders.shown(path) for path, _ in islice(files, MAX_MATCHES + 1)],
                                      "paths", nothing))
        found: list[str] = []
        searched, passed_over = 0, {"binary": 0, _TOO_LARGE: 0, "unreadable": 0}
        for path, real in files:
            try:
                lines = read_text(real, MAX_SEARCHED_BYTES).split("\n")
            except (NotText, TooLarge, OSError) as error:
                passed_over[_passed_over_as(error)] += 1
                continue
            searched += 1
            shown = self.folders.shown(path)
            found.extend(f"{shown}:{number}: {_around(line, text)}" for number, line in enumerate(lines, 1)
                         if text in line)
            if len(found) > MAX_MATCHES:
                break
        if searched:
            files_searched = f"{searched} file{'s' if searched != 1 else ''}"
            nothing = f'[no line of the {files_searched} in {where} matching {pattern} holds "{text}"]'
        skipped = ", ".join(f"{count} {why}" for why, count in passed_over.items() if count)
        return ToolResult(_listed(found, "lines", nothing) + (f"\n[files not searched: {skipped}]" if skipped else ""))

    def _checked(self, arguments: Mapping[str, Any]) -> tuple[Path, list[str]]:
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
        return folder, parts

    def _matching(self, folder: Path, parts: list[str]) -> Iterator[tuple[Path, Path]]:
        """The regular files under `folder` that a pattern's `parts` match, in a steady order
        (each folder's own files before its folders'), each with the path it leads to."""
        start = folder
        for part in parts[:-1]:  # the walk starts below the pattern's first names without wildcards
            if part == "**" or _WILDCARDS & set(part):
                break
            start = start / part
        if os.path.realpath(start) != str(start) or not start.is_dir():  # a link on the way is not followed
            return
        for at, folders, names in os.walk(start):
            folders[:] = sorted(name for name in folders if not name.startswith("."))
            for name in sorted(names):
                path = Path(at, name)
                if _matches(parts, path.relative_to(folder).parts):
                    real = Path(os.path.realpath(path))
                    if self.folders.contains(real) and real.is_file():
                        yield path, real


def _matches(parts: list[str], names: tuple[str, ...]) -> bool:
    """Whether a path's `names` match a pattern's `parts` (** any number of names)."""
    if not parts:
        return not names
    if parts[0] == "**":
        return any(_matches(parts[1:], names[start:]) for start in range(len(names) + 1))
    return bool(names) and fnmatchcase(names[0], parts[0]) and _matches(parts[1:], names[1:])


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
