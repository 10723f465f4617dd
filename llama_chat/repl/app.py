"""The interactive chat: a prompt_toolkit input loop. Lines starting with "/" go to the
slash commands, others to the session; replies go to the renderer.

After /edit the line holds the message to change and resend (Ctrl-C cancels).

Keys: Enter sends, Esc then Enter (Alt+Enter) starts a new line, a pasted block stays one
message, Up/Down and Ctrl-R search the history (kept in the XDG state directory), Tab
completes commands and paths, Ctrl-C clears the line or stops a reply, Ctrl-D leaves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO

try:
    import termios
except ImportError:  # not a POSIX terminal: keys are left as the console handles them
    termios = None

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import (
    CompleteEvent,
    Completer,
    Completion,
    PathCompleter,
)
from prompt_toolkit.document import Document
from prompt_toolkit.filters import completion_is_selected
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.input import Input
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.output import Output, create_output

from llama_chat.chat.attachments import PendingFiles
from llama_chat.chat.history_keeper import HistoryKeeper
from llama_chat.chat.session import Session
from llama_chat.chat.tool_use import ToolUse
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.models.catalog import model_names
from llama_chat.paths import history_path
from llama_chat.repl import commands
from llama_chat.repl.chat_state import ChatState
from llama_chat.repl.model_commands import describe_briefly
from llama_chat.repl.render import Renderer
from llama_chat.text.undecodable import replace_undecodable, undecodable_note


def open_history() -> History:
    """The persistent history; kept in memory only when its folder cannot be made."""
    path = history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        return InMemoryHistory()
    return FileHistory(str(path))


class ChatCompleter(Completer):
    """Completes command names after "/", argument words, paths after /load /save /open /read, and
    the names of the models on this machine after /load and /draft."""

    def __init__(self, model_names: Callable[[], list[str]] = model_names) -> None:
        self.paths = PathCompleter(expanduser=True)
        self.model_names = model_names
        self.known_models: list[str] | None = None  # looked up at the first completion of a model's name

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterable[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or text.startswith("//"):
            return
        name, space, argument = text[1:].partition(" ")
        if not space:
            for candidate in commands.names():
                if candidate.startswith(name):
                    yield Completion(candidate, start_position=-len(name))
            return
        command = commands.find_or_none(name)
        if command is None:
            return
        argument = argument.lstrip()
        if command.several:
            argument = argument.rpartition(" ")[2]
        if command.takes_model:
            if self.known_models is None:
                self.known_models = self.model_names()
            for name in self.known_models:
                if name.startswith(argument) and argument != name:
                    yield Completion(name, start_position=-len(argument))
        if command.takes_path:
            yield from self.paths.get_completions(Document(argument), complete_event)
        for choice in command.choices:
            if choice.startswith(argument):
                yield Completion(choice, start_position=-len(argument))


def key_bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("enter")
    def _send(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    @bindings.add("enter", filter=completion_is_selected)  # registered later, so it wins
    def _take_completion(event: KeyPressEvent) -> None:
        event.current_buffer.complete_state = None

    @bindings.add("escape", "enter")  # also what Alt+Enter sends
    def _new_line(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    return bindings


def toolbar(session: Session) -> str:
    """Model, device, temperature and context use, for the bottom toolbar."""
    return (
        f" {session.model.name} | {session.model.device} | temperature {session.settings.temperature:g} | "
        f"context {session.context_used()}/{session.capacity} "
        + (f"(compacted −{session.compaction_freed}) " if session.compaction_freed > 0 else "")
    )


def continuation(width: int, line_number: int, wrap_count: int) -> str:
    return "." * (width - 1) + " "


def prompt_session(
    state: ChatState, *, input: Input | None = None, output: Output | None = None, history: History | None = None
) -> PromptSession:
    return PromptSession(
        message="> ",
        multiline=True,  # Enter is rebound to send; Esc-Enter adds lines
        prompt_continuation=continuation,
        key_bindings=key_bindings(),
        completer=ChatCompleter(),
        complete_while_typing=True,
        history=history if history is not None else open_history(),
        bottom_toolbar=lambda: toolbar(state.session),
        input=input,
        # With stdout redirected, the prompt still belongs on the terminal.
        output=output or create_output(always_prefer_tty=True),
    )


def handle(state: ChatState, text: str) -> bool:
    """Act on one submitted input; False when the chat should end."""
    if not text.strip():
        return True
    text = readable(state, text)
    if text.startswith("/") and not text.startswith("//"):
        return commands.dispatch(state, text)
    message = state.files.message(text[1:] if text.startswith("//") else text)

    tools = state.tool_runner()
    turn = state.session.send(message)
    state.files.clear()  # sent: a message refused (too long) keeps them for the next try
    state.renderer.play(turn, tools)
    return True


def resend(state: ChatState, number: int, text: str) -> None:
    """Send the edited user message `number`: a new version from there on. An empty line
    changes nothing."""
    if not text.strip():
        state.renderer.note("edit cancelled")
        return
    text = readable(state, text)
    tools = state.tool_runner()
    state.renderer.play(state.session.edit(number, text), tools)


def readable(state: ChatState, text: str) -> str:
    """Typed text with each undecodable byte replaced, and a note when there was one."""
    text, undecodable = replace_undecodable(text)
    if undecodable:
        state.renderer.note(undecodable_note("the input", undecodable))
    return text


@contextmanager
def keys_held_back(stream: TextIO | None = None) -> Iterator[None]:
    """While the chat holds the terminal outside its prompt (a reply streams, a command runs,
    the next prompt is being set up), keys typed are neither echoed nor lost: the terminal
    stops echoing and editing lines, and the keys wait in its queue for the next prompt,
    which reads them as typed ahead. Ctrl-C still interrupts; Ctrl-D is a key like the
    others (not an end of file)."""
    stream = sys.stdin if stream is None else stream
    if termios is None:
        yield
        return
    try:
        descriptor = stream.fileno()
        saved = termios.tcgetattr(descriptor)
    except (AttributeError, ValueError, OSError, termios.error):  # not a terminal
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ICANON)  # local modes; TCSANOW keeps what was typed
    termios.tcsetattr(descriptor, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(descriptor, termios.TCSANOW, saved)


def run_repl(
    session: Session,
    load_model: Callable[[str], Llama],
    *,
    load_draft: Callable[[str], Llama] | None = None,
    renderer: Renderer | None = None,
    input: Input | None = None,
    output: Output | None = None,
    history: History | None = None,
    keeper: HistoryKeeper | None = None,
    files: PendingFiles | None = None,
    tools: ToolUse | None = None,
    before_input: Callable[[ChatState], None] | None = None,
) -> int:
    """Chat until /quit or Ctrl-D; returns the exit code (0). With a keeper, the conversation
    is kept in the history after every input (for --resume); `files` (-f) go into the first message; `tools`
    are the tools replies may call; `before_input` sees the chat before each input is
    handled (to move it onto kernels built meanwhile)."""
    state = ChatState(session, renderer or Renderer(), load_model, load_draft or load_model, files or PendingFiles(),
                      tools=tools, history=keeper)
    prompt = prompt_session(state, input=input, output=output, history=history)
    # Questions about tool calls get a prompt of their own: no history, completion or toolbar.
    asker = PromptSession(input=input, output=output or create_output(always_prefer_tty=True))
    state.ask_line = lambda question: asker.prompt(question)
    model = session.model
    state.renderer.note(
        f"llama-chat: {model.name} on {describe_briefly(model)}, context {session.capacity} tokens "
        "(/help, /device for more; Ctrl-D leaves)"
    )
    # The prompt restores the terminal to how it found it: held back, so that no key typed
    # between a reply's end and the next prompt (Ctrl-D, say) meets the line discipline.
    with keys_held_back():
        while True:
            editing, state.editing = state.editing, None
            # After /edit the line holds that message, sent as it is (a leading / included).
            default = state.session.conversation.exchanges[editing - 1].user if editing else ""
            try:
                text = prompt.prompt(message="edit> " if editing else "> ", default=default)
            except KeyboardInterrupt:
                if editing:
                    state.renderer.note("edit cancelled")
                continue  # the line is cleared
            except EOFError:
                return 0
            if not _answer(state, text, editing, before_input):
                return 0


def _answer(state: ChatState, text: str, editing: int | None, before_input) -> bool:
    """One line typed (a message, a command, or the message being edited); False after
    /quit. Ctrl-C and a LlamaChatError become a line, and the conversation is kept however
    it went."""
    try:
        if before_input is not None:
            before_input(state)
        if editing:
            resend(state, editing, text)
        elif not handle(state, text):
            return False
    except KeyboardInterrupt:
        state.renderer.note("interrupted")
    except LlamaChatError as error:
        state.renderer.error(str(error))
    finally:
        state.keep()
    return True
