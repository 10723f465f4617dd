"""`llama-chat download`: fetch the default model; print where it is."""

from __future__ import annotations

import argparse

from llama_chat.default_model import download_default_model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat download", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print(download_default_model())
    return 0
