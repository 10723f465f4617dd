"""The threads a model's calls run with, chosen by measuring: fewer when another process
takes a core, all of them again once it is gone, one left to a child at work; prompts in
the same chunks, the same logits."""

import torch

from llama_chat.engine.runners import PREFILL_CHUNK, Runner
from llama_chat.engine.threads import STALE_SECONDS, ThreadGovernor
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.repl.model_commands import threads_note

from .test_session import chat_model


class Machine:
    """A clock, and a model on the cpu whose calls' time depends on their threads and on
    whether another process takes a core (times as measured on a 2-core machine: a starved
    thread costs far more than its share)."""

    rope_cos = torch.zeros(1)  # where the runner looks for the model's device

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = False
        self.calls: list[tuple[int, int]] = []  # (threads, tokens)

    def clock(self) -> float:
        return self.now

    def __call__(self, tokens, cache=None, **options):
        threads, count = torch.get_num_threads(), tokens.shape[1]
        self.calls.append((threads, count))
        per_token = {(2, False): 1.0, (1, False): 1.8, (2, True): 8.0, (1, True): 1.6}[threads, self.busy]
        self.now += per_token * (1 if count == 1 else count * 0.05) / 1000
        return torch.zeros(1, 1, 4)


class Unwritten:
    """A cache the machine never writes: room for any call."""

    def check_fits(self, count: int) -> None:
        pass

    def __len__(self) -> int:
        return 0


def governed(machine, background=lambda: 0):
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    governor = ThreadGovernor(most=2, background=background, clock=machine.clock)
    return Runner(machine, torch.float32, governor), saved


def steps(runner, machine, count):
    start = len(machine.calls)
    for _ in range(count):
        runner(Unwritten(), [1])
    return [threads for threads, _ in machine.calls[start:]]


def test_a_busy_machine_gets_one_thread_and_an_idle_one_both_again():
    machine = Machine()
    governor, saved = governed(machine)
    try:
        idle = steps(governor, machine, 100)
        assert idle.count(2) >= 85  # all the threads, trying one now and then
        machine.busy = True
        busy = steps(governor, machine, 200)
        assert busy[-100:].count(1) >= 85  # found out within the first steps and kept to
        machine.busy = False
        machine.now += STALE_SECONDS  # the user reads, then sends the next message
        again = steps(governor, machine, 100)
        assert again[-50:].count(2) >= 40
    finally:
        torch.set_num_threads(saved)


def test_a_child_at_work_gets_a_core():
    machine = Machine()
    working = [1]
    governor, saved = governed(machine, background=lambda: working[0])
    try:
        assert set(steps(governor, machine, 30)) == {1}
        working[0] = 0
        assert steps(governor, machine, 30).count(2) >= 20
    finally:
        torch.set_num_threads(saved)


def test_a_prompt_chunk_that_starved_sends_the_next_to_fewer_threads():
    machine = Machine()
    governor, saved = governed(machine)
    try:
        governor(Unwritten(), list(range(PREFILL_CHUNK * 2)))  # idle: each count's best chunk time learnt
        machine.calls.clear()
        machine.busy = True
        governor(Unwritten(), list(range(PREFILL_CHUNK * 4)))
        assert [threads for threads, _ in machine.calls] == [2, 1, 1, 1]
        assert {tokens for _, tokens in machine.calls} == {PREFILL_CHUNK}
    finally:
        torch.set_num_threads(saved)


def test_the_governor_gives_the_eager_calls_logits():
    model = chat_model(max_seq_len=1024)
    governor = Runner(model.transformer, model.cache_dtype, ThreadGovernor(most=torch.get_num_threads()))
    ids = list(range(1, 200)) * 3
    plain_cache, governed_cache = model.new_cache(), model.new_cache()
    assert torch.equal(governor(governed_cache, ids), Runner(model.transformer, model.cache_dtype)(plain_cache, ids))
    assert governed_cache.tokens == plain_cache.tokens
    reply = model.generate([1, 2, 3], SamplingSettings(temperature=0, max_tokens=8))  # through the model's runner
    list(reply)
    assert isinstance(model.runner.governor, ThreadGovernor) and reply.stats.generated_tokens == 8
    most = model.runner.governor.most
    assert threads_note(model) == f"; {model.runner.governor.threads} of {most} threads, as measured fastest of late"


def test_a_compiled_step_is_the_same_whatever_threads_the_chat_runs_with():
    """Its generated code runs on one thread, its operators on the chat's: a chat that runs
    on fewer threads for a while finds the package it built, and the next start does too."""
    from llama_chat.engine import compiled

    model = chat_model()
    saved = torch.get_num_threads()
    try:
        keys = set()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            keys.add(compiled.package_key(model.transformer, model.cache_dtype))
    finally:
        torch.set_num_threads(saved)
    assert len(keys) == 1


def test_a_model_loaded_while_a_governor_runs_on_fewer_threads_gets_the_process_threads():
    """A governor leaves PyTorch's count lowered between calls (a core lent to a build); the
    model the chat moves onto next (or /load) is governed over all the process's threads."""
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lending = Runner(Machine(), torch.float32, ThreadGovernor(background=lambda: 1))
        lending(Unwritten(), [1])
        assert torch.get_num_threads() == 1
        assert ThreadGovernor().most == 2
        assert chat_model().runner.governor.most == 2
    finally:
        torch.set_num_threads(saved)
