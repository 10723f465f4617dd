"""The slash commands: one table of names, help texts and handlers with validated arguments,
and finding and running them. The handlers live by what they act on: settings_commands,
conversation_commands, model_commands, file_commands and reply_commands.

A handler gets the chat state and the text after the command name. A bad argument raises
CommandError (one line, nothing changed); returning STOP ends the chat.
"""

from __future__ import annotations

import difflib

from llama_chat.repl.chat_state import STOP, ChatState, Command, CommandError, Handler
from llama_chat.repl.conversation_commands import (
    run_branches,
    run_clear,
    run_compact,
    run_edit,
    run_retry,
    run_stats,
    run_system,
    run_undo,
)
from llama_chat.repl.file_commands import run_copy, run_open, run_read, run_save
from llama_chat.repl.history_commands import run_history
from llama_chat.repl.model_commands import run_device, run_info, run_load, run_models, run_prompt_math
from llama_chat.repl.reply_commands import run_draft, run_format, run_lookup
from llama_chat.repl.settings_commands import SETTINGS, run_seed, run_settings, setting_command, switch_command
from llama_chat.repl.tool_commands import run_mcp, run_tools


def run_quit(state: ChatState, text: str) -> bool:
    return STOP


def run_help(state: ChatState, text: str) -> None:
    if text:
        command = find(text.removeprefix("/"))
        state.renderer.line(f"{usage(command)}\n    {command.help}")
        return
    for command in COMMANDS:
        state.renderer.line(f"{usage(command):<30} {command.help}")
    state.renderer.line(
        "A setting's command without an argument shows its value. Esc then Enter (or Alt+Enter) starts "
        "a new line; a message starting with // is sent with one /."
    )


def usage(command: Command) -> str:
    names = " ".join("/" + name for name in (command.name, *command.aliases))
    return f"{names} {command.usage}".rstrip()


def needs_argument(run: Handler, what: str) -> Handler:
    def checked(state: ChatState, text: str) -> bool | None:
        if not text:
            raise CommandError(f"this command needs {what}")
        return run(state, text)

    return checked


def takes_no_argument(name: str, run: Handler) -> Handler:
    def checked(state: ChatState, text: str) -> bool | None:
        if text:
            raise CommandError(f"/{name} takes no argument")
        return run(state, text)

    return checked


def _plain(name: str, about: str, run: Handler, aliases: tuple[str, ...] = ()) -> Command:
    return Command(name, "", about, takes_no_argument(name, run), aliases)


COMMANDS: list[Command] = [
    Command("help", "[COMMAND]", "list the commands, or explain one", run_help),
    *(setting_command(*spec) for spec in SETTINGS),
    Command("seed", "N|random", "seed for reproducible sampling", run_seed,
            choices=("random",)),
    _plain("settings", "show every setting", run_settings),
    Command("system", "[TEXT|clear]", "set the system prompt (no argument: show it; clear: remove it)",
            run_system, choices=("clear",)),
    _plain("clear", "start over (the system prompt stays)", run_clear),
    _plain("retry", "generate the last reply again", run_retry),
    _plain("compact", "put the model's summary of every exchange but the last in their place in the context",
           run_compact),
    _plain("undo", "remove the last exchange", run_undo),
    Command("edit", "[N]", "put user message N (from 1; default: the last) back in the line to change and "
            "resend; the replies from there on stay another version (Ctrl-C or an empty line: no change)",
            run_edit),
    Command("branches", "[N]", "list the versions where /retry and /edit forked the conversation (* the one "
            "followed), or follow version N", run_branches),
    Command("load", "MODEL", "load other weights (a path, OWNER/REPO[:QUANT], or a name /models lists); the "
            "conversation goes on", needs_argument(run_load, "a model path or name"), takes_path=True,
            takes_model=True),
    _plain("models", "every model on this machine llama-chat can run, with the name /load takes", run_models),
    Command("save", "FILE", "save the conversation, settings and model path as JSON",
            needs_argument(run_save, "a file name"), takes_path=True),
    Command("open", "FILE", "open a conversation saved with /save",
            needs_argument(run_open, "a file name"), takes_path=True),
    Command("history", "[find WORDS|open ID|WORDS|off|on]",
            "the conversations kept (newest first), those that hold some words, one opened again (this one stays "
            "kept); off: keep nothing of this one", run_history, choices=("find", "open", "off", "on")),
    Command("lookup", "N|auto", "draft up to N tokens by prompt lookup (0: off; auto: where it measures faster)",
            needs_argument(run_lookup, "a number of tokens or auto"), choices=("auto", "0")),
    Command("draft", "MODEL|off", "draft with a smaller model of the same vocabulary (off: prompt lookup again)",
            needs_argument(run_draft, "a model path or name, or off"), takes_path=True, takes_model=True),
    Command("read", "PATH...|clear", "put text files (globs too) into the next message, each with its name",
            run_read, choices=("clear",), takes_path=True, several=True),
    Command("copy", "[code]", "put the last reply (code: its last code block) on the clipboard, through the terminal",
            run_copy, choices=("code",)),
    Command("format", "json|schema FILE|regex PATTERN|grammar FILE|off",
            "hold replies to a format: any JSON object, a JSON Schema, a regex or a grammar (no argument: show it)",
            run_format, choices=("json", "schema", "regex", "grammar", "off")),
    Command("tools", "[on NAME...|all|off NAME...|all|choice auto|required|show|fold|folder PATH]",
            "the tools the model may call (no argument: list them): turn them on or off, require a call, show "
            "results whole or folded, let the file tools use another folder", run_tools,
            choices=("on", "off", "choice", "show", "fold", "folder", "all", "auto", "required"), several=True),
    _plain("mcp", "the MCP servers: their state and tools", run_mcp),
    _plain("stats", "statistics of the last reply and the context", run_stats),
    Command("prompt-math", "[exact|fast]", "prompt chunks exact (16-bit activations) or fast (8-bit activation "
            "blocks, as ik_llama.cpp runs them; replies stay exact); no argument: show it", run_prompt_math,
            choices=("exact", "fast")),
    _plain("device", "the device and dtype the model runs on", run_device),
    _plain("info", "what the model file holds: shapes, tensor types, license, template, stop tokens", run_info),
    switch_command("markdown", "render finished replies as Markdown"),
    switch_command("think", "a reasoning model's thinking: keep it on screen, or fold it to one line"),
    _plain("quit", "leave (Ctrl-D does too)", run_quit, aliases=("exit", "bye")),
]

_BY_NAME = {name: command for command in COMMANDS for name in (command.name, *command.aliases)}


def names() -> list[str]:
    """Every command name and alias."""
    return list(_BY_NAME)


def find_or_none(name: str) -> Command | None:
    return _BY_NAME.get(name)


def find(name: str) -> Command:
    """The command called name, or a CommandError suggesting the closest one."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    # A command the name begins (/temper: /temperature), else the most similar one.
    close = [candidate for candidate in names() if name and candidate.startswith(name)]
    close = close or difflib.get_close_matches(name, names(), n=1, cutoff=0.5)
    hint = f"did you mean /{close[0]}? " if close else ""
    raise CommandError(f"unknown command /{name}: {hint}(/help lists the commands)")


def dispatch(state: ChatState, line: str) -> bool:
    """Run a "/command argument" line; False when the chat should end."""
    name, argument = (line.strip().removeprefix("/").split(None, 1) + ["", ""])[:2]
    return not find(name.lower()).run(state, argument.strip())
