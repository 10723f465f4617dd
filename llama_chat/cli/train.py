"""`llama-chat train`: train a small Llama from scratch on plain-text files."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from llama_chat.cli.arguments import finite_float
from llama_chat.directories import recover_directory
from llama_chat.engine.device import resolve_device
from llama_chat.errors import UsageError
from llama_chat.train.config import PRESETS, SETTING_FLAGS, TrainConfig
from llama_chat.train.data import read_corpus
from llama_chat.train.run import STATE_FILE, Run, train


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llama-chat train", description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", required=True, metavar="FILE", help="plain-text (UTF-8) files")
    parser.add_argument("--out", required=True, help="directory for the checkpoint (new, or a run to --resume)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--size", choices=sorted(PRESETS), help="model and schedule preset (default: tiny)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default: auto)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: PyTorch's choice)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, samples or loss curve")
    parser.add_argument("--log-plot", action="store_true", help="draw the loss curve (loss.png) on a log scale")
    defaults = PRESETS["tiny"]
    for name in SETTING_FLAGS:
        default = getattr(defaults, name)
        kind = type(default)
        extra = {"choices": ("bpe", "char")} if name == "tokenizer" else {}
        parser.add_argument("--" + name.replace("_", "-"), type=finite_float if kind is float else kind,
                            default=None, **extra,
                            help=f"(tiny preset: {default})")
    return parser.parse_args(argv)


def build_config(options: argparse.Namespace) -> TrainConfig:
    """The preset with the flags given on top; refuses combinations that contradict each other."""
    given = {name: getattr(options, name) for name in SETTING_FLAGS if getattr(options, name) is not None}
    if options.tokenizer == "char" and options.vocab_size is not None:
        raise UsageError("--vocab-size does not apply to --tokenizer char (its vocabulary is the characters seen)")
    config = replace(PRESETS[options.size or "tiny"], **given)
    if not 0 < config.validation_fraction < 1:
        raise UsageError(f"--validation-fraction must be between 0 and 1, got {config.validation_fraction}")
    for name in ("steps", "batch_size", "accumulate", "context", "warmup", "eval_every", "eval_batches",
                 "save_every", "sample_tokens", "learning_rate"):
        if getattr(config, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}")
    config.model_args(vocab_size=1)  # checks the shape flags fit together (e.g. heads divide dim)
    return config


def check_output(out: Path, resume: bool) -> None:
    """Refuse to write over anything that is not this run's own checkpoint."""
    recover_directory(out)
    holds_run = (out / STATE_FILE).is_file()
    if resume and not holds_run:
        raise UsageError(f"{out}: no training run to resume (no {STATE_FILE}); start one without --resume")
    if resume or not out.exists():
        return
    if holds_run:
        raise UsageError(f"{out} already holds a training run: add --resume to continue it, or give a new --out")
    if not out.is_dir() or any(out.iterdir()):
        raise UsageError(f"{out} already holds other files; give a new or empty --out directory")


def main(argv: list[str]) -> int:
    options = parse_options(argv)
    out = Path(options.out).expanduser()
    if options.resume:
        settings = [name for name in ("size", *SETTING_FLAGS) if getattr(options, name) is not None]
        if settings:
            flags = ", ".join("--" + name.replace("_", "-") for name in settings)
            raise UsageError(f"--resume continues with the run's saved settings; drop {flags}")
    else:
        config = build_config(options)
    if options.threads is not None and options.threads <= 0:
        raise UsageError(f"--threads must be positive, got {options.threads}")
    check_output(out, options.resume)
    if options.threads:
        torch.set_num_threads(options.threads)
    device = resolve_device(options.device)
    if options.resume:
        run = Run.resume(out, options.data, device)
    else:
        run = Run(config, read_corpus(options.data, config.validation_fraction), out, device)
    run.log_plot = options.log_plot
    finished = train(run, quiet=options.quiet)
    if finished:
        final = run.history.validation[-1][1]
        print(f"{out}: validation loss {final:.3f} nats per token after {run.step} steps")
    return 0 if finished else 130
