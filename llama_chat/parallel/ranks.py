"""One chat over several processes: starting the ranks, and rank 0 telling the others what
to compute.

Rank 0 owns the terminal, the tokenizer, the session and sampling. Whenever it runs the
model (its runner's `GroupHook`) it first posts the same call to the other ranks
through the process group's key-value store: which cache (by a number), where it starts,
which token ids. Every rank then runs the same blocks on its own shard, and the blocks'
all-reduces keep them in step. Caches are mirrored by position: a command says where the
ids go, so rank 0 may truncate its cache (a retry, a trimmed conversation) without telling
anyone.

Waiting for a command uses the store (a person may take an hour to type); the
collectives inside a step use the group's timeout (the command line's LLAMA_CHAT_TP_TIMEOUT
seconds, 60 by default), so a rank that died or hangs ends the run with one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from llama_chat import environment
from llama_chat.errors import LlamaChatError, first_line
from llama_chat.parallel.sharding import Shard, summed
from llama_chat.process_memory import memory_report

IDLE_WAIT = timedelta(days=30)  # how long the other ranks wait for rank 0's next command


def shard_from_environment() -> Shard | None:
    """This process's place in a group started by --tp or torchrun (None: on its own)."""
    rank, world = environment.launched_place()
    return Shard(rank, world) if world > 1 else None


