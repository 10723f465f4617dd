"""Running a chat from the command line: one prompt (-p, stdin) or a plain line-by-line loop."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TextIO

from .errors import SettingError, UsageError
from .generate import Generation, GenerationStats
from .loading import load
from .sampling import SamplingSettings
from .session import Session
from .weights import require_default_model

# C0 and C1 control characters other than newline and tab: a reply must never steer the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """Model output made safe to print: control characters shown as escapes, not obeyed."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def settings_from(options: argparse.Namespace) -> SamplingSettings:
    try:
        return SamplingSettings(
            temperature=options.temperature, top_k=options.top_k, top_p=options.top_p, min_p=options.min_p,
            repeat_penalty=options.repeat_penalty, max_tokens=options.max_tokens, seed=options.seed,
        )
    except SettingError as error:
        raise UsageError(str(error)) from None


def stats_line(stats: GenerationStats) -> str:
    return (
        f"{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s, "
        f"first token {stats.time_to_first_token * 1000:.0f} ms, prompt {stats.prefilled_tokens} new "
        f"+ {stats.reused_tokens} cached tokens ({stats.prefill_tokens_per_second:.0f} tok/s)"
    )


def stream_to(generation: Generation, out: TextIO) -> None:
    for piece in generation:
        out.write(visible(piece.text))
        out.flush()


def run_chat(options: argparse.Namespace) -> int:
    settings = settings_from(options)
    if options.ctx_size is not None and options.ctx_size <= 0:
        raise UsageError(f"--ctx-size must be a positive number of tokens, got {options.ctx_size}")
    prompt = options.prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if options.raw and prompt is None:
        raise UsageError("--raw needs a prompt: give -p TEXT or pipe text on stdin")
    model = load(options.model or require_default_model(), device=options.device, dtype=options.dtype,
                 chat_format="plain" if options.raw else options.chat_format)
    session = Session(model, settings, system=options.system, context_size=options.ctx_size)
    if prompt is not None:
        generation = session.send(prompt)
        stream_to(generation, sys.stdout)
        print()
        if options.stats:
            print(stats_line(generation.stats), file=sys.stderr)
        return 0
    return line_loop(session, options.stats)


def line_loop(session: Session, show_stats: bool) -> int:
    """A minimal interactive loop: each line is a message; Ctrl-C stops a reply, Ctrl-D leaves."""
    print(f"Chatting with {session.model.name} (Ctrl-C stops a reply, Ctrl-D leaves)", file=sys.stderr)
    while True:
        try:
            text = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        if not text.strip():
            continue
        generation = session.send(text)
        try:
            stream_to(generation, sys.stdout)
        except KeyboardInterrupt:
            pass
        finally:
            session.record(generation)
        print()
        if show_stats:
            print(stats_line(generation.stats), file=sys.stderr)
