"""The time from sending a message to the first token of its reply, late in a long chat.

Builds a conversation of 40 exchanges (about 4,000 tokens; fixed replies) on the default
model, has the model read it once (a turn of one token), then times the 41st turn from
Session.send to its first token, several times (the turn undone between runs, so that the
cache holds the same 40 exchanges each time), and prints the median. What it measures is
what a turn costs before the model runs (rendering and encoding the conversation) plus
the prefill of the new message alone.

    .venv/bin/python benchmarks/turn_latency.py [--turns 40] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import llama_chat
from llama_chat.chat.exchange import Exchange
from llama_chat.chat.session import Session
from llama_chat.cli.options import configure_folders
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.device import cpu_model_name
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.environment import kernel_options
from llama_chat.options import LoadOptions

QUESTION = "Question {}: how do the tides behave near an estuary, and why does the shape of the coast matter?"
REPLY = ("Answer {}: the moon and the sun pull the sea, and a narrowing estuary funnels the tide, so its range "
         "grows upstream until friction and the river's flow take over; the details vary with depth and season. "
         "Gauges along the banks record the difference, and charts give the times for each port.")


def long_session(model: llama_chat.Llama, turns: int) -> Session:
    """A session of `turns - 1` fixed exchanges, and one more the model has read (its cache
    then holds the whole conversation)."""
    settings = SamplingSettings(temperature=0, max_tokens=1)
    session = Session(model, settings, system="You are a careful assistant.", context_size=8192)
    for number in range(1, turns):
        session.conversation.exchanges.append(Exchange(QUESTION.format(number), REPLY.format(number)))
    session.send(QUESTION.format(turns)).run()
    return session


def first_token_seconds(session: Session, text: str) -> float:
    started = time.perf_counter()
    turn = session.send(text)
    next(iter(turn.generation))
    seconds = time.perf_counter() - started
    turn.run()
    session.undo()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    configure_folders()
    model = llama_chat.load(download_model(DEFAULT_MODEL), LoadOptions(kernels=kernel_options()))
    print(f"{cpu_model_name()} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; "
          f"{model.name}: {model.describe_weights()}")
    session = long_session(model, options.turns)
    text = QUESTION.format(options.turns + 1)
    times = [first_token_seconds(session, text) for _ in range(options.repeats)]
    ids, exchanges = session.transcript.ids, session.conversation.exchanges
    print(f"{len(ids)} tokens in {len(exchanges)} exchanges; turn {options.turns + 1}: "
          f"send to first token, median of {options.repeats}: {statistics.median(times) * 1000:.1f} ms "
          f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})")


if __name__ == "__main__":
    main()
