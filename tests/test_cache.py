import pytest
import torch

from llama_chat import Llama
from llama_chat.engine import compiled
from llama_chat.engine.cache import TRIM_MARGIN, KVCache
from llama_chat.errors import ContextOverflowError

from .conftest import tiny_args

PROMPT = [(i * 53 + 7) % 256 for i in range(23)]


def test_prefill_then_decode_equals_one_full_forward(tiny_model):
    full = tiny_model.logits(PROMPT)
    cache = tiny_model.new_cache(64)
    step_logits = [tiny_model.runner(cache, PROMPT[:9])]
    for token in PROMPT[9:]:
        step_logits.append(tiny_model.runner(cache, [token]))
    assert torch.allclose(torch.stack(step_logits), full[8:], atol=1e-5, rtol=0)
    assert cache.tokens == PROMPT


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 22])
def test_chunked_prefill_equals_one_full_forward(tiny_model, chunk_size):
    full = tiny_model.logits(PROMPT)
    cache = tiny_model.new_cache(64)
    last = tiny_model.runner(cache, PROMPT, chunk_size=chunk_size)
    assert torch.allclose(last, full[-1], atol=1e-5, rtol=0)
    # Every position's keys and values are right too: continue and compare.
    after = tiny_model.runner(cache, [42, 43])
    assert torch.allclose(after, tiny_model.logits(PROMPT + [42, 43])[-1], atol=1e-5, rtol=0)


def test_several_tokens_at_a_later_position(tiny_model):
    cache = tiny_model.new_cache(64)
    tiny_model.runner(cache, PROMPT[:10])
    last = tiny_model.runner(cache, PROMPT[10:], chunk_size=100)
    assert torch.allclose(last, tiny_model.logits(PROMPT)[-1], atol=1e-5, rtol=0)


def test_truncate_and_refeed_equals_a_fresh_run(tiny_model):
    cache = tiny_model.new_cache(64)
    tiny_model.runner(cache, PROMPT)
    cache.trim(11)
    assert len(cache) == 11
    other = [1, 2, 3, 4, 5]
    refed = tiny_model.runner(cache, other)
    fresh_cache = tiny_model.new_cache(64)
    fresh = tiny_model.runner(fresh_cache, PROMPT[:11] + other)
    assert torch.allclose(refed, fresh, atol=1e-5, rtol=0)
    assert cache.tokens == fresh_cache.tokens


def test_feeding_past_the_capacity_is_refused_and_changes_nothing(tiny_model):
    cache = tiny_model.new_cache(16)
    tiny_model.runner(cache, PROMPT[:10])
    with pytest.raises(ContextOverflowError, match="do not fit"):
        tiny_model.runner(cache, PROMPT[10:17])
    assert cache.tokens == PROMPT[:10]


def test_cache_larger_than_the_model_context_is_refused(tiny_model):
    with pytest.raises(ContextOverflowError, match="1 to 128"):
        tiny_model.new_cache(129)


def test_a_batch_runs_through_the_whole_sequence_pass(tiny_model):
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.inference_mode():
        batched = tiny_model.transformer(tokens)
    assert torch.allclose(batched[1], tiny_model.logits([4, 5, 6]), atol=1e-5)


# --- windowed layers (Gemma's local layers) -------------------------------------------------

WINDOW = 16


@pytest.fixture
def windowed_model():
    """Three layers, the first and last windowed; max_seq_len long enough for rings to turn over."""
    args = tiny_args(n_layers=3, max_seq_len=256, sliding_window=WINDOW, windowed_layers=(True, False, True),
                     local_rope_theta=100.0)
    return Llama.random(args, seed=3)


IDS = [(37 * i) % 250 + 3 for i in range(120)]


def test_a_windowed_layers_ring_holds_its_window_whatever_the_context(windowed_model):
    """Keys and values for window + TRIM_MARGIN positions a windowed layer, for any context;
    only the global layers grow with it."""
    long_cache = windowed_model.new_cache(256)
    short_cache = windowed_model.new_cache(64)
    assert long_cache.ring == short_cache.ring == WINDOW + TRIM_MARGIN
    assert long_cache.ring_bytes() == short_cache.ring_bytes() == 2 * 2 * 2 * (WINDOW + TRIM_MARGIN) * 8 * 4
    assert long_cache.position_bytes() == 2 * 1 * 2 * 8 * 4  # the one global layer
    assert windowed_model.new_cache(20).ring == 20  # no ring longer than the context


def test_the_ring_turns_over_and_every_call_sees_what_the_whole_sequence_sees(windowed_model):
    reference = windowed_model.logits(IDS)
    cache = windowed_model.new_cache(256)
    got = [windowed_model.runner(cache, IDS[:40], every_logits=True)]
    got += [windowed_model.runner(cache, [token], every_logits=True) for token in IDS[40:80]]
    got += [windowed_model.runner(cache, IDS[80:], every_logits=True, chunk_size=7)]
    torch.testing.assert_close(torch.cat(got), reference, atol=1e-5, rtol=0)


