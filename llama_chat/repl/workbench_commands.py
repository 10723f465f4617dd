"""The workbench's slash commands: /read (files into the next message), /copy (to the
clipboard through the terminal), /format (structured answers), /edit and /branches
(versions of the conversation)."""

from __future__ import annotations

import os
import shlex

from llama_chat.chat.attachments import read_into, room_for_files
from llama_chat.chat.session import Session
from llama_chat.chat.thinking import answer_of
from llama_chat.errors import LlamaChatError
from llama_chat.repl.chat_state import ChatState, CommandError, exchanges, parse_number, shorten
from llama_chat.repl.clipboard import known_to_accept, last_code_block, osc52


def run_edit(state: ChatState, text: str) -> None:
    session = state.session
    number = parse_number(int, "edit", text) if text else len(session.exchanges)
    if not 1 <= number <= len(session.exchanges):
        raise CommandError(session.no_message(number))
    state.editing = number  # the prompt shows it next; sending it makes a new version


def run_branches(state: ChatState, text: str) -> None:
    session = state.session
    if text:
        number = parse_number(int, "branches", text)
        session.switch_version(number)
        last = session.exchanges[-1]
        state.renderer.note(f"following version {number}: {exchanges(len(session.exchanges))}, the last "
                            f"{shorten(last.user)} -> {shorten(last.reply)}")
        return
    listed = session.versions()
    if not listed:
        state.renderer.line("the conversation has one version: /retry and /edit make others")
    fork = None
    for version in listed:
        if version.position != fork:
            fork = version.position
            state.renderer.line(f"at message {fork + 1}:")
        first, more = version.exchanges[0], len(version.exchanges) - 1
        then = f" (then {exchanges(more)})" if more else ""
        mark = "*" if version.current else " "
        state.renderer.line(f"{mark} {version.number:>2}  {shorten(first.user)} -> {shorten(first.reply)}{then}")


def run_format(state: ChatState, text: str) -> None:
    from llama_chat.engine.constraint import FormatError, read_format  # the grammar engine loads only when asked for

    session = state.session
    kind, _, value = text.partition(" ")
    value = value.strip()
    if kind == "off" and not value:
        session.set_format(None)
    elif (kind == "json" and not value) or (kind in ("schema", "regex", "grammar") and value):
        try:
            chosen = read_format(kind, value)
            chosen.check(session.model.tokenizer)
        except FormatError as error:
            raise CommandError(str(error)) from None
        session.set_format(chosen)
    elif kind:
        raise CommandError(f"/format takes json, schema FILE|JSON, regex PATTERN, grammar FILE or off, not {text!r}")
    state.renderer.note(f"format: {describe_format(session)}")


def describe_format(session: Session) -> str:
    return "off" if session.format is None else session.format.describe()


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
                left = room_for_files(session) - files.tokens()
                state.renderer.note(f"read {attachment.name}: {attachment.tokens} tokens for the next message; "
                                    f"{left} tokens of room left")
        except LlamaChatError as error:
            state.renderer.error(str(error))


def run_copy(state: ChatState, text: str) -> None:
    what = text.strip()
    if what not in ("", "code"):
        raise CommandError(f"/copy takes nothing (the last reply) or 'code' (its last code block), not {what!r}")
    if not state.session.exchanges:
        raise CommandError("no reply to copy yet")
    copied = answer_of(state.session.exchanges[-1].reply)
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
