"""The tools that change files: write_file (a whole file's text) and edit_file (one piece
of a file's text replaced). Each shows the user its change as a unified diff before it is
made, and makes it all at once.

A change is refused where other programs run code from (places.RUNS_CODE: .git, .envrc
and the like) unless the user allowed it when starting the chat, and so is one to a file
that is read-only or another user's (a rewrite would make it writable, or the chat user's).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llama_chat.text.undecodable import has_undecodable
from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.file_changes import Replaced, lines_of, unified_diff, write_atomically
from llama_chat.tools.folders import Folders, Place
from llama_chat.tools.places import Call, FileTool, existing_file, file_to_write, refuse_code_place
from llama_chat.tools.text_files import NotText, TooLarge, error_reason, open_regular, read_text
from llama_chat.tools.time_limit import SECONDS
from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_CHANGED_BYTES = 8 << 20  # a larger file is not read to be changed (its diff would be no use to read)


@dataclass(frozen=True)
class _Old:
    """The file a change starts from: its text, and what it was when read."""

    text: str
    status: os.stat_result


class _ChangingTool(FileTool):
    """A file tool that changes files; `write_hooks`: also where other programs run code from."""

    def __init__(self, folders: Folders, seconds: float = SECONDS, write_hooks: bool = False) -> None:
        super().__init__(folders, seconds)
        self.write_hooks = write_hooks

    def _changed(self, place: Place) -> Place:
        """`place`, refused where a change there could run code later (unless allowed)."""
        if not self.write_hooks:
            refuse_code_place(self.spec.name, place)
        return place

    def _write(self, place: Place, text: str, old: _Old | None) -> str | None:
        """Make the change; None where it was made, else the line saying why not."""
        name, shown = self.spec.name, self.folders.shown(place.path)
        try:
            write_atomically(place, text, old.status if old else None)
        except Replaced:
            return f"{name}: {shown} changed while it was being written (another file took its name): read it again"
        except OSError as error:
            return f"{name}: cannot write {shown} ({error_reason(error)})"
        return None


class WriteFile(_ChangingTool):
    """write_file: `content` as the whole of a file, new or not."""

    spec = ToolSpec(
        name="write_file",
        description=(
            "Write a text file: content becomes the whole file, a new one (with the folders it needs) or one "
            "replacing the file's old text. The user sees the change as a diff and says yes before it is made. "
            "To change part of a file, edit_file is shorter."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1,
                         "description": "The file: relative to the working folder, or absolute."},
                "content": {"type": "string", "description": "The file's whole new text."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    )

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        with self._call() as call:
            try:
                place, old = self._checked(arguments, call)
            except Refused as refused:
                return str(refused)
        return unified_diff(old.text if old else None, arguments["content"], self.folders.shown(place.path))

    def _run(self, checked: tuple[Place, _Old | None], arguments: Mapping[str, Any], call: Call) -> ToolResult:
        place, old = checked
        content, shown = arguments["content"], self.folders.shown(place.path)
        if old is not None and content == old.text:
            return ToolResult(f"{shown} already holds this text: nothing was written")
        failed = self._write(place, content, old)
        if failed is not None:
            return ToolResult(failed, is_error=True)
        new = " (a new file)" if old is None else ""
        return ToolResult(f"wrote {shown}{new}: {len(lines_of(content))} lines, {len(content.encode()):,} bytes")

    def _checked(self, arguments: Mapping[str, Any], call: Call) -> tuple[Place, _Old | None]:
        """Where to write and the file there now (None: no file yet)."""
        check_arguments(self.spec, arguments)
        given = arguments["path"]
        _refuse_undecodable("write_file", "content", arguments["content"])
        place, exists = file_to_write(self.folders, "write_file", given)
        self._changed(place)
        return place, _old_of(place, "write_file", given) if exists else None


class EditFile(_ChangingTool):
    """edit_file: the one place `old_text` is in a file, replaced with `new_text`."""

    spec = ToolSpec(
        name="edit_file",
        description=(
            "Change a text file: old_text, which must be in the file exactly once, is replaced with new_text. Copy "
            "old_text from the file exactly, spaces and line breaks included, with enough of the text around it "
            "to make it unique. The user sees the change as a diff and says yes before it is made."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1,
                         "description": "The file: relative to the working folder, or absolute."},
                "old_text": {"type": "string", "minLength": 1,
                             "description": "The text to replace, as it is in the file, there exactly once."},
                "new_text": {"type": "string", "description": "The text to put in its place (empty: remove it)."},
            },
            "required": ["path", "old_text", "new_text"],
            "additionalProperties": False,
        },
    )

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        with self._call() as call:
            try:
                place, old, new, _ = self._checked(arguments, call)
            except Refused as refused:
                return str(refused)
        return unified_diff(old.text, new, self.folders.shown(place.path))

    def _run(self, checked: tuple[Place, _Old, str, int], arguments: Mapping[str, Any], call: Call) -> ToolResult:
        place, old, new, line = checked
        failed = self._write(place, new, old)
        if failed is not None:
            return ToolResult(failed, is_error=True)
        return ToolResult(f"edited {self.folders.shown(place.path)} at line {line}")

    def _checked(self, arguments: Mapping[str, Any], call: Call) -> tuple[Place, _Old, str, int]:
        """The file, its text now, its text edited and the line where the edit starts."""
        check_arguments(self.spec, arguments)
        given, old_text, new_text = arguments["path"], arguments["old_text"], arguments["new_text"]
        _refuse_undecodable("edit_file", "new_text", new_text)
        if old_text == new_text:
            raise Refused("edit_file: old_text and new_text are the same, so nothing would change: give the new text")
        place = self._changed(existing_file(self.folders, "edit_file", given))
        old = _old_of(place, "edit_file", given)
        text = old.text
        found = _occurrences(text, old_text)
        if found == 0:
            raise Refused(f"edit_file: old_text is not in {given}: read the file again and copy the text exactly, "
                          "spaces and line breaks included")
        if found > 1:
            raise Refused(f"edit_file: old_text is in {given} {found} times: give more of the text around it, "
                          "so that it is there once")
        start = text.index(old_text)
        return place, old, text[:start] + new_text + text[start + len(old_text):], text.count("\n", 0, start) + 1


def _occurrences(text: str, part: str) -> int:
    """How many times `part` is in `text`, counting those that overlap (each is a place it could be replaced)."""
    count, at = 0, text.find(part)
    while at != -1:
        count, at = count + 1, text.find(part, at + 1)
    return count


def _old_of(place: Place, tool: str, given: str) -> _Old:
    """The file a change starts from, refused where it cannot be read as text, or must not
    be rewritten: read-only, or another user's."""
    try:
        with open_regular(place) as file:
            status = os.fstat(file.fileno())
            _refuse_unwritable(status, tool, given)
            return _Old(read_text(file, MAX_CHANGED_BYTES), status)
    except NotText:
        raise Refused(f"{tool}: {given} is a binary file (not UTF-8 text): {tool} changes text files only") from None
    except TooLarge as large:
        raise Refused(f"{tool}: {given} is {large.size:,} bytes, more than the {MAX_CHANGED_BYTES >> 20} MiB "
                      f"{tool} changes: run_command can change it (with sed, say)") from None
    except OSError as error:
        raise Refused(f"{tool}: cannot read {given} ({error_reason(error)})") from None


def _refuse_unwritable(status: os.stat_result, tool: str, given: str) -> None:
    if status.st_uid != os.geteuid():
        raise Refused(f"{tool}: {given} belongs to another user (uid {status.st_uid}), and a rewrite would make it "
                      "the chat user's: ask the user to change it")
    if not status.st_mode & stat.S_IWUSR:
        raise Refused(f"{tool}: {given} is read-only (mode {stat.S_IMODE(status.st_mode):04o}): the user can make "
                      "it writable (chmod u+w) if it should change")


def _refuse_undecodable(tool: str, name: str, text: str) -> None:
    if has_undecodable(text):
        raise Refused(f"{tool}: {name} has characters that cannot be written as UTF-8 (lone surrogates): "
                      "give it again without them")
