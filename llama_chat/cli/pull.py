"""`llama-chat pull NAME`: fetch a model by name without chatting (a Hugging Face Hub id
into the shared Hugging Face cache; a name llama-chat knows into its weights folder);
print where it lies."""

from __future__ import annotations

import argparse

from llama_chat.models.resolve import resolve


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat pull", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="OWNER/REPO[:QUANT|/FILE][@REVISION], or a name `llama-chat models` lists")
    print(resolve(parser.parse_args(argv).name).path)
    return 0
