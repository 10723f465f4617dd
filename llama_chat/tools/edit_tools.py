"""The tools that change files: write_file (a whole file's text) and edit_file (one piece
of a file's text replaced). Each shows the user its change as a unified diff before it is
made, and makes it all at once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llama_chat.text.undecodable import has_undecodable
from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.file_changes import lines_of, unified_diff, write_atomically
from llama_chat.tools.places import FileTool, existing_file, file_to_write
from llama_chat.tools.text_files import NotText, TooLarge, error_reason, read_text
from llama_chat.tools.tool import ToolResult, ToolSpec

MAX_CHANGED_BYTES = 8 << 20  # a larger file is not read to be changed (its diff would be no use to read)


class WriteFile(FileTool):
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
        try:
            path, old = self._checked(arguments)
        except Refused as refused:
            return str(refused)
        return unified_diff(old, arguments["content"], self.folders.shown(path))

    def _run(self, checked: Any, arguments: Mapping[str, Any]) -> ToolResult:
        path, old = checked
        content, shown = arguments["content"], self.folders.shown(path)
        if content == old:
            return ToolResult(f"{shown} already holds this text: nothing was written")
        try:
            write_atomically(path, content)
        except OSError as error:
            return ToolResult(f"write_file: cannot write {shown} ({error_reason(error)})", is_error=True)
        new = " (a new file)" if old is None else ""
        return ToolResult(f"wrote {shown}{new}: {len(lines_of(content))} lines, {len(content.encode()):,} bytes")

    def _checked(self, arguments: Mapping[str, Any]) -> tuple[Path, str | None]:
        """Where to write and the text there now (None: no file yet)."""
        check_arguments(self.spec, arguments)
        given = arguments["path"]
        _refuse_undecodable("write_file", "content", arguments["content"])
        path, exists = file_to_write(self.folders, "write_file", given)
        return path, _text_of(path, "write_file", given) if exists else None


class EditFile(FileTool):
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
        try:
            path, old, new, _ = self._checked(arguments)
        except Refused as refused:
            return str(refused)
        return unified_diff(old, new, self.folders.shown(path))

    def _run(self, checked: Any, arguments: Mapping[str, Any]) -> ToolResult:
        path, _, new, line = checked
        shown = self.folders.shown(path)
        try:
            write_atomically(path, new)
        except OSError as error:
            return ToolResult(f"edit_file: cannot write {shown} ({error_reason(error)})", is_error=True)
        return ToolResult(f"edited {shown} at line {line}")

    def _checked(self, arguments: Mapping[str, Any]) -> tuple[Path, str, str, int]:
        """The file, its text now, its text edited and the line where the edit starts."""
        check_arguments(self.spec, arguments)
        given, old_text, new_text = arguments["path"], arguments["old_text"], arguments["new_text"]
        _refuse_undecodable("edit_file", "new_text", new_text)
        if old_text == new_text:
            raise Refused("edit_file: old_text and new_text are the same, so nothing would change: give the new text")
        path = existing_file(self.folders, "edit_file", given)
        old = _text_of(path, "edit_file", given)
        found = _occurrences(old, old_text)
        if found == 0:
            raise Refused(f"edit_file: old_text is not in {given}: read the file again and copy the text exactly, "
                          "spaces and line breaks included")
        if found > 1:
            raise Refused(f"edit_file: old_text is in {given} {found} times: give more of the text around it, "
                          "so that it is there once")
        start = old.index(old_text)
        return path, old, old[:start] + new_text + old[start + len(old_text):], old.count("\n", 0, start) + 1


def _occurrences(text: str, part: str) -> int:
    """How many times `part` is in `text`, counting those that overlap (each is a place it could be replaced)."""
    count, at = 0, text.find(part)
    while at != -1:
        count, at = count + 1, text.find(part, at + 1)
    return count


def _text_of(path: Path, tool: str, given: str) -> str:
    """The text of the file a change starts from, refused where it cannot be read as text."""
    try:
        return read_text(path, MAX_CHANGED_BYTES)
    except NotText:
        raise Refused(f"{tool}: {given} is a binary file (not UTF-8 text): {tool} changes text files only") from None
    except TooLarge as large:
        raise Refused(f"{tool}: {given} is {large.size:,} bytes, more than the {MAX_CHANGED_BYTES >> 20} MiB "
                      f"{tool} changes: run_command can change it (with sed, say)") from None
    except OSError as error:
        raise Refused(f"{tool}: cannot read {given} ({error_reason(error)})") from None


def _refuse_undecodable(tool: str, name: str, text: str) -> None:
    if has_undecodable(text):
        raise Refused(f"{tool}: {name} has characters that cannot be written as UTF-8 (lone surrogates): "
                      "give it again without them")
