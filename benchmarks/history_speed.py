"""The conversation history at scale: N conversations (default 10,000) of several messages
saved into a new database in a temporary folder, then the median time of listing the
newest 20 and of searches (a common word, a rare one, FTS5 syntax, 100 KB of common words), and of
opening the database (its quick_check included).

    .venv/bin/python benchmarks/history_speed.py [--conversations 10000] [--exchanges 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from llama_chat.chat.history_db import ConversationRecord, HistoryDatabase
from llama_chat.engine.device import cpu_model_name

# Words drawn with Zipf-like weights: the first are in nearly every message, the last in few.
COMMON = "the of and to a in is it you that for on with as this be are was".split()
WORDS = COMMON + [f"word{number}" for number in range(20_000)]
WEIGHTS = [1 / rank for rank in range(1, len(WORDS) + 1)]
RARE = "zanzibar"  # in one conversation of a thousand
PASTED = ((" ".join(COMMON) + " ") * 2000)[:100_000]  # its first words all common: the slowest search to rank


def sentence(generator: random.Random, length: int) -> str:
    return " ".join(generator.choices(WORDS, WEIGHTS, k=length))


def record(generator: random.Random, exchanges: int, number: int) -> ConversationRecord:
    messages = []
    for _ in range(exchanges):
        messages += [("user", sentence(generator, 20)), ("assistant", sentence(generator, 120))]
    if number % 1000 == 0:
        messages[-1] = ("assistant", messages[-1][1] + f" {RARE}")
    document = json.dumps({"messages": [{"role": role, "content": content} for role, content in messages]})
    return ConversationRecord("SmolLM2-360M-Instruct", messages[0][1], exchanges, 180 * exchanges, document, messages)


def median_ms(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--exchanges", type=int, default=3, help="exchanges a conversation (two messages each)")
    parser.add_argument("--repeats", type=int, default=21)
    options = parser.parse_args()
    print(f"CPU: {cpu_model_name()}")
    generator = random.Random(0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "history.sqlite3"
        with HistoryDatabase.open(path) as database:
            saves = []
            for number in range(options.conversations):
                conversation = record(generator, options.exchanges, number)
                started = time.perf_counter()
                database.save(None, conversation)
                saves.append(time.perf_counter() - started)
        size = sum(file.stat().st_size for file in Path(folder).iterdir()) / 1e6
        print(f"{options.conversations} conversations of {2 * options.exchanges} messages: {size:.0f} MB, "
              f"save median {statistics.median(saves) * 1000:.2f} ms, total {sum(saves):.1f} s")
        print(f"open (quick_check): {median_ms(lambda: HistoryDatabase.open(path).close(), 5):.1f} ms")
        with HistoryDatabase.open(path) as database:
            timed = {
                "recent(20)": lambda: database.recent(20),
                "search('the') (common)": lambda: database.search("the"),
                "search('the of and') (common, three)": lambda: database.search("the of and"),
                f"search({RARE!r}) (rare)": lambda: database.search(RARE),
                "search(FTS5 syntax)": lambda: database.search('NEAR(the of) "a* OR -b :c ^d ( ) AND NOT'),
                "search(100 KB of common words)": lambda: database.search(PASTED),
            }
            for name, action in timed.items():
                found = len(action())
                print(f"{name:40} {median_ms(action, options.repeats):8.2f} ms  ({found} found)")


if __name__ == "__main__":
    main()
