"""llama-chat's attention over the KV cache (kernels/cache_attention.py, csrc/attention_*)
against PyTorch's float32 attention, in every variant this CPU runs; its place in the model
step, eager and compiled; and the float16 cache it brings by default."""

import json
import zipfile
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat import Llama
from llama_chat.engine import compiled
from llama_chat.kernels import native
from llama_chat.kernels.cache_attention import CacheAttention, use_cache_attention

from .conftest import tiny_args
from .loading_helpers import options_from_environment
from .test_gguf import tiny_hf_model, write_gguf
from .test_runners import compiled_runner

pytestmark = pytest.mark.needs_kernels

CACHE_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
VARIANTS = ("portable", "avx2", "avx512-vnni", "avx512-amx")  # every variant the library has, where this CPU runs it
# (new tokens, query heads, key/value heads, head_dim, cached positions)
SHAPES = [
    (1, 4, 4, 64, 0),      # an empty cache, a head of its own for each query
    (1, 8, 2, 64, 1),
    (1, 9, 3, 128, 37),    # an odd length, three queries to a key/value head
    (1, 32, 8, 64, 1000),  # long: several blocks and chunks
    (7, 6, 2, 128, 301),
    (16, 8, 2, 64, 1000),
    (3, 4, 4, 80, 129),    # a head_dim that is no whole number of vectors
    (40, 6, 2, 64, 0),     # a prompt's first chunk: runs of new tokens
    (100, 9, 3, 64, 300),  # a later chunk: runs over the cache too
]


def reference(q, new_keys, new_values, past_keys, past_values, position, past_mask=None):
    """PyTorch's float32 attention as Attention computes it over a cache: the cache read back into
    float32, the first `position` cached positions all visible or under past_mask, the new
    ones causal, one softmax."""
    time, heads, head_dim = q.shape
    kv_heads = new_keys.shape[1]
    past = torch.zeros(position) if past_mask is None else past_mask
    n_rep = heads // kv_heads
    grouped = q.view(time, kv_heads, n_rep, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, n_rep * time, head_dim)
    keys = torch.cat([past_keys[:, :position].float(), new_keys.transpose(0, 1)], dim=1)
    values = torch.cat([past_values[:, :position].float(), new_values.transpose(0, 1)], dim=1)
    future = torch.arange(time)[None, :] > torch.arange(time).repeat(n_rep)[:, None]
    bias = torch.cat([past.expand(n_rep * time, -1), torch.zeros(future.shape).masked_fill(future, -torch.inf)], 1)
    weights = torch.softmax(grouped @ keys.transpose(1, 2) * head_dim**-0.5 + bias, dim=-1)
    return (weights @ values).view(kv_heads, n_rep, time, head_dim).permute(2, 0, 1, 3).reshape(time, heads, head_dim)


def random_inputs(tokens, heads, kv_heads, head_dim, position, cache_dtype, with_bias, seed=0):
    generator = torch.Generator().manual_seed(seed)
    capacity = position + 5  # the cache is longer than what it holds: the rest is never read
    # Views as the model passes them: q and k from the rotated heads, v from the projection.
    rotated = torch.randn(tokens, heads + kv_heads, head_dim, generator=generator) * 2
    projected = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=generator)
    q, new_keys, new_values = rotated[:, :heads], rotated[:, heads:], projected[:, heads + kv_heads :]
    past_keys, past_values = (
        torch.randn(kv_heads, capacity, head_dim, generator=generator).to(cache_dtype) for _ in range(2)
    )
    past_mask = None  # every held position visible
    if with_bias and position:
        past_mask = torch.randn(position, generator=generator)
        past_mask[:: 3] = -torch.inf  # hidden positions
    return q, new_keys, new_values, past_keys, past_values, position, past_mask


def attend(variant, q, new_keys, new_values, past_keys, past_values, position, past_mask=None, window=0, softcap=0.0):
    return torch.ops.llama_chat.cache_attention(
        q, new_keys, new_values, past_keys, past_values, position, past_mask, q.shape[-1] ** -0.5, window, softcap,
        native.variant_number(variant),
    )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_kernel_attends_as_pytorch_does_in_float32(variant, cache_dtype, shape, with_bias):
    if variant not in native.runnable_variants():
        pytest.skip(f"this CPU cannot run {variant}")
    inputs = random_inputs(*shape, cache_dtype, with_bias)
    out = attend(variant, *inputs)
    assert out.shape == inputs[0].shape and out.dtype == torch.float32
    # A prompt chunk on the tile unit: queries, keys and weights split into two bfloat16 each.
    atol = TILE_TOLERANCE if on_tiles(variant, shape[0]) else 2e-5
    assert torch.allclose(out, reference(*inputs), atol=atol, rtol=1e-4)


