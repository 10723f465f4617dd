"""The tools flags, and the tools of a chat built from them: llama-chat's own over the
working folder (and the folders added), the MCP servers of the config file started in the
background, and what may run without asking."""

from __future__ import annotations

import argparse
import os
import re

from llama_chat.chat.consent import ALL, Consent, allowed_ahead
from llama_chat.chat.tool_offer import MAX_CALLS
from llama_chat.chat.tool_use import ToolUse
from llama_chat.cli.arguments import finite_float
from llama_chat.environment import tool_environment
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.paths import expanded, mcp_config_path
from llama_chat.tools.built_in import built_in_tools
from llama_chat.tools.folders import Folders
from llama_chat.tools.places import WRITE_HOOKS
from llama_chat.tools.toolbox import ToolBox

TOOL_SECONDS = 30.0
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def add_tool_arguments(parser: argparse.ArgumentParser) -> None:
    tools = parser.add_argument_group("tools (/tools and /mcp in the chat; each call is asked about)")
    tools.add_argument("--tools", nargs="?", const=ALL, metavar="NAME,...|all",
                       help="offer llama-chat's own tools (read_file, list_directory, search_files, write_file, "
                       "edit_file, run_command) besides the MCP servers' (all, the default with no names); or "
                       "offer only the tools named, llama-chat's or the servers'")
    tools.add_argument("--allow-tools", metavar="NAME,...|all",
                       help="run these tools without asking (with -p, calls of any other tool are declined)")
    tools.add_argument("--mcp-config", metavar="FILE",
                       help=f"start the MCP servers of this JSON file (mcpServers shape) and offer their tools "
                       f"(default: {mcp_config_path()}, where it exists)")
    tools.add_argument("--tool-folder", action="append", metavar="DIR",
                       help="a folder the file tools may use besides the working folder; repeatable")
    tools.add_argument("--tool-env", action="append", metavar="NAME,...",
                       help="give run_command's commands these variables of llama-chat's environment too (they "
                       "get PATH, HOME, the locale and the like, and no key or token unless named here); repeatable")
    tools.add_argument("--tool-timeout", type=finite_float, default=TOOL_SECONDS, metavar="SECONDS",
                       help="how long a tool call may run: a command, a file tool's work, an MCP server's answer "
                       f"(default: {TOOL_SECONDS:g})")
    tools.add_argument(WRITE_HOOKS, action="store_true",
                       help="let write_file and edit_file change the files other programs run code from (under "
                       ".git or .hg, .envrc, .direnv, shell startup files), refused otherwise")
    tools.add_argument("--max-tool-calls", type=int, default=MAX_CALLS, metavar="N",
                       help=f"tool calls one reply may make (default: {MAX_CALLS})")
    tools.add_argument("--tool-choice", choices=("auto", "required"), default="auto",
                       help="auto: the model calls tools when it chooses; required: each reply starts with a call "
                       "(then answers with the results) (default: auto)")


def tool_use_from(options: argparse.Namespace) -> ToolUse:
    """The chat's tools as the flags say, MCP servers starting in the background; refused in
    one line (UsageError) for a bad flag or config file, before anything starts."""
    if options.tool_timeout <= 0:
        raise UsageError(f"--tool-timeout must be a positive number of seconds, got {options.tool_timeout:g}")
    if options.max_tool_calls < 1:
        raise UsageError(f"--max-tool-calls must be 1 or more, got {options.max_tool_calls}")
    try:
        folders = Folders(os.getcwd(), options.tool_folder or [])
    except LlamaChatError as error:
        raise UsageError(f"--tool-folder: {error}") from None
    built_in = built_in_tools(folders, options.tool_timeout, write_hooks=options.tool_write_hooks,
                              command_environment=tool_environment(_variable_names(options.tool_env or [])))
    toolbox = ToolBox(built_in, _servers(options, [tool.spec.name for tool in built_in]))
    if options.tools:
        names = _names(options.tools)
        unknown = [name for name in names if name != ALL and name not in toolbox.built_in]
        if unknown and toolbox.servers is None:
            raise UsageError(f"--tools: there is no tool named {', '.join(unknown)}: "
                             f"llama-chat's own tools are {', '.join(toolbox.built_in)}")
        if ALL in names:
            toolbox.switch(toolbox.built_in, on=True)
        else:
            toolbox.only(names)  # the servers' among them are known once they are ready
    consent = Consent(allowed_ahead(_names(options.allow_tools)) if options.allow_tools else frozenset())
    if toolbox.servers is not None:
        toolbox.servers.start()
    return ToolUse(toolbox, consent, options.max_tool_calls, folders, required=options.tool_choice == "required")


def _servers(options: argparse.Namespace, reserved: list[str]):
    """The MCP servers of --mcp-config, else of the default file where it exists; None for none."""
    path = expanded(options.mcp_config) if options.mcp_config else mcp_config_path()
    if options.mcp_config is None and not path.exists():
        return None
    from llama_chat.tools.mcp_config import read_config  # the MCP SDK loads only where servers are configured
    from llama_chat.tools.mcp_servers import McpServers

    try:
        configs = read_config(path)
    except LlamaChatError as error:
        raise UsageError(str(error)) from None
    if not configs:
        return None
    return McpServers(configs, timeout_seconds=options.tool_timeout, reserved_names=reserved)


def _variable_names(given: list[str]) -> list[str]:
    names = [name for text in given for name in _names(text)]
    for name in names:
        if not _VARIABLE_NAME.fullmatch(name):
            raise UsageError(f"--tool-env: {name!r} is not the name of a variable: give names such as HF_TOKEN "
                             "(each takes its value from llama-chat's environment)")
    return names


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
