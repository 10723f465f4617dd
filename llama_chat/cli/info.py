"""`llama-chat info [MODEL]`: what a model file holds (the default model without one), read
from its metadata without loading its weights."""

from __future__ import annotations

import argparse

from llama_chat.chat.display import visible
from llama_chat.default_model import require_default_model
from llama_chat.model_info import model_info


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat info", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a .gguf file, or a Hugging Face or Meta checkpoint directory")
    options = parser.parse_args(argv)
    for label, value in model_info(options.model or require_default_model()):
        print(f"{label + ':':15}{visible(value)}")  # the file's words, never its escape sequences
    return 0
