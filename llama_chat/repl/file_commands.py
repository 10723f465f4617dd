"""Slash commands for files in and out: /save and /open (the conversation), /read (text
files into the next message) and /copy (the last reply to the clipboard, through the
terminal)."""

from __future__ import annotations

import os
import shlex

from llama_chat.chat.attachments import read_into, space_for_files
from llama_chat.chat.thinking import answer_of
from llama_chat.errors import LlamaChatError
from llama_chat.repl.chat_state import ChatState, CommandError, exchanges
from llama_chat.repl.clipboard import known_to_accept, last_code_block, osc52


def run_save(state: ChatState, text: str) -> None:
    path, cached = state.session.save(text)
    with_cache = f" and the cache of {cached} tokens" if cached else ""
    state.renderer.note(f"saved {exchanges(len(state.session.conversation.exchanges))}{with_cache} to {path}")


def run_open(state: ChatState, text: str) -> None:
    note = state.session.open(text)
    if note:
        state.renderer.note(note)
    state.renderer.note(f"opened {text}: {exchanges(len(state.session.conversation.exchanges))}")


def run_read(state: ChatState, text: str) -> None:
    files = state.files
    if text.strip() in ("", "clear"):
        if text.strip() == "clear":
            files.clear()
        held = ", ".join(f"{a.name} ({a.tokens} tokens)" for a in files.attachments)
        state.renderer.line(f"read for the next message: {held}" if held else "no files read for the next message")
        return
    try:
        patterns = shlex.split(text)
    except ValueError as error:
        raise CommandError(f"/read: {error} (quote a path with spaces)") from None
    session = state.session
    for pattern in patterns:
        try:
            for attachment in read_into(files, pattern, session):
                left = space_for_files(session) - files.tokens()
                state.renderer.note(f"read {attachment.name}: {attachment.tokens} tokens for the next message; "
                                    f"{left} tokens of room left")
        except LlamaChatError as error:
            state.renderer.error(str(error))


def run_copy(state: ChatState, text: str) -> None:
    what = text.strip()
    if what not in ("", "code"):
        raise CommandError(f"/copy takes nothing (the last reply) or 'code' (its last code block), not {what!r}")
    if not state.session.conversation.exchanges:
        raise CommandError("no reply to copy yet")
    copied = answer_of(state.session.conversation.exchanges[-1].reply)
    if what == "code":
        copied = last_code_block(copied)
        if copied is None:
            raise CommandError("the last reply has no code block (between ``` fences) to copy")
    if not state.renderer.send_to_terminal(osc52(copied)):
        raise CommandError("the output is not a terminal: /copy puts text on the clipboard through the terminal")
    note = f"copied {len(copied)} characters to the clipboard"
    if not known_to_accept():
        term = os.environ.get("TERM_PROGRAM") or os.environ.get("TERM") or "unknown"
        note += (f"; this terminal ({term}) is not known to accept it (OSC 52): if nothing was copied, "
                 "select the text on screen")
    state.renderer.note(note)
