"""The `llama-chat` command: which sub-command runs, and the one place user errors are printed.

Each sub-command is a module of this package with its own parser and `main(argv)`; the
chat is the command without a sub-command name.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from llama_chat.cli.options import configure_folders
from llama_chat.cli.subcommands import SUBCOMMANDS
from llama_chat.engine.device import flush_denormals
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.parallel.sharding import RankLost


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    flush_denormals()
    configure_folders()  # the environment's folders, once, for everything this run keeps
    try:
        if argv and argv[0] in SUBCOMMANDS:
            command = importlib.import_module(SUBCOMMANDS[argv[0]][0])
            return command.main([a for a in argv[1:] if a != "--debug"])
        from llama_chat.cli import chat

        return chat.main(argv)
    except RankLost as error:
        print(f"llama-chat: a rank of the tensor-parallel group stopped ({error}); the run ends", file=sys.stderr)
        return 1
    except LlamaChatError as error:
        if debug:
            raise
        print(f"llama-chat: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    except OSError as error:  # a file that cannot be read or written: say which, and why
        if debug:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"llama-chat: {where}{error.strerror or error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