def test_a_trim_within_the_margin_is_exact_and_one_past_it_goes_back_to_a_checkpoint(windowed_model):
    reference = windowed_model.logits(IDS)
    cache = windowed_model.new_cache(256)
    windowed_model.runner(cache, IDS[:60])
    cache.checkpoint()
    windowed_model.runner(cache, IDS[60:100])
    # The rings hold positions 52..99: position 67 needs 52..66, position 66 needs 51.
    assert cache.trim(67) == 67
    assert cache.trim(66) == 60  # back to the checkpoint, the rest to be fed again
    assert cache.tokens == IDS[:60]
    torch.testing.assert_close(windowed_model.runner(cache, IDS[60:100], every_logits=True), reference[60:100],
                               atol=1e-5, rtol=0)
    assert cache.trim(50) == 50  # within the checkpoint's margin: its rings hold 12..59
    torch.testing.assert_close(windowed_model.runner(cache, IDS[50:70], every_logits=True), reference[50:70],
                               atol=1e-5, rtol=0)


def test_a_trim_before_every_checkpoint_starts_over_and_drops_the_checkpoints_past_it(windowed_model):
    cache = windowed_model.new_cache(256)
    windowed_model.runner(cache, IDS[:60])
    cache.checkpoint()
    windowed_model.runner(cache, IDS[60:100])
    assert cache.trim(5) == 0 and cache.tokens == []
    windowed_model.runner(cache, IDS[::-1][:100])  # another text
    assert cache.trim(55) == 0  # the checkpoint at 60 held the first text: it went with it


def test_a_windowed_cache_saves_only_what_it_holds_exactly_and_reopens_it(windowed_model):
    reference = windowed_model.logits(IDS)
    cache = windowed_model.new_cache(256)
    windowed_model.runner(cache, IDS[:90])
    # The rings hold positions 42..89: 57 needs 42..56, 56 needs 41, which is overwritten.
    assert (cache.exact_length(90), cache.exact_length(57), cache.exact_length(56)) == (90, 57, 0)
    state = cache.state()
    assert state["window_keys"].shape == (2, 2, WINDOW - 1, 8) and state["keys"].shape == (1, 2, 90, 8)
    other = windowed_model.new_cache(256)
    other.load_state(IDS[:90], state)
    torch.testing.assert_close(windowed_model.runner(other, IDS[90:], every_logits=True), reference[90:],
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no longer hold what position 56 needs"):
        cache.state(56)


# --- the one write: every call, eager or compiled, hands its keys and values over alike ------


@pytest.mark.parametrize("windowed", [False, True])
def test_write_stores_each_layers_keys_and_values_in_place_and_moves_the_position(windowed):
    args = tiny_args(n_layers=3, sliding_window=WINDOW, windowed_layers=(True, False, True)) if windowed else tiny_args()
    cache = KVCache(args, 64)
    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(args.n_layers, 5, args.n_kv_heads, args.head_dim, generator=generator)
                    for _ in range(2))
    cache.write([1, 2, 3, 4, 5], keys, values)
    assert (cache.position, len(cache), cache.tokens) == (5, 5, [1, 2, 3, 4, 5])
    state = cache.state()
    global_layers = [layer for layer in range(args.n_layers) if not args.is_windowed(layer)]
    # [layers, kv_heads, positions, head_dim]: the one transpose, keys and values each where they belong.
    assert torch.equal(state["keys"], keys[global_layers].transpose(1, 2))
    assert torch.equal(state["values"], values[global_layers].transpose(1, 2))
    if windowed:
        assert torch.equal(state["window_keys"], keys[[0, 2]].transpose(1, 2))
        assert torch.equal(state["window_values"], values[[0, 2]].transpose(1, 2))
    assert cache.trim(2) == 2 and cache.position == 2 and cache.tokens == [1, 2]
    cache.write([9], keys[:, :1], values[:, :1])
    assert cache.position == 3 and torch.equal(cache.state()["keys"][:, :, 2], keys[global_layers, 0])
    with pytest.raises(ContextOverflowError, match="is full"):
        cache.write(list(range(62)), torch.zeros(args.n_layers, 62, 2, 8), torch.zeros(args.n_layers, 62, 2, 8))
    assert cache.position == 3


@pytest.mark.parametrize("windowed", [False, True])
def test_the_eager_call_and_the_compiled_calls_form_write_the_same_keys_and_values(windowed, tiny_model,
                                                                                   windowed_model):
    """The call a package is compiled from, run as it is, hands the cache what the eager call
    does: the same keys and values, to the bit, at the same position."""
    model = windowed_model if windowed else tiny_model
    caches = [model.new_cache(64), model.new_cache(64)]
    for cache in caches:
        model.runner(cache, IDS[:30])
    ids = IDS[30:34]
    with torch.inference_mode():
        eager = model.transformer(torch.tensor([ids]), caches[0])[0]
        call = compiled._FunctionalCall(model.transformer)
        weights = list(compiled.traced_weights(model.transformer).values())
        embeddings = model.transformer.tok_embeddings(torch.tensor([ids]))
        logits, keys, values = call(embeddings, caches[1].call_inputs(len(ids)), weights)
        caches[1].write(ids, keys, values)
    assert torch.equal(logits, eager)
    assert caches[0].position == caches[1].position == 34
    saved = [cache.state() for cache in caches]
    assert saved[0].keys() == saved[1].keys()
    for name in saved[0]:
        assert torch.equal(saved[0][name], saved[1][name]), name
