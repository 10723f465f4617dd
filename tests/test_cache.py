import pytest
import torch

from llama_chat.errors import ContextOverflowError

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
