import inspect
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat import Llama
from llama_chat.engine import compiled
from llama_chat.engine.runners import Runner
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.parallel.group_runner import GroupHook

from .conftest import tiny_args
from .test_gguf import IDS, tiny_hf_model, write_gguf


def greedy(model: Llama, prompt: list[int], tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy ids and the logits they were chosen from, through the model's runner."""
    cache = model.new_cache(64)
    logits = model.runner(cache, prompt)
    ids, steps = [], []
    for _ in range(tokens):
        ids.append(int(logits.argmax()))
        logits = model.runner(cache, [ids[-1]])
        steps.append(logits)
    return ids, steps


def compiled_runner(model: Llama) -> Runner:
    """The model's runner, whose compiled packages a test sets."""
    return model.runner


def new_compiled_runner(model: Llama) -> Runner:
    return Runner(model.transformer, model.cache_dtype)


def test_a_runner_alone_and_in_a_group_is_called_alike():
    """The runner, on its own and with a tensor-parallel group's hook, is called as
    `runner(cache, ids, every_logits=...)` and says what runs."""
    model = Llama.random(tiny_args(), seed=1)
    grouped = Runner(model.transformer, torch.float32)
    grouped.group = GroupHook(peers=None)
    runners = [model.runner, Runner(model.transformer, torch.float32), grouped]
    for runner in runners:
        assert isinstance(runner, Runner), type(runner)
        call = inspect.signature(type(runner).__call__).parameters
        assert list(call)[:3] == ["self", "cache", "ids"], type(runner)
        assert "every_logits" in call or any(p.kind is p.VAR_KEYWORD for p in call.values()), type(runner)
        assert isinstance(runner.status.describe(), str)
    assert not isinstance(object(), Runner)
    assert grouped.compile().describe() == "eager (a compiled step cannot all-reduce between ranks)"


class Peers:
    """The other ranks of a group, as rank 0's runner posts to them."""

    def __init__(self) -> None:
        self.posted = []

    def feed(self, cache, ids, chunk_size):
        self.posted.append(("feed", len(cache), list(ids), chunk_size))

    def logits(self, ids):
        self.posted.append(("logits", list(ids)))


def test_a_runner_in_a_group_posts_each_call_before_making_it():
    model = Llama.random(tiny_args(), seed=1)
    peers = Peers()
    grouped = Runner(model.transformer, torch.float32)
    grouped.group = GroupHook(peers)
    ids = [(37 * i) % 250 + 3 for i in range(12)]
    alone, together = model.new_cache(16), model.new_cache(16)
    assert torch.equal(grouped(together, ids[:10], chunk_size=4), model.runner(alone, ids[:10], chunk_size=4))
    assert torch.equal(grouped(together, ids[10:], every_logits=True), model.runner(alone, ids[10:], every_logits=True))
    assert torch.equal(grouped.logits(ids), model.logits(ids))
    assert peers.posted == [("feed", 0, ids[:10], 4), ("feed", 10, ids[10:], 256), ("logits", ids)]
    with pytest.raises(llama_chat.errors.ContextOverflowError):  # refused before anything is posted
        grouped(together, ids)
    assert len(peers.posted) == 3


@pytest.mark.parametrize("n_kv_heads", [6, 2, 1])
def test_a_decode_step_matches_the_forward_pass_and_writes_the_same_keys_and_values(n_kv_heads):
    model = Llama.random(tiny_args(n_kv_heads=n_kv_heads), seed=1)
    ids = [(37 * i) % 250 + 3 for i in range(20)]
    reference = model.logits(ids)
    cache = model.new_cache(32)
    model.runner(cache, ids[:5])
    steps = [model.runner(cache, [token]) for token in ids[5:]]
    assert compiled_runner(model).packages is None
    assert cache.tokens == ids
    assert torch.allclose(torch.stack(steps), reference[5:], atol=1e-5, rtol=1e-5)
    # The keys and values the step wrote are those a prompt pass writes.
    other = model.new_cache(32)
    model.runner(other, ids)
    stepped, whole = cache.state(20), other.state(20)
    assert torch.allclose(stepped["keys"], whole["keys"], atol=1e-5)
    assert torch.allclose(stepped["values"], whole["values"], atol=1e-5)


def test_a_full_cache_refuses_another_token():
    model = Llama.random(tiny_args(), seed=1)
    cache = model.new_cache(4)
    model.runner(cache, [5, 6, 7, 8])
    with pytest.raises(llama_chat.errors.ContextOverflowError):
        model.runner(cache, [5])
    assert len(cache) == 4


@pytest.fixture(scope="module")
def packed_model(tmp_path_factory):
    path = write_gguf(tmp_path_factory.mktemp("q4") / "q4.gguf", tiny_hf_model(seed=3), qtype=QType.Q4_1)
    return llama_chat.load(path, device="cpu")


@pytest.fixture(scope="module")
def compiled_package(packed_model, tmp_path_factory):
    """The packed tiny model's decode step, compiled in a child process as the chat does it."""
    destination = tmp_path_factory.mktemp("compiled") / "decode.pt2"
    background = compiled.BackgroundBuild(packed_model.transformer, packed_model.cache_dtype, destination)
    background.wait()
    assert background.error == ""
    return destination, background


@pytest.mark.needs_compiler
def test_the_compiled_step_is_built_in_the_background_and_picked_up(packed_model, compiled_package):
    destination, background = compiled_package
    assert compiled.is_built(destination) and background.packages is not None
    # The package holds code, not the weights: those stay the model's own.
    weights = compiled.traced_weights(packed_model.transformer).values()
    weight_bytes = sum(t.numel() * t.element_size() for t in weights)
    assert destination.stat().st_size < 50 * 2**20 and background.packages.weights[0] is next(
        iter(compiled.traced_weights(packed_model.transformer).values())
    )
    assert weight_bytes > 0


@pytest.mark.needs_compiler
def test_compiled_and_eager_steps_give_the_same_greedy_reply(packed_model, compiled_package):
    destination, _ = compiled_package
    eager_ids, eager_logits = greedy(packed_model, IDS[:10], 30)
    compiled_runner(packed_model).packages = compiled.CompiledPackages(destination, packed_model.transformer)
    try:
        compiled_ids, compiled_logits = greedy(packed_model, IDS[:10], 30)
    finally:
        compiled_runner(packed_model).packages = None
    assert compiled_ids == eager_ids
    difference = (torch.stack(compiled_logits) - torch.stack(eager_logits)).abs().max()
    assert difference <= 5e-3 * torch.stack(eager_logits).abs().max()
    # Different cache sizes and positions run through the same package.
    cache = packed_model.new_cache(50)
    packed_model.runner(cache, (IDS * 4)[:40])
    packages = compiled.CompiledPackages(destination, packed_model.transformer)
    with torch.inference_mode():
        eager = packed_model.transformer(torch.tensor([[IDS[0]]]), cache)[0, 0]
        cache.trim(40)
        from_package = packages(cache, [IDS[0]])[0]
    assert torch.allclose(from_package, eager, atol=5e-3 * eager.abs().max().item())


@pytest.mark.needs_compiler
@pytest.mark.parametrize("count", [2, 5, compiled.VERIFY_TOKENS])
def test_the_compiled_verify_step_agrees_with_the_eager_one(packed_model, compiled_package, count):
    """Verify steps of any size up to VERIFY_TOKENS run through the second package: logits for
    each token and the keys and values written as the eager step writes them."""
    destination, _ = compiled_package
    drafts = (IDS * 4)[40 : 40 + count]
    eager_cache, compiled_cache = packed_model.new_cache(80), packed_model.new_cache(80)
    for cache in (eager_cache, compiled_cache):
        packed_model.runner(cache, (IDS * 4)[:40])
    eager = packed_model.runner(eager_cache, drafts, every_logits=True)
    compiled_runner(packed_model).packages = compiled.CompiledPackages(destination, packed_model.transformer)
    try:
        from_package = packed_model.runner(compiled_cache, drafts, every_logits=True)
    finally:
        compiled_runner(packed_model).packages = None
    assert from_package.shape == eager.shape == (count, packed_model.args.vocab_size)
    assert torch.allclose(from_package, eager, atol=5e-3 * eager.abs().max().item())
    assert compiled_cache.tokens == eager_cache.tokens
    written = slice(40, 40 + count)
    for name in ("keys", "values"):
        assert torch.allclose(compiled_cache.state()[name][:, :, written], eager_cache.state()[name][:, :, written],
                              atol=1e-3), name


@pytest.mark.needs_compiler
def test_the_compiled_step_reads_rotary_tables_grown_after_it_was_built(packed_model, compiled_package):
    """The package takes the tables as long as they come: a cache longer than any made before
    grows them in place, and a step past their old length turns as the eager one does."""
    destination, _ = compiled_package
    packages = compiled.CompiledPackages(destination, packed_model.transformer)
    old_length = packed_model.transformer.rope_cos.shape[0]
    capacity = packed_model.args.max_seq_len
    assert old_length < capacity - 4
    ids = (IDS * 8)[: capacity - 2]
    eager_cache, compiled_cache = packed_model.new_cache(capacity), packed_model.new_cache(capacity)
    assert packed_model.transformer.rope_cos.shape[0] == capacity
    with torch.inference_mode():
        for cache in (eager_cache, compiled_cache):
            packed_model.transformer(torch.tensor([ids[:-1]]), cache)
        eager = packed_model.transformer(torch.tensor([ids[-1:]]), eager_cache)[0, 0]
        from_package = packages(compiled_cache, ids[-1:])[0]
    assert len(compiled_cache) == capacity - 2 > old_length
    assert torch.allclose(from_package, eager, atol=5e-3 * eager.abs().max().item())


def test_a_package_is_keyed_by_the_rotary_tables_width_not_their_length():
    """The tables grow with the caches made: one package serves every context."""
    model = Llama.random(tiny_args(), seed=1)
    model.new_cache(8)
    before = compiled.package_key(model.transformer, torch.float32)
    model.new_cache(model.args.max_seq_len)
    assert compiled.package_key(model.transformer, torch.float32) == before


@pytest.mark.needs_compiler
def test_a_dense_model_with_a_tied_head_compiles_too(tmp_path):
    """Float32 weights as parameters, the output head the embedding's own (named once)."""
    model = Llama.random(tiny_args(tie_embeddings=True), seed=4)
    assert model.transformer.output.weight is model.transformer.tok_embeddings.weight
    destination = tmp_path / "dense.pt2"
    background = compiled.BackgroundBuild(model.transformer, torch.float32, destination)
    background.wait()
    assert background.error == "" and background.packages is not None
    prompt = [(37 * i) % 250 + 3 for i in range(10)]
    eager_ids, eager_logits = greedy(model, prompt, 12)
    compiled_runner(model).packages = background.packages
    compiled_ids, compiled_logits = greedy(model, prompt, 12)
    assert compiled_ids == eager_ids
    assert torch.allclose(torch.stack(compiled_logits), torch.stack(eager_logits), atol=1e-4, rtol=1e-4)


@pytest.mark.needs_compiler
def test_a_package_on_disk_is_loaded_at_once(packed_model, compiled_package, monkeypatch):
    destination, _ = compiled_package
    path = compiled.package_path(packed_model.transformer, packed_model.cache_dtype)
    path.parent.mkdir(parents=True)
    path.write_bytes(destination.read_bytes())
    compiled.verify_path(path).write_bytes(compiled.verify_path(destination).read_bytes())
    written = (path.stat().st_mtime_ns, compiled.verify_path(path).stat().st_mtime_ns)

    def no_build(*_):
        raise AssertionError("a package on disk was built again")

    # Without waiting, and in one-shot mode (no background work) too: it is opened, not built.
    with monkeypatch.context() as patched:
        patched.setattr(compiled, "BackgroundBuild", no_build)
        patched.setattr(compiled, "build_packages", no_build)
        for background in (True, False):
            runner = new_compiled_runner(packed_model)
            assert runner.compile(background=background).describe() == "compiled"
            assert runner.packages is not None and runner.pending is None
    assert (path.stat().st_mtime_ns, compiled.verify_path(path).stat().st_mtime_ns) == written
    # A truncated package is one line: removed, the eager step goes on (one-shot mode), and
    # the next chat builds it again in the background and uses it.
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    broken = new_compiled_runner(packed_model)
    note = broken.compile(background=False).describe()
    assert note.startswith("eager (the compiled step on disk did not load (") and "\n" not in note
    assert "removed; the next chat builds it" in note and not path.exists() and broken.packages is None
    healed = new_compiled_runner(packed_model)
    assert healed.compile(wait=True).describe().startswith("compiled (built in") and healed.packages is not None
    assert compiled.is_built(path)


def test_a_failed_compile_leaves_the_eager_step_with_one_line(packed_model, monkeypatch):
    # The child process cannot be patched, so it is handed a structure file it cannot read.
    monkeypatch.setattr(compiled, "structure_copy", lambda transformer: "not a model")
    runner = new_compiled_runner(packed_model)
    runner.compile(wait=True)
    assert runner.packages is None
    assert runner.status.describe().startswith("eager (compiling the decode step failed")
    assert "\n" not in runner.status.describe()
    reply = packed_model.generate(IDS[:5], SamplingSettings(temperature=0, max_tokens=5), stop_ids=())
    assert len(list(reply)) == 5  # the eager step still runs
    monkeypatch.setattr(compiled, "available", lambda: False)
    assert new_compiled_runner(packed_model).compile().describe() == (
        "eager (this PyTorch cannot run a step compiled ahead of time)"
    )


def test_the_chat_compiles_in_the_background_but_a_one_shot_reply_does_not(packed_model):
    from llama_chat.cli.loaders import CompilingLoader

    started = []
    packed_model.runner.compile = lambda wait=False, background=True: started.append((wait, background))
    try:
        CompilingLoader(lambda path: packed_model, "auto", background=True)("m")
        CompilingLoader(lambda path: packed_model, "auto", background=False)("m")
        CompilingLoader(lambda path: packed_model, "wait", background=False)("m")
        CompilingLoader(lambda path: packed_model, "off", background=True)("m")
    finally:
        del packed_model.runner.compile
    assert started == [(False, True), (False, False), (True, True)]


def test_a_package_is_keyed_by_the_code_it_is_traced_from(packed_model):
    """Found from the model itself: its modules' files and what they import from the package
    (a change to any makes a new package), and not the code around the step."""
    sources = compiled.traced_sources(packed_model.transformer)
    names = {path.relative_to(path.parents[1]).as_posix() for path in sources}
    # The packed matrices' module: llama-chat's kernels' (block_linear.py) or PyTorch's (packed.py).
    matrix = Path(inspect.getfile(type(packed_model.transformer.layers[0].feed_forward.w2)))
    assert matrix.parent.name == "kernels"
    assert {"engine/model.py", "engine/rope.py", f"kernels/{matrix.name}", "engine/compiled.py"} <= names
    assert not names & {"engine/generation.py", "engine/speculation.py", "engine/runners.py", "chat/session.py"}
