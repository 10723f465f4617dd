"""The chat's history from the command line: kept unless --no-history, and --resume [ID|WORDS]
continuing the last conversation kept, one by its id, or the best match for some words."""

from __future__ import annotations

import argparse
import sys

from llama_chat.chat.history_db import HistoryDatabase, HistoryError
from llama_chat.chat.history_keeper import HistoryKeeper, import_kept_conversation
from llama_chat.chat.session import Session
from llama_chat.errors import UsageError
from llama_chat.paths import history_caches_path, history_database_path, kept_conversation_path

LAST = ""  # --resume given alone


def add_conversation_arguments(parser: argparse.ArgumentParser) -> None:
    """--open and --save (a file), --resume and --no-history (the history), --when-full."""
    parser.add_argument("--when-full", choices=("drop", "compact"), default="drop",
                        help="when a message does not fit the context: drop the oldest exchanges (the default: "
                        "small models such as the default one summarise poorly), or compact them into the "
                        "model's summary (/compact does it at any time); either way they stay in the history")
    parser.add_argument("--open", metavar="FILE",
                        help="continue a conversation saved with /save or --save (its cache too, when it fits)")
    parser.add_argument("--save", metavar="FILE",
                        help="write the conversation and its cache to FILE after the reply (with -p) or at exit")
    parser.add_argument("--resume", nargs="?", const=LAST, metavar="ID|WORDS",
                        help="continue the last conversation of the history (kept after every input), or the one "
                        "with this id, or the best match for these words (`llama-chat history` lists them)")
    parser.add_argument("--no-history", action="store_true",
                        help="keep nothing of this chat in the history (and resume nothing)")


def opened_history(no_history: bool) -> HistoryKeeper | None:
    """The keeper of this chat's conversation; None with --no-history, or where the history
    cannot be opened (one line on stderr: the chat goes on without it)."""
    if no_history:
        return None
    try:
        database = HistoryDatabase.open(history_database_path())
    except HistoryError as error:
        print(f"llama-chat: {error}", file=sys.stderr)
        return None
    try:
        imported = import_kept_conversation(database, kept_conversation_path())
    except (HistoryError, OSError) as error:
        imported = f"the conversation an earlier llama-chat kept for --resume stays where it is: {error}"
    for note in (database.note, imported):
        if note:
            print(f"llama-chat: {note}", file=sys.stderr)
    return HistoryKeeper(database, history_caches_path())


def resume(keeper: HistoryKeeper | None, session: Session, wanted: str) -> None:
    """Continue the conversation --resume names (LAST: the newest); one line on stderr."""
    if keeper is None:
        raise UsageError("--resume continues a conversation of the history, which is off (--no-history)"
                         " or could not be opened")
    conversation_id = keeper.database.last() if wanted == LAST else keeper.database.find(wanted)
    if conversation_id is None:
        if wanted == LAST:
            print("llama-chat: no conversation kept yet; a new one starts", file=sys.stderr)
            return
        raise UsageError(f"no conversation in the history is {wanted!r} or holds those words: "
                         "`llama-chat history` lists them")
    print(f"llama-chat: resumed {keeper.open(session, conversation_id)}", file=sys.stderr)


def keep_reply(keeper: HistoryKeeper | None, session: Session) -> None:
    """Keep a one-shot reply's conversation (-p), one line on stderr where it cannot be."""
    if keeper is None:
        return
    try:
        keeper.keep(session)
    except HistoryError as error:
        print(f"llama-chat: {error}", file=sys.stderr)
