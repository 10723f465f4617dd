"""A path a file tool was given, checked before anyone is asked: inside the folders the
tools may use, and naming what the tool needs there (a file to read, a folder to look in,
a place a file can be written, and no place other programs run code from); and what every
file tool shares: a call's time limit, and what it opened, closed when the call ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from llama_chat.tools.checks import Refused, refusal_of
from llama_chat.tools.folders import FILE, FOLDER, MISSING, Folders, Place
from llama_chat.tools.text_files import error_reason
from llama_chat.tools.time_limit import SECONDS, TimeLimit
from llama_chat.tools.tool import ToolResult, ToolSpec

FIND_IT = "list_directory or search_files finds the right name"
WRITE_HOOKS = "--tool-write-hooks"  # how the user lets the tools write where code is run from
# Names in a path that make a file one that other programs run, or take what to run from,
# without being asked to by name (a `git status`, a `cd`), with why (compared casefolded).
RUNS_CODE = {
    ".git": "where git finds commands to run (hooks, and config such as core.fsmonitor)",
    ".hg": "where Mercurial finds hooks to run",
    ".envrc": "a script direnv runs on entering its folder",
    ".direnv": "where direnv keeps what .envrc puts on the PATH",
    **dict.fromkeys((".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zshenv", ".zprofile",
                     ".zlogin"), "a script the shell runs when it starts"),
}


@dataclass(frozen=True)
class Call:
    """One check or run of a file tool: its time limit, and the files it opened (closed
    when it ends)."""

    limit: TimeLimit
    opened: contextlib.ExitStack


class FileTool:
    """A file tool: it works within `folders`, for at most `seconds` a call, and refuses
    before anyone is asked what its `_checked` (the check its run makes first) refuses; it
    shows nothing beyond its arguments unless it says otherwise."""

    spec: ToolSpec

    def __init__(self, folders: Folders, seconds: float = SECONDS) -> None:
        self.folders = folders
        self.seconds = seconds

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        with self._call() as call:
            return refusal_of(lambda: self._checked(arguments, call))

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        return None

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        """The tool's work on what its check gives, with the files the check opened; what
        the check refuses, or the time limit stops, is an error result."""
        with self._call() as call:
            try:
                return self._run(self._checked(arguments, call), arguments, call)
            except Refused as refused:
                return ToolResult(str(refused), is_error=True)

    @contextlib.contextmanager
    def _call(self) -> Iterator[Call]:
        with contextlib.ExitStack() as opened:
            yield Call(TimeLimit(self.spec.name, self.seconds), opened)

    def _checked(self, arguments: Mapping[str, Any], call: Call) -> Any:
        raise NotImplementedError

    def _run(self, checked: Any, arguments: Mapping[str, Any], call: Call) -> ToolResult:
        raise NotImplementedError


def existing_file(folders: Folders, tool: str, given: str) -> Place:
    """The regular file `given` names; refused where it is outside, missing or no file."""
    place = folders.place(tool, given)
    kind = _kind(tool, place)
    if kind == MISSING:
        raise Refused(f"{tool}: {given} does not exist: {FIND_IT}")
    if kind == FOLDER:
        raise Refused(f"{tool}: {given} is a folder, not a file: list_directory shows what it holds")
    if kind != FILE:
        raise Refused(f"{tool}: {given} is not a regular file (a pipe, socket or device): {tool} takes files only")
    return place


def existing_folder(folders: Folders, tool: str, given: str) -> Place:
    """The folder `given` names; refused where it is outside, missing or no folder."""
    place = folders.place(tool, given)
    kind = _kind(tool, place)
    if kind == MISSING:
        raise Refused(f"{tool}: {given} does not exist: {FIND_IT}")
    if kind == FILE:
        raise Refused(f"{tool}: {given} is a file, not a folder: read_file reads it")
    if kind != FOLDER:
        raise Refused(f"{tool}: {given} is not a folder (a pipe, socket or device): give a folder")
    return place


def file_to_write(folders: Folders, tool: str, given: str) -> tuple[Place, bool]:
    """Where a file `given` names can be written, and whether one is there now; refused
    where it is outside, a folder or special, or where a file stands in the place of a
    folder on the way to it."""
    place = folders.place(tool, given)
    kind = _kind(tool, place)
    if kind == FOLDER:
        raise Refused(f"{tool}: {given} is a folder: give the path of a file")
    if kind == MISSING:
        above = place.parent()
        while (above_kind := _kind(tool, above)) == MISSING and above.names:
            above = above.parent()
        if above_kind != FOLDER:
            raise Refused(f"{tool}: {folders.shown(above.path)} is a file, so {given} cannot be made: "
                          "give another path")
        return place, False
    if kind != FILE:
        raise Refused(f"{tool}: {given} is not a regular file (a pipe, socket or device): give another path")
    return place, True


def refuse_code_place(tool: str, place: Place) -> None:
    """Refuse a write where other programs would run what is written (RUNS_CODE)."""
    parts = place.path.parts
    for number, name in enumerate(parts):
        why = RUNS_CODE.get(name.casefold())
        if why is not None:
            where = name if number == len(parts) - 1 else f"in {name}"
            raise Refused(f"{tool}: {place.given} is {where}, {why}, so a change there could run code later: the "
                          f"file tools change such files only where llama-chat was started with {WRITE_HOOKS}; ask "
                          "the user to make this change")


def _kind(tool: str, place: Place) -> str:
    try:
        return place.kind()
    except OSError as error:
        raise Refused(f"{tool}: {place.given} cannot be looked at ({error_reason(error)})") from None
