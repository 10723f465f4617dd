"""Slash commands for how replies are made: /format (what they must look like) and the
speculation that drafts them, /lookup (prompt lookup) and /draft (a draft model)."""

from __future__ import annotations

from llama_chat.chat.session import Session
from llama_chat.engine.speculation import Speculation
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.options import DraftLength
from llama_chat.parallel.sharding import RankLost
from llama_chat.repl.chat_state import ChatState, CommandError
from llama_chat.repl.model_commands import describe_briefly


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


def run_lookup(state: ChatState, text: str) -> None:
    try:
        state.session.set_lookup(DraftLength.parse(text, "/lookup"))
    except UsageError as error:
        raise CommandError(str(error)) from None
    state.renderer.note(f"prompt lookup: {describe_lookup(state.session.speculation)}")


def run_draft(state: ChatState, text: str) -> None:
    session = state.session
    if text == "off":
        session.set_draft(None)
        state.renderer.note(f"draft model off; prompt lookup: {describe_lookup(session.speculation)}")
        return
    try:
        draft = state.load_draft(text)
    except RankLost:
        raise
    except Exception as error:  # noqa: BLE001 (as /load: the chat goes on)
        reason = str(error) if isinstance(error, LlamaChatError) else f"{type(error).__name__}: {error}"
        raise CommandError(f"could not load the draft model {text}: {reason}") from None
    try:
        session.set_draft(draft, text)
    except UsageError as error:
        raise CommandError(str(error)) from None
    state.renderer.note(f"drafting with {draft.name} on {describe_briefly(draft)}")


def describe_lookup(speculation: Speculation) -> str:
    if speculation.lookup.off:
        return "off"
    if speculation.lookup.automatic:
        return "auto (drafts where it measures faster)"
    return f"up to {speculation.lookup.most} tokens"
