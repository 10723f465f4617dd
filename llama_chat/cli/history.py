"""`llama-chat history [search WORDS... | rm ID... | clear]`: the conversations kept, the
newest first; those that hold some words; some or all of them removed."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from llama_chat.chat.display import literal
from llama_chat.chat.history_db import HistoryDatabase, HistoryEntry, HistoryError
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
    width = _id_width(entries)
    print(f"{'id':>{width}}  {'when':16}  {'model':20}  {'exch.':>5}  first message")
    for entry in entries:
        print(_row(entry, width))
    return 0


def _search(database: HistoryDatabase, options: argparse.Namespace) -> int:
    words = " ".join(options.words)
    found = database.search(words, options.limit)
    if not found:
        print(f"no conversation holds all of: {_one_line(words, 60)}")
        return 0
    width = _id_width(found)
    columns = shutil.get_terminal_size().columns
    for match in found:
        print(_row(match, width))
        print(f"{'':{width}}  {_one_line(match.snippet, max(20, columns - width - 3))}")
    return 0


def _remove(database: HistoryDatabase, options: argparse.Namespace) -> int:
    missing = 0
    for number in options.ids:
        if database.remove(number):
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
    print(f"removed {count} conversation{'s' * (count != 1)}")
    return 0


_ACTIONS = {"list": _list, "search": _search, "rm": _remove, "clear": _clear}


def _id_width(entries: list) -> int:
    return max(2, *(len(str(entry.id)) for entry in entries))


def _row(entry: HistoryEntry, width: int) -> str:
    """id, when it was last changed (local time), model, exchanges and the first message,
    on one line the terminal's width, every character shown as it is spelt."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.updated))
    start = f"{entry.id:>{width}}  {when:16}  {_one_line(entry.model, 20):20}  {entry.exchanges:>5}  "
    return start + _one_line(entry.title, max(20, shutil.get_terminal_size().columns - len(start) - 1))


def _one_line(text: str, width: int) -> str:
    """Text on one line (its spaces and line breaks made single spaces), cut to `width`
    characters, those that do not print written as escapes."""
    text = " ".join(text.split())
    return literal(text if len(text) <= width else text[: width - 3] + "...")
