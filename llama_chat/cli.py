"""The `llama-chat` command: sub-commands, and the one place user errors are printed."""

from __future__ import annotations

import sys

from .errors import LlamaChatError

SUBCOMMANDS = ("bench",)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        if argv and argv[0] == "bench":
            from .bench import main as bench_main

            return bench_main(argv[1:])
        print("llama-chat: chatting needs model loading, which is not built yet; try `llama-chat bench`",
              file=sys.stderr)
        return 2
    except LlamaChatError as error:
        if debug:
            raise
        print(f"llama-chat: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
