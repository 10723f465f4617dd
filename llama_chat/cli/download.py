"""`llama-chat download [NAME]`: fetch a model llama-chat knows by name (the default model
unless named); print where it is."""

from __future__ import annotations

import argparse

from llama_chat.default_model import DEFAULT_MODEL, KNOWN_MODELS, download_model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat download", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(KNOWN_MODELS),
                        help=f"the model to fetch (default: {DEFAULT_MODEL}, the default model)")
    print(download_model(parser.parse_args(argv).name))
    return 0
