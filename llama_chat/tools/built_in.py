"""llama-chat's own tools, all together: the file tools, confined to the folders given, and
the shell tool, run in the working folder."""

from __future__ import annotations

from collections.abc import Mapping

from llama_chat.tools.edit_tools import EditFile, WriteFile
from llama_chat.tools.folders import Folders
from llama_chat.tools.read_tools import ListDirectory, ReadFile
from llama_chat.tools.search_tool import SearchFiles
from llama_chat.tools.shell_tool import OUTPUT_BYTES, SECONDS, RunCommand
from llama_chat.tools.tool import Tool


def built_in_tools(folders: Folders, seconds: float = SECONDS, command_output_bytes: int = OUTPUT_BYTES,
                   write_hooks: bool = False, command_environment: Mapping[str, str] | None = None) -> list[Tool]:
    """The built-in tools, over `folders`; a call runs for at most `seconds`, a command gives
    at most `command_output_bytes` of output and gets `command_environment` (by default
    environment.tool_environment()), and files other programs run code from are changed only
    where `write_hooks` says so."""
    return [
        ReadFile(folders, seconds), ListDirectory(folders, seconds), SearchFiles(folders, seconds),
        WriteFile(folders, seconds, write_hooks), EditFile(folders, seconds, write_hooks),
        RunCommand(folders, seconds, command_output_bytes, command_environment),
    ]
