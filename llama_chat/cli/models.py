"""`llama-chat models`: every model on this machine llama-chat can run (the Hugging Face
cache, ollama's store, LM Studio's folders, llama-chat's weights folder), with the name
that loads it; `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import sys

from llama_chat.chat.display import literal
from llama_chat.models.catalog import catalog
from llama_chat.repl.model_commands import table_lines

def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat models", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object a model, in a list")
    found = catalog()
    if parser.parse_args(argv).json:
        print(json.dumps([row.as_dict() for row in found.rows], indent=1, ensure_ascii=False))
    else:
        print("\n".join(table_lines(found)))
    for problem in found.left_out:
        print(f"llama-chat: left out {literal(problem)}", file=sys.stderr)
    return 0