TILE_TOLERANCE = 2e-4  # 16 bits of each operand: measured 5e-5 on these shapes


def on_tiles(variant: str, tokens: int) -> bool:
    """Whether a step of `tokens` attends on the tile unit: more than a verify step's 32 on avx512-amx."""
    return variant == "avx512-amx" and tokens > 32


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("shape, window", [((33, 4, 4, 32, 17), 0), ((48, 3, 1, 128, 70), 0), ((40, 2, 2, 256, 33), 5),
                                           ((64, 8, 2, 64, 300), 0), ((100, 9, 3, 64, 0), 20)])
def test_a_prompt_chunk_on_the_tile_unit_is_far_closer_than_bfloat16(cache_dtype, shape, window):
    """Steps of more than 32 tokens on the avx512-amx variant: 33 to 100 tokens (a last group
    of fewer than 16 rows), head_dim 32 to 256, a bias a token, a window. Within
    TILE_TOLERANCE of float32, and under a twentieth of the error of operands rounded to
    bfloat16 (what tiles without the split would multiply)."""
    if "avx512-amx" not in native.runnable_variants():
        pytest.skip("this CPU (or its system) gives no AMX tiles: the avx512-amx variant cannot run here")
    tokens, position = shape[0], shape[-1]
    q, new_keys, new_values, past_keys, past_values, _, _ = random_inputs(*shape, cache_dtype, False)
    generator = torch.Generator().manual_seed(2)
    past_mask = torch.randn(tokens, position, generator=generator)
    past_mask[torch.rand(tokens, position, generator=generator) < 0.3] = -torch.inf
    inputs = (q, new_keys, new_values, past_keys, past_values, position, past_mask)
    seen = window or tokens  # the reference's window: every new token where the kernel's is 0
    exact = windowed_reference(*inputs, seen, 0.0)
    got = attend("avx512-amx", *inputs, window=window)
    rounded = windowed_reference(*(x.bfloat16().float() for x in inputs[:5]), position, past_mask, seen, 0.0)
    error, bfloat16_error = (got - exact).abs().max(), (rounded - exact).abs().max()
    assert error < TILE_TOLERANCE and error < bfloat16_error / 20, (error, bfloat16_error)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunks_of_a_long_cache_merge_to_the_same_softmax(threads):
    """One key/value head over 1000 positions is cut into as many chunks as threads; the
    chunks' partial softmaxes merge to what one pass gives."""
    inputs = random_inputs(2, 4, 1, 64, 1000, torch.float16, with_bias=True)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = attend(native.runnable_variants()[-1], *inputs)
    finally:
        torch.set_num_threads(before)
    assert torch.allclose(out, reference(*inputs), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("position", [0, 300])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_tokens_attention_does_not_depend_on_the_tokens_sharing_its_step(position, variant):
    """Token t of a step (cut into runs) gets the same bits as in a step of tokens 0..t
    alone, where both steps run on the same unit: a 32-token step (speculation's verify steps
    keep greedy replies identical) and a 70-token one (on the tile unit, in avx512-amx)."""
    if variant not in native.runnable_variants():
        pytest.skip(f"this CPU cannot run {variant}")
    inputs = random_inputs(70, 6, 2, 64, position, torch.float16, with_bias=True)
    for step, tokens in ((32, (0, 15, 16, 31)), (70, (32, 33, 47, 69))):
        whole = attend(variant, *(x[:step] for x in inputs[:3]), *inputs[3:])
        for t in tokens:
            q, new_keys, new_values = (x[: t + 1] for x in inputs[:3])
            alone = attend(variant, q, new_keys, new_values, *inputs[3:])
            assert torch.equal(whole[t], alone[t]), (step, t)


def test_the_kernel_refuses_what_it_cannot_read():
    q, new_keys, new_values, past_keys, past_values, position, _ = random_inputs(1, 4, 2, 64, 10, torch.float16,
                                                                                  False)
    variant = native.runnable_variants()[-1]
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16, not Int"):
        attend(variant, q, new_keys, new_values, past_keys.int(), past_values.int(), position)
    short_keys, short_values = past_keys[:, :8].contiguous(), past_values[:, :8].contiguous()
    with pytest.raises(RuntimeError, match="11 positions past a cache of 8"):
        attend(variant, q, new_keys, new_values, short_keys, short_values, 11)
    with pytest.raises(RuntimeError, match="4 query heads do not share 3 key/value heads evenly"):
        attend(variant, q, torch.zeros(1, 3, 64), torch.zeros(1, 3, 64), past_keys, past_values, position)
    with pytest.raises(RuntimeError, match="past_mask must be contiguous float32"):
        attend(variant, q, new_keys, new_values, past_keys, past_values, position, torch.zeros(position).half())
    with pytest.raises(RuntimeError, match=r"past_mask must be contiguous float32 \[position\]"):
        attend(variant, q, new_keys, new_values, past_keys, past_values, position, torch.zeros(position - 1))


@pytest.mark.parametrize("n_kv_heads", [6, 2])
def test_a_model_step_with_the_kernel_gives_pytorchs_logits(n_kv_heads):
    """A prompt chunk, decode steps and a verify-sized step on the kernel (float16 cache)
    against the same model on PyTorch's attention (float32 cache)."""
    plain = Llama.random(tiny_args(n_kv_heads=n_kv_heads), seed=1)
    kernel = Llama.random(tiny_args(n_kv_heads=n_kv_heads), seed=1)
    use_cache_attention(kernel.transformer, native.variant_number(native.runnable_variants()[-1]))
    kernel = Llama(kernel.transformer, kernel.tokenizer, cache_dtype=torch.float16)
    ids = [(37 * i) % 250 + 3 for i in range(60)]
    logits = {}
    for name, model in (("plain", plain), ("kernel", kernel)):
        cache = model.new_cache(64)
        steps = [model.runner(cache, ids[:20], every_logits=True)]  # a prompt chunk
        steps += [model.runner(cache, [token], every_logits=True) for token in ids[20:40]]
        steps.append(model.runner(cache, ids[40:47], every_logits=True))
        logits[name] = torch.cat(steps)
        assert cache.tokens == ids[:47]
    assert kernel.new_cache(8).dtype == torch.float16
    assert torch.allclose(logits["kernel"], logits["plain"], atol=2e-3)
    assert torch.equal(logits["kernel"].argmax(-1), logits["plain"].argmax(-1))


def dispatched_operators(package: Path) -> list[str]:
    """The operators a compiled package calls through PyTorch's dispatcher (its own kernels
    are compiled in; these are listed in its wrapper's JSON)."""
    with zipfile.ZipFile(package) as archive:
        name = next(name for name in archive.namelist() if name.endswith(".wrapper.json"))
        return [node["node"]["target"] for node in json.loads(archive.read(name))["nodes"]]


@pytest.mark.needs_compiler
def test_the_compiled_step_calls_the_kernel_and_agrees_with_the_eager_one(tmp_path):
    model = Llama.random(tiny_args(), seed=2)
    use_cache_attention(model.transformer, native.variant_number(native.runnable_variants()[-1]))
    model = Llama(model.transformer, model.tokenizer, cache_dtype=torch.float16)
    destination = tmp_path / "decode.pt2"
    background = compiled.BackgroundBuild(model.transformer, torch.float16, destination)
    background.wait()
    assert background.error == "" and background.packages is not None
    for package in (destination, compiled.verify_path(destination)):  # once a layer, in both packages
        assert dispatched_operators(package).count("llama_chat::cache_attention") == model.args.n_layers
    ids = [(37 * i) % 250 + 3 for i in range(40)]
    results, held = {}, {}
    for name, packages in (("eager", None), ("compiled", background.packages)):
        compiled_runner(model).packages = packages
        cache = model.new_cache(64)
        model.runner(cache, ids[:20])
        results[name] = torch.stack([model.runner(cache, [token]) for token in ids[20:30]] +
                                    [model.runner(cache, ids[30:40], every_logits=True)[-1]])
        held[name] = cache.state()
    assert torch.allclose(results["compiled"], results["eager"], atol=1e-4, rtol=1e-4)
    # The compiled steps' keys and values went into the cache where the eager steps' go.
    assert held["compiled"]["tokens"].tolist() == ids
    for part in ("keys", "values"):
        torch.testing.assert_close(held["compiled"][part], held["eager"][part], atol=1e-3, rtol=1e-3)


def test_a_model_on_llama_chats_kernels_attends_with_them_over_a_float16_cache(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "q8.gguf", tiny_hf_model(seed=3), qtype=QType.Q8_0)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    attention = [layer.attention.cache_attention for layer in model.transformer.layers]
    assert all(isinstance(kernel, CacheAttention) for kernel in attention)
    assert model.cache_dtype == torch.float16 and model.new_cache(8).dtype == torch.float16
    wide = llama_chat.load(path, options_from_environment(), device="cpu", kv_dtype="float32")
    assert wide.cache_dtype == torch.float32
    monkeypatch.setenv("LLAMA_CHAT_KERNELS", "aten")  # PyTorch's kernels: its attention, the model's dtype
    aten = llama_chat.load(path, options_from_environment(), device="cpu")
    assert aten.cache_dtype == torch.float32
    assert all(layer.attention.cache_attention is None for layer in aten.transformer.layers)


def windowed_reference(q, new_keys, new_values, past_keys, past_values, position, past_mask, window, softcap):
    """As reference, with a mask a token [time, position], the new tokens seeing at most the
    last `window` of themselves and every score capped: a windowed layer's attention (Gemma)."""
    time, heads, head_dim = q.shape
    kv_heads = new_keys.shape[1]
    n_rep = heads // kv_heads
    grouped = q.view(time, kv_heads, n_rep, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, n_rep * time, head_dim)
    keys = torch.cat([past_keys[:, :position].float(), new_keys.transpose(0, 1)], dim=1)
    values = torch.cat([past_values[:, :position].float(), new_values.transpose(0, 1)], dim=1)
    tokens = torch.arange(time)
    hidden = (tokens[None, :] > tokens[:, None]) | (tokens[:, None] - tokens[None, :] >= window)
    new_bias = torch.zeros(hidden.shape).masked_fill(hidden, -torch.inf)
    bias = torch.cat([past_mask, new_bias], dim=1).repeat(n_rep, 1)  # rows: the query heads, token by token
    scores = grouped @ keys.transpose(1, 2) * head_dim**-0.5
    scores = torch.tanh(scores / softcap) * softcap if softcap else scores
    weights = torch.softmax(scores + bias, dim=-1)
    return (weights @ values).view(kv_heads, n_rep, time, head_dim).permute(2, 0, 1, 3).reshape(time, heads, head_dim)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(1, 8, 2, 64, 40), (7, 6, 2, 128, 48), (40, 6, 2, 64, 48), (100, 9, 3, 64, 300)])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_a_windowed_layers_attention_matches_pytorchs(variant, shape, softcap):
    """A bias a token over the ring's slots (some hidden, differently for each token), the new
    tokens within a window of 16 (a prompt chunk of 40 or 100 spans more than one), capped
    scores: as PyTorch computes them in float32."""
    if variant not in native.runnable_variants():
        pytest.skip(f"this CPU cannot run {variant}")
    tokens, heads, kv_heads, head_dim, position = shape
    q, new_keys, new_values, past_keys, past_values, _, _ = random_inputs(*shape, torch.float16, False)
    generator = torch.Generator().manual_seed(1)
    past_mask = torch.randn(tokens, position, generator=generator)
    past_mask[torch.rand(tokens, position, generator=generator) < 0.4] = -torch.inf
    out = attend(variant, q, new_keys, new_values, past_keys, past_values, position, past_mask, window=16,
                 softcap=softcap)
    expected = windowed_reference(q, new_keys, new_values, past_keys, past_values, position, past_mask, 16, softcap)
    # Capped scores stay on the vector kernel (its tanh); the tile unit takes the others.
    atol = TILE_TOLERANCE if on_tiles(variant, tokens) and not softcap else 2e-5
    assert torch.allclose(out, expected, atol=atol, rtol=1e-4)
    if softcap:  # the cap changes the result: the kernel does not ignore it
        uncapped = windowed_reference(q, new_keys, new_values, past_keys, past_values, position, past_mask, 16, 0.0)
        assert (out - uncapped).abs().max() > 1e-2


def test_a_bias_a_token_must_have_a_row_for_each_token():
    q, new_keys, new_values, past_keys, past_values, _, _ = random_inputs(3, 4, 2, 64, 10, torch.float16, False)
    with pytest.raises(RuntimeError, match=r"\[position\] or \[tokens, position\]"):
        attend(native.runnable_variants()[-1], q, new_keys, new_values, past_keys, past_values, 10, torch.zeros(2, 10))
