"""The `llama-chat` command: options, sub-commands, and the one place user errors are printed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llama_chat.cli.arguments import QUANTIZE_MODES, finite_float, positive_int
from llama_chat.engine.sampling import SETTING_HELP, SamplingSettings
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.parallel.sharding import RankLost

SUBCOMMANDS = {
    "bench": "measure prefill and decode speed",
    "download": "fetch the default model into the weights folder",
    "convert": "write a Hugging Face-style directory from a GGUF file or a Meta checkpoint",
    "train": "train a small Llama from scratch on text files",
}


COMPILE_CHOICES = ("auto", "wait", "off")


def chat_parser() -> argparse.ArgumentParser:
    defaults = SamplingSettings()
    parser = argparse.ArgumentParser(
        prog="llama-chat",
        description="Chat with a local Llama-family model in the terminal.",
        epilog="sub-commands: " + "; ".join(f"{name}: {about}" for name, about in SUBCOMMANDS.items()),
    )
    parser.add_argument("--model", "-m", help="a .gguf file, or a Hugging Face or Meta checkpoint directory "
                        "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--prompt", "-p", help="answer this one message, print the reply and exit")
    parser.add_argument("--raw", action="store_true", help="plain completion of the prompt, no chat template")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--chat-format", help="llama3, llama2, chatml, plain, or template (the model's own)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16: the model's dtype; "
                        "with packed cpu weights, what prompt steps multiply in, auto measured (default: auto)")
    parser.add_argument("--quantize", default="auto", choices=QUANTIZE_MODES,
                        help="pack weights for the cpu; auto: int4 where the file stores 4-bit groups, int8 "
                        "otherwise, none with --dtype float32 or off the cpu (default: auto)")
    parser.add_argument("--kernel-dtype", default="auto",
                        help="bfloat16 or float32 for the packed single-token kernels (default: auto, "
                        "measured on this CPU)")
    parser.add_argument("--ctx-size", type=int, help="context length in tokens (default: the model's, at most 4096)")
    parser.add_argument("--compile", default="auto", choices=COMPILE_CHOICES,
                        help="the compiled decode step on the cpu: auto (built in the background the first time, "
                        "eager meanwhile; a one-shot reply only uses one already built), wait (build it first), "
                        "off (eager)")
    parser.add_argument("--tp", type=positive_int, default=1,
                        help="split the model over N processes on this host (tensor parallel, on the cpu); "
                        "under torchrun the group comes from the launcher (default: 1)")
    sampling = parser.add_argument_group("sampling (each also a slash command in the chat)")
    for name, (argument, about) in SETTING_HELP.items():
        default = getattr(defaults, name)
        sampling.add_argument("--" + name.replace("_", "-"), metavar=argument, default=default,
                              type=finite_float if isinstance(default, float) else int,
                              help=f"{about} (default: {default})")
    sampling.add_argument("--seed", type=int, help="seed for reproducible sampling (default: random)")
    parser.add_argument("--stats", action="store_true", help="with -p or piped input: the statistics line on stderr")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return run_subcommand(argv[0], [a for a in argv[1:] if a != "--debug"])
        from llama_chat.cli.chat import run_chat

        options = chat_parser().parse_args(argv)
        return run_chat(options, argv)
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


def run_subcommand(name: str, argv: list[str]) -> int:
    if name == "bench":
        from llama_chat.cli.bench import main as bench_main

        return bench_main(argv)
    if name == "convert":
        from llama_chat.checkpoints.convert import main as convert_main

        return convert_main(argv)
    if name == "train":
        from llama_chat.train.run import main as train_main

        return train_main(argv)
    from llama_chat.default_model import download_default_model

    print(download_default_model())
    return 0
