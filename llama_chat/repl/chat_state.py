"""What slash commands share: the chat state they act on, the Command record, CommandError,
and the small parsers and formatters the command modules use."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from llama_chat.chat.attachments import PendingFiles
from llama_chat.chat.history_db import HistoryError
from llama_chat.chat.history_keeper import HistoryKeeper
from llama_chat.chat.session import Session
from llama_chat.chat.tool_use import ToolUse
from llama_chat.chat.tool_runner import ToolRunner
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.repl.render import Renderer
from llama_chat.repl.tool_view import ChatCallView

STOP = True  # what a handler returns to end the chat (others return None)


class CommandError(LlamaChatError):
    """A slash command was misspelt or given a bad argument."""


@dataclass
class ChatState:
    """What commands act on."""

    session: Session
    renderer: Renderer
    load_model: Callable[[str], Llama]  # the command line's device, dtype and chat format applied
    load_draft: Callable[[str], Llama]  # a draft model: the command line's device, default weights
    files: PendingFiles = dataclasses.field(default_factory=PendingFiles)  # read for the next message
    editing: int | None = None  # the user message /edit put back in the next prompt (from 1)
    tools: ToolUse | None = None  # the tools replies may call, and the consent given
    ask_line: Callable[[str], str] | None = None  # asks the user a question on a line of its own
    history: HistoryKeeper | None = None  # keeps the conversation (None: --no-history)
    history_failing: bool = False  # the last keep failed, and said so

    def keep(self) -> None:
        """Keep the conversation in the history; a failure is one line until keeping works again."""
        if self.history is None:
            return
        try:
            self.history.keep(self.session)
        except HistoryError as error:
            if not self.history_failing:
                self.renderer.error(f"the conversation is not kept in the history: {error}")
            self.history_failing = True
        else:
            self.history_failing = False

    def tool_runner(self) -> ToolRunner | None:
        """The runner of a turn's calls, asking about each, with the tools on now offered
        (before the turn starts: what is offered is in its prompt)."""
        if self.tools is None:
            return None
        for note in self.tools.sync(self.session):
            self.renderer.note(note)
        return self.tools.runner(self.session, ChatCallView(self.renderer, self.ask_line))


Handler = Callable[[ChatState, str], "bool | None"]


@dataclass(frozen=True)
class Command:
    name: str
    usage: str  # the arguments, for /help
    help: str
    run: Handler
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()  # argument words offered by completion
    takes_path: bool = False  # the argument is a file path (completed as one)
    takes_model: bool = False  # the argument names a model (the names `llama-chat models` lists are offered)
    several: bool = False  # it takes several arguments (the last one is completed)


def parse_number(kind: type, name: str, argument: str) -> int | float:
    """A whole number or a finite real number from the command's argument."""
    try:
        value = kind(argument)
    except ValueError:
        wanted = "a whole number" if kind is int else "a number"
        raise CommandError(f"/{name} needs {wanted}, got {argument!r}") from None
    if not math.isfinite(value):
        raise CommandError(f"/{name} needs a finite number, got {argument!r}")
    return value


def exchanges(count: int) -> str:
    return f"{count} exchange{'' if count == 1 else 's'}"


def shorten(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 1] + "…")
