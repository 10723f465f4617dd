"""Running a chat from the command line: one reply (-p, piped stdin, --raw) or the REPL."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial

from llama_chat.chat.session import Session
from llama_chat.default_model import require_default_model
from llama_chat.engine.sampling import SETTING_HELP, SamplingSettings
from llama_chat.errors import SettingError, UsageError
from llama_chat.llama import Llama
from llama_chat.loading import load
from llama_chat.parallel.ranks import Peers, follow, join, lead, shard_from_environment
from llama_chat.parallel.sharding import Shard
from llama_chat.repl.render import stats_line, visible
from llama_chat.text.undecodable import replace_undecodable, undecodable_note


def settings_from(options: argparse.Namespace) -> SamplingSettings:
    try:
        # The flags are named after the settings (see cli.chat_parser).
        return SamplingSettings(seed=options.seed, **{name: getattr(options, name) for name in SETTING_HELP})
    except SettingError as error:
        raise UsageError(str(error)) from None


def read_prompt(options: argparse.Namespace) -> str | None:
    """The one message to answer: -p, else stdin when it is not a terminal; None for a chat."""
    if options.prompt is not None:
        if not options.prompt.strip():
            raise UsageError("-p is empty: there is nothing to answer; give -p TEXT")
        return checked_text(options.prompt, "-p")
    if sys.stdin is not None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise UsageError("stdin is empty: pipe in a prompt, or give -p TEXT")
        return checked_text(prompt, "stdin")
    if options.raw:
        raise UsageError("--raw needs a prompt: give -p TEXT or pipe text on stdin")
    return None


def checked_text(text: str, where: str) -> str:
    """Text from the command line or stdin, undecodable bytes replaced, with a warning."""
    cleaned, count = replace_undecodable(text)
    if count:
        print(f"llama-chat: {undecodable_note(where, count)}", file=sys.stderr)
    return cleaned


def model_loader(options: argparse.Namespace, shard: Shard | None = None) -> Callable[[str], Llama]:
    """Loads weights from a path with the command line's device, dtype and chat format
    (with a shard: that rank's share of them)."""
    chat_format = "plain" if options.raw else options.chat_format
    return partial(load, device=options.device, dtype=options.dtype, chat_format=chat_format,
                   quantize=options.quantize, kernel_dtype=options.kernel_dtype, shard=shard)


class ParallelLoader:
    """Rank 0's loader in a tensor-parallel group: every rank loads its shard, or none does."""

    def __init__(self, load_shard: Callable[[str], Llama], peers: Peers) -> None:
        self.load_shard = load_shard
        self.peers = peers

    def __call__(self, path: str) -> Llama:
        model = self.peers.load(self.load_shard, path)
        model.peers = self.peers
        return model


class CompilingLoader:
    """Loads models and sets each one's decode step compiling as --compile says; `stop()`
    ends compiles still running (at exit: the next run starts them again)."""

    def __init__(self, load_model: Callable[[str], Llama], mode: str, background: bool) -> None:
        self.load_model = load_model
        self.mode = mode
        self.background = background
        self.loaded: list[Llama] = []

    def __call__(self, path: str) -> Llama:
        model = self.load_model(path)
        if self.mode != "off":
            for earlier in self.loaded:
                earlier.decode_step.cancel()
            self.loaded.append(model)
            model.decode_step.compile(wait=self.mode == "wait", background=self.background or self.mode == "wait")
        return model

    def stop(self) -> None:
        for model in self.loaded:
            model.decode_step.cancel()


def run_chat(options: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    settings = settings_from(options)
    if options.ctx_size is not None and options.ctx_size <= 0:
        raise UsageError(f"--ctx-size must be a positive number of tokens, got {options.ctx_size}")
    shard = shard_from_environment()
    if shard is not None and shard.rank > 0:  # another rank of a group: rank 0 drives it
        return follow(join(shard), model_loader(options, shard))
    prompt = read_prompt(options)
    model_path = options.model or require_default_model()
    if shard is not None or options.tp > 1:
        if options.device not in ("auto", "cpu"):
            raise UsageError(f"--tp runs on the cpu (gloo), not on {options.device}")
        options.device, options.compile = "cpu", "off"  # the compiled step has no all-reduce
    shard, peers = lead(shard, options.tp, argv)
    try:
        base_loader = model_loader(options, shard)
        if peers is not None:
            base_loader = ParallelLoader(base_loader, peers)
        # A one-shot reply ends long before a first compile would: it uses a compiled step
        # only if one is on disk already (or --compile wait).
        load_model = CompilingLoader(base_loader, options.compile, background=prompt is None)
        try:
            system = None if options.system is None else checked_text(options.system, "--system")
            session = Session(load_model(model_path), settings, system=system,
                              context_size=options.ctx_size, model_path=model_path)
            if prompt is not None:
                return answer_once(session, prompt, options.stats)
            from llama_chat.repl.app import run_repl

            return run_repl(session, load_model)
        finally:
            load_model.stop()
    finally:
        if peers is not None:
            peers.close()


def answer_once(session: Session, prompt: str, show_stats: bool) -> int:
    """Stream the reply to stdout (nothing else goes there); the stats line to stderr."""
    turn = session.send(prompt)

    def write(piece) -> None:
        sys.stdout.write(visible(piece.text))
        sys.stdout.flush()

    turn.run(write)
    sys.stdout.write("\n")
    if show_stats:
        print(stats_line(turn.stats), file=sys.stderr)
    return 0