def start_ranks(
    world: int, argv: Sequence[str], timeout: timedelta
) -> tuple[dist.TCPStore, list[subprocess.Popen]]:
    """Ranks 1..world-1 of a group on this host, each `python -m llama_chat argv`; this
    process becomes rank 0. They run detached from the terminal (setsid), so that Ctrl-C
    reaches rank 0 alone (which stops a reply between steps), and end when this process
    ends, however it ends (see parent_watch); the CPU's threads are shared out. Also
    returned: the group's rendezvous store, already listening on the port the ranks are
    given (a port found free and let go could be taken before the group bound
    it); keep it until `join`, whose rendezvous in this process shares it (multi_tenant)."""
    rendezvous = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout,
                               wait_for_workers=False, multi_tenant=True)
    threads = max(1, torch.get_num_threads() // world)
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rendezvous.port), "WORLD_SIZE": str(world),
              "OMP_NUM_THREADS": str(threads)}
    os.environ.update(common, RANK="0", LOCAL_RANK="0")  # where this process's init_process_group looks
    torch.set_num_threads(threads)
    return rendezvous, [
        subprocess.Popen(
            [sys.executable, "-m", "llama_chat", *argv],
            env=environment.child_environment(**common, RANK=str(rank), LOCAL_RANK=str(rank),
                                              **{environment.LEADER: str(os.getpid())}),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for rank in range(1, world)
    ]


def join(shard: Shard, timeout: timedelta) -> dist.Store:
    """Join the group (gloo) and return the store that commands travel through."""
    try:
        dist.init_process_group("gloo", rank=shard.rank, world_size=shard.world, timeout=timeout)
    except (RuntimeError, ValueError) as error:
        raise LlamaChatError(f"could not form the group of {shard.world} ranks: {first_line(error)}") from None
    store = dist.PrefixStore("llama-chat", dist.distributed_c10d._get_default_store())
    store.set_timeout(IDLE_WAIT)
    return store


def lead(
    shard: Shard | None, tp: int, argv: Sequence[str], timeout: timedelta
) -> tuple[Shard | None, Peers | None]:
    """Rank 0's side of a group: the one a launcher formed (`shard`), or one of `tp` ranks
    started here running `argv`; (None, None) for a process on its own. If joining fails,
    the ranks started here are stopped."""
    processes = []
    if shard is None:
        if tp <= 1:
            return None, None
        shard = Shard(0, tp)
        rendezvous, processes = start_ranks(tp, argv, timeout)  # noqa: F841  (held open until joined)
    try:
        return shard, Peers(join(shard, timeout), processes)
    except BaseException:
        Peers(None, processes).close()
        raise


def agree(succeeded: bool, message: str, store: dist.Store, attempt: int) -> str:
    """Whether every rank succeeded at something; "" if so, else the first failure's line."""
    if not succeeded:
        store.set(f"failure/{attempt}/{dist.get_rank()}", message)
    if not summed(torch.tensor([0.0 if succeeded else 1.0])).item():
        return ""
    for rank in range(dist.get_world_size()):
        key = f"failure/{attempt}/{rank}"
        if store.check([key]):
            return f"rank {rank}: {store.get(key).decode()}"
    return "a rank failed"


class Peers:
    """Rank 0's handle on the other ranks: posts each call of the model to them."""

    def __init__(self, store: dist.Store | None, processes: Sequence[subprocess.Popen] = ()) -> None:
        self.store = store
        self.processes = list(processes)
        self.sent = 0
        self._next_cache = 0
        self._cache_numbers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._forgotten: list[int] = []

    def _post(self, operation: str, **fields) -> None:
        fields["forget"], self._forgotten = self._forgotten, []
        self.store.set(f"command/{self.sent}", json.dumps({"operation": operation, **fields}))
        self.sent += 1

    def _number(self, cache) -> int:
        """The number the other ranks know a cache by; a cache rank 0 drops, they drop too."""
        if cache not in self._cache_numbers:
            self._cache_numbers[cache] = self._next_cache
            weakref.finalize(cache, self._forgotten.append, self._next_cache)
            self._next_cache += 1
        return self._cache_numbers[cache]

    def feed(self, cache, ids: Sequence[int], chunk_size: int) -> None:
        self._post("feed", cache=self._number(cache), capacity=cache.capacity, start=len(cache), ids=list(ids),
                   chunk=chunk_size)

    def logits(self, ids: Sequence[int]) -> None:
        self._post("logits", ids=list(ids))

    def memory_mb(self) -> list[list[float]]:
        """The other ranks' peak resident memory and own memory now (0 where unknown), rank
        1 first."""
        asked = self.sent
        self._post("report")
        return [json.loads(self.store.get(f"report/{asked}/{rank}")) for rank in range(1, dist.get_world_size())]

    def load(self, load_model: Callable[[str], object], path: str):
        """Load `path` on every rank, or on none: any rank's failure is one line for all."""
        command = self.sent  # its number names the attempt's failure lines
        self._post("load", path=str(path))
        return load_everywhere(load_model, path, self.store, command)

    def close(self) -> None:
        """Tell the other ranks to stop, and wait for those this process started (a rank
        that does not stop within 10 s, or never joined, is killed)."""
        told = False
        if self.store is not None:
            try:
                self._post("quit")
                told = True
            except (RuntimeError, ValueError):
                pass  # the store went away with a rank: nothing is waiting
        if dist.is_initialized():
            dist.destroy_process_group()
        for process in self.processes:
            try:
                process.wait(timeout=10 if told else 0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def load_everywhere(load_model: Callable[[str], object], path: str, store: dist.Store, attempt: int):
    try:
        model, message = load_model(path), ""
    except Exception as error:  # noqa: BLE001 (reported by rank 0, for every rank)
        model, message = None, first_line(error)
    failure = agree(model is not None, message, store, attempt)
    if failure:
        raise LlamaChatError(failure)
    return model


def follow(store: dist.Store, load_model: Callable[[str], object]) -> int:
    """A rank other than 0: do what rank 0 posts, until it says quit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides what Ctrl-C does
    model, caches, received = None, {}, 0
    while True:
        command = json.loads(store.get(f"command/{received}"))
        received += 1
        for number in command["forget"]:
            caches.pop(number, None)
        operation = command["operation"]
        if operation == "quit":
            return 0
        if operation == "load":
            try:
                model = load_everywhere(load_model, command["path"], store, received - 1)
                caches.clear()
            except LlamaChatError:
                pass  # rank 0 says why; the model before stays
        elif operation == "feed":
            cache = caches.get(command["cache"])
            if cache is None:
                cache = caches[command["cache"]] = model.new_cache(command["capacity"])
            held = cache.tokens
            kept = cache.trim(command["start"])
            if kept < command["start"]:  # a windowed cache without rank 0's checkpoint: fed again here
                model.runner(cache, held[kept : command["start"]], chunk_size=command["chunk"])
            model.runner(cache, command["ids"], chunk_size=command["chunk"])
        elif operation == "logits":
            model.logits(command["ids"])
        elif operation == "report":
            store.set(f"report/{received - 1}/{dist.get_rank()}", json.dumps(memory_report()))
