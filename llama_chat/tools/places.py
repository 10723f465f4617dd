"""A path a file tool was given, checked before anyone is asked: inside the folders the
tools may use, and naming what the tool needs there (a file to read, a folder to look in,
a place a file can be written); and what every file tool shares."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llama_chat.tools.checks import Refused, refusal_of
from llama_chat.tools.folders import Folders
from llama_chat.tools.text_files import FILE, FOLDER, MISSING, error_reason, file_kind
from llama_chat.tools.tool import ToolResult, ToolSpec

FIND_IT = "list_directory or search_files finds the right name"


class FileTool:
    """A file tool: it works within `folders`, and refuses before anyone is asked what its
    `_checked` (the check its run makes first) refuses; it shows nothing beyond its arguments
    unless it says otherwise."""

    spec: ToolSpec

    def __init__(self, folders: Folders) -> None:
        self.folders = folders

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        return refusal_of(lambda: self._checked(arguments))

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        return None

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        """The tool's work on what its check gives; what the check refuses is an error result."""
        try:
            checked = self._checked(arguments)
        except Refused as refused:
            return ToolResult(str(refused), is_error=True)
        return self._run(checked, arguments)

    def _checked(self, arguments: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def _run(self, checked: Any, arguments: Mapping[str, Any]) -> ToolResult:
        raise NotImplementedError


def existing_file(folders: Folders, tool: str, given: str) -> Path:
    """The regular file `given` names, resolved; refused where it is outside, missing or no file."""
    path = folders.inside(tool, given)
    kind = _kind(tool, given, path)
    if kind == MISSING:
        raise Refused(f"{tool}: {given} does not exist: {FIND_IT}")
    if kind == FOLDER:
        raise Refused(f"{tool}: {given} is a folder, not a file: list_directory shows what it holds")
    if kind != FILE:
        raise Refused(f"{tool}: {given} is not a regular file (a pipe, socket or device): {tool} takes files only")
    return path


def existing_folder(folders: Folders, tool: str, given: str) -> Path:
    """The folder `given` names, resolved; refused where it is outside, missing or no folder."""
    path = folders.inside(tool, given)
    kind = _kind(tool, given, path)
    if kind == MISSING:
        raise Refused(f"{tool}: {given} does not exist: {FIND_IT}")
    if kind == FILE:
        raise Refused(f"{tool}: {given} is a file, not a folder: read_file reads it")
    if kind != FOLDER:
        raise Refused(f"{tool}: {given} is not a folder (a pipe, socket or device): give a folder")
    return path


def file_to_write(folders: Folders, tool: str, given: str) -> tuple[Path, bool]:
    """Where a file `given` names can be written, resolved, and whether one is there now;
    refused where it is outside, a folder or special, or where a file stands in the place
    of a folder on the way to it."""
    path = folders.inside(tool, given)
    kind = _kind(tool, given, path)
    if kind == FOLDER:
        raise Refused(f"{tool}: {given} is a folder: give the path of a file")
    if kind == MISSING:
        above = path.parent
        while _kind(tool, given, above) == MISSING:
            above = above.parent
        if _kind(tool, given, above) != FOLDER:
            raise Refused(f"{tool}: {folders.shown(above)} is a file, so {given} cannot be made: give another path")
        return path, False
    if kind != FILE:
        raise Refused(f"{tool}: {given} is not a regular file (a pipe, socket or device): give another path")
    return path, True


def _kind(tool: str, given: str, path: Path) -> str:
    try:
        return file_kind(path)
    except OSError as error:
        raise Refused(f"{tool}: {given} cannot be looked at ({error_reason(error)})") from None
