"""What each process of a tensor-parallel test runs (spawned by tests/test_tensor_parallel.py).

Rank 0 drives the group as the chat does (Peers, ParallelLoader) and saves what it saw;
the other ranks follow. Every rank also saves the shapes of its own weights.
`run_loads` does the same for several models loaded in turn, as /load does, each with
load settings of its own.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from llama_chat.chat.session import Session
from llama_chat.cli.options import configure_folders
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.environment import group_timeout
from llama_chat.errors import LlamaChatError
from llama_chat.loading import load
from llama_chat.parallel.group_runner import ParallelLoader
from llama_chat.parallel.ranks import Peers, follow, join
from llama_chat.parallel.sharding import Shard

from .loading_helpers import options_from_environment

PROMPT = [5, 17, 33, 2, 41, 8, 29, 60, 11, 3]
TURNS = ("hello there", "and then?", "one more")
FLOAT32 = {"dtype": "float32"}  # load settings: the model unpacked, in float32


def weight_shapes(model) -> dict[str, list[int]]:
    return {name: list(t.shape) for name, t in model.transformer.state_dict().items()}


def run(rank: int, world: int, port: int, model_path: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      TORCHELASTIC_USE_AGENT_STORE="True")  # every rank a client of the test's store
    configure_folders()  # as the command line starting a rank does
    torch.set_num_threads(1)
    shard = Shard(rank, world)
    store = join(shard, group_timeout())
    load_shard = partial(load, options=options_from_environment(), device="cpu", dtype="float32", shard=shard)
    if rank > 0:
        shapes_seen = {}

        def load_and_note(path):
            model = load_shard(path)
            shapes_seen.update(weight_shapes(model))
            return model

        follow(store, load_and_note)
        torch.save(shapes_seen, Path(out) / f"shapes-{rank}.pt")
        return
    peers = Peers(store)
    model = ParallelLoader(load_shard, peers)(model_path)
    results = observe(model)
    # A load that fails fails on every rank, and the model before goes on.
    try:
        ParallelLoader(load_shard, peers)(str(Path(out) / "missing.gguf"))
    except LlamaChatError as error:
        results["failed_load"] = str(error)
    results["greedy_after_failed_load"] = greedy(model)
    peers.close()
    torch.save(results, Path(out) / "rank0.pt")


def greedy(model) -> list[int]:
    return [piece.token_id for piece in model.generate(PROMPT, SamplingSettings(temperature=0, max_tokens=20),
                                                       stop_ids=())]


def observe(model) -> dict:
    """What the group must reproduce: logits, a greedy reply, a cached conversation, and the
    shapes of this process's weights."""
    session = Session(model, SamplingSettings(temperature=0, max_tokens=12))
    return {
        "shapes": weight_shapes(model), "logits": model.logits(PROMPT), "greedy": greedy(model),
        "turns": [session.send(text).run().reply for text in TURNS],
    }


def run_alone(model_path: str) -> dict:
    """The same, in one process."""
    return observe(load(model_path, device="cpu", dtype="float32"))


def refused_name(rank: int) -> str:
    """A file only `rank` fails to load (shard_loader refuses it there): a load failing on one rank."""
    return f"refused-by-rank-{rank}.gguf"


def shard_loader(shard: Shard, settings: dict[str, dict]):
    """This rank's loader: `load` with the settings `settings` gives the path (float32 where it
    gives none); a file named refused_name(this rank) fails here and loads everywhere else."""

    def load_shard(path: str):
        if Path(path).name == refused_name(shard.rank):
            raise LlamaChatError(f"{Path(path).name}: refused on this rank by the test")
        return load(path, options_from_environment(), device="cpu", shard=shard, **settings.get(str(path), FLOAT32))

    return load_shard


def run_loads(rank: int, world: int, port: int, out: str, paths: list[str], settings: dict[str, dict]) -> None:
    """Rank 0 loads each of `paths` in turn over the group and observes the model it has
    then: the new one, or where the load failed (its line saved as "error") the one before."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      TORCHELASTIC_USE_AGENT_STORE="True")  # every rank a client of the test's store
    configure_folders()  # as the command line starting a rank does
    torch.set_num_threads(1)
    shard = Shard(rank, world)
    store = join(shard, group_timeout())
    load_shard = shard_loader(shard, settings)
    if rank > 0:
        shapes_seen = {}

        def load_and_note(path):
            model = load_shard(path)
            shapes_seen[path] = weight_shapes(model)
            return model

        follow(store, load_and_note)
        torch.save(shapes_seen, Path(out) / f"shapes-{rank}.pt")
        return
    peers = Peers(store)
    model, results = None, []
    for path in paths:
        try:
            model, error = ParallelLoader(load_shard, peers)(path), None
        except LlamaChatError as failure:
            error = str(failure)
        results.append({"error": error, "quantization": model.weights.packing, **observe(model)})
    peers.close()
    torch.save(results, Path(out) / "rank0.pt")


def run_alone_with(model_path: str, settings: dict) -> dict:
    """run_alone with these load settings, and the packing the model got."""
    model = load(model_path, options_from_environment(), device="cpu", **settings)
    return {"quantization": model.weights.packing, **observe(model)}
