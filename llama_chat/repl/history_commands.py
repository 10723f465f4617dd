"""/history: the conversations kept, those that hold some words, one opened again, and
keeping this one or not."""

from __future__ import annotations

from llama_chat.chat.history_keeper import HistoryKeeper, listed
from llama_chat.repl.chat_state import ChatState, CommandError

SHOWN = 10  # conversations a listing shows


def run_history(state: ChatState, text: str) -> None:
    action, _, argument = text.strip().partition(" ")
    argument = argument.strip()
    keeper = _keeper(state)
    if action in ("", "find"):
        database = keeper.database
        entries = database.recent(SHOWN) if action == "" else database.search(argument, SHOWN)
        if not entries:
            state.renderer.note("no conversations kept yet" if action == ""
                                else "no conversation holds all of those words")
            return
        for line in listed(entries):
            state.renderer.line(line)
    elif action == "open":
        _open(state, keeper, argument)
    elif action == "off":
        keeper.forget()
        state.renderer.note("this conversation is not kept, and what was kept of it is removed "
                            "(/history on keeps it again)")
    elif action == "on":
        keeper.on = True
        state.keep()
        state.renderer.note("this conversation is kept in the history")
    else:
        raise CommandError(f"/history takes nothing, find WORDS, open ID|WORDS, on or off, not {action!r}")


def _keeper(state: ChatState) -> HistoryKeeper:
    if state.history is None:
        raise CommandError("the history is off in this chat (--no-history, or it could not be opened)")
    return state.history


def _open(state: ChatState, keeper: HistoryKeeper, wanted: str) -> None:
    if not wanted:
        raise CommandError("/history open needs a conversation's id or some of its words")
    conversation_id = keeper.database.find(wanted)
    if conversation_id is None:
        raise CommandError(f"no conversation in the history is {wanted!r} or holds those words")
    state.keep()  # this one, as it is, before another takes its place
    state.renderer.note(f"opened {keeper.open(state.session, conversation_id)}")
