"""`llama-chat history [search WORDS... | rm ID... | clear]`: the conversations kept, the
newest first; those that hold some words; some or all of them removed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llama_chat.chat.display import literal
from llama_chat.chat.history_db import HistoryDatabase, HistoryError
from llama_chat.chat.history_keeper import listed, one_line, remove_cache
from llama_chat.paths import history_database_path


def main(argv: list[str]) -> int:
    options = _parser().parse_args(argv)
    path = history_database_path()
    try:
        if not path.exists():  # listing or searching makes no database
            return _nothing_kept(options, path)
        with HistoryDatabase.open(path) as database:
            if database.note:
                print(f"llama-chat: {database.note}", file=sys.stderr)
            return _ACTIONS[options.action or "list"](database, options)
    except HistoryError as error:
        print(f"llama-chat: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llama-chat history", description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=_count, default=20, metavar="N", help="show at most N (default 20)")
    actions = parser.add_subparsers(dest="action", metavar="{search,rm,clear}")
    search = actions.add_parser("search", help="the conversations that hold every word, the best matches first")
    search.add_argument("words", nargs="+", help="words to find (after -- when one starts with -)")
    search.add_argument("--limit", type=_count, default=argparse.SUPPRESS, metavar="N", help="show at most N")
    remove = actions.add_parser("rm", help="remove conversations")
    remove.add_argument("ids", nargs="+", type=int, metavar="ID", help="a conversation's id, as listed")
    clear = actions.add_parser("clear", help="remove every conversation (asks first)")
    clear.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")
    return parser


def _count(text: str) -> int:
    if not text.isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a count from 1 up: {text!r}")
    return int(text)


def _nothing_kept(options: argparse.Namespace, path: Path) -> int:
    if options.action == "rm":
        for number in options.ids:
            print(f"llama-chat: no conversation {number} in the history", file=sys.stderr)
        return 1
    print(f"no conversations kept yet (the history is kept in {literal(str(path))})")
    return 0


def _list(database: HistoryDatabase, options: argparse.Namespace) -> int:
    entries = database.recent(options.limit)
    if not entries:
        print("no conversations kept yet")
        return 0
    print("\n".join(listed(entries)))
    return 0


def _search(database: HistoryDatabase, options: argparse.Namespace) -> int:
    words = " ".join(options.words)
    found = database.search(words, options.limit)
    if not found:
        print(f"no conversation holds all of: {one_line(words, 60)}")
        return 0
    print("\n".join(listed(found)))
    return 0


def _remove(database: HistoryDatabase, options: argparse.Namespace) -> int:
    missing = 0
    for number in options.ids:
        if database.remove(number):
            remove_cache(number)
            print(f"removed conversation {number}")
        else:
            print(f"llama-chat: no conversation {number} in the history", file=sys.stderr)
            missing += 1
    return 1 if missing else 0


def _clear(database: HistoryDatabase, options: argparse.Namespace) -> int:
    if not options.yes:
        if not sys.stdin.isatty():
            print("llama-chat: history clear asks before removing every conversation, and there is no terminal "
                  "to ask at; add --yes", file=sys.stderr)
            return 1
        try:
            answer = input(f"remove every conversation from {literal(str(database.path))}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    count = database.clear()
    remove_cache()
    print(f"removed {count} conversation{'s' * (count != 1)}")
    return 0


_ACTIONS = {"list": _list, "search": _search, "rm": _remove, "clear": _clear}


