import gc
import weakref

import pytest

from llama_chat import SamplingSettings
from llama_chat.chat.display import stats_line
from llama_chat.engine.generation import GenerationStats, StopReason
from llama_chat.errors import ContextOverflowError

GREEDY = SamplingSettings(temperature=0, max_tokens=12)
PROMPT = [72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101]


def run(model, prompt=PROMPT, settings=GREEDY, **options):
    generation = model.generate(prompt, settings, **options)
    pieces = list(generation)
    return generation, pieces


def test_greedy_tokens_follow_the_argmax_of_full_forward_passes(tiny_model):
    generation, pieces = run(tiny_model, stop_ids=())
    ids = list(PROMPT)
    for token in generation.tokens:
        assert token == int(tiny_model.logits(ids)[-1].argmax())
        ids.append(token)
    assert len(generation.tokens) == 12
    assert generation.stats.stop_reason == "max_tokens"
    assert "".join(p.text for p in pieces) == generation.text == tiny_model.tokenizer.decode(generation.tokens)


def test_a_finished_reply_holds_no_cycle_that_keeps_its_cache(tiny_model):
    """The cache goes with the last reference to its reply, not at the collector's next run
    (one reply's cache after another's raised the peak memory of a benchmark's repeats)."""
    cache = tiny_model.new_cache(64)
    generation = tiny_model.generate(PROMPT, GREEDY, cache=cache)
    list(generation)
    held = weakref.ref(cache)
    gc.disable()
    try:
        del cache, generation
        assert held() is None
    finally:
        gc.enable()


def test_any_of_several_stop_ids_ends_the_reply(tiny_model):
    free, _ = run(tiny_model, stop_ids=())
    stop_at = free.tokens[4]
    first_stop_index = free.tokens.index(stop_at)
    stopped, _ = run(tiny_model, stop_ids={999, stop_at})
    assert stopped.tokens == free.tokens[:first_stop_index]
    assert stopped.stats.stop_reason == "stop_token"


def test_a_stop_string_cuts_the_text_before_it(tiny_model):
    free, _ = run(tiny_model, stop_ids=())
    stop = free.text[5:7]
    stopped, pieces = run(tiny_model, stop_ids=(), stop_strings=[stop])
    assert stopped.text == free.text[: free.text.index(stop)]
    assert "".join(p.text for p in pieces) == stopped.text
    assert stopped.stats.stop_reason == "stop_string"


def test_stop_reasons_read_as_the_words_people_are_shown():
    assert [f"{reason}" for reason in StopReason] == [
        "stop_token", "stop_string", "format_complete", "max_tokens", "context_full", "interrupted"
    ]
    assert StopReason("context_full") is StopReason.CONTEXT_FULL
    assert stats_line(GenerationStats(stop_reason=StopReason.MAX_TOKENS)).startswith("[max tokens reached] ")
    assert stats_line(GenerationStats(stop_reason=StopReason.CONTEXT_FULL)).startswith("[context full] ")
    assert stats_line(GenerationStats(stop_reason=StopReason.STOP_TOKEN)).startswith("0 tokens")


def test_stopping_midway_leaves_a_cache_that_continues_exactly(tiny_model):
    reference, _ = run(tiny_model, stop_ids=())
    cache = tiny_model.new_cache(64)
    generation = tiny_model.generate(PROMPT, GREEDY, cache=cache, stop_ids=())
    for count, _ in enumerate(generation, start=1):
        if count == 5:
            break  # as Ctrl-C does
    produced = generation.tokens
    assert produced == reference.tokens[:5]
    assert cache.tokens == PROMPT + produced[:-1]  # the last sampled token is not fed yet
    resumed = tiny_model.generate(PROMPT + produced, GREEDY, cache=cache, stop_ids=())
    list(resumed)
    assert resumed.stats.reused_tokens == len(PROMPT) + 4
    assert produced + resumed.tokens[:7] == reference.tokens


def test_a_later_turn_feeds_only_the_new_tokens(tiny_model):
    cache = tiny_model.new_cache(64)
    first, _ = run(tiny_model, cache=cache, stop_ids=())
    follow_up = PROMPT + first.tokens + [10, 65, 66, 10]
    second, _ = run(tiny_model, follow_up, cache=cache, stop_ids=())
    assert second.stats.prompt_tokens == len(follow_up)
    assert second.stats.reused_tokens == len(PROMPT) + len(first.tokens) - 1
    assert second.stats.prefilled_tokens == 5
    fresh, _ = run(tiny_model, follow_up, stop_ids=())
    assert second.tokens == fresh.tokens


def test_the_same_prompt_again_refeeds_only_its_last_token(tiny_model):
    cache = tiny_model.new_cache(64)
    first, _ = run(tiny_model, cache=cache, stop_ids=())
    again, _ = run(tiny_model, cache=cache, stop_ids=())
    assert again.stats.prefilled_tokens == 1
    assert again.tokens == first.tokens


def test_statistics_are_filled_in(tiny_model):
    generation, _ = run(tiny_model, stop_ids=())
    stats = generation.stats
    assert stats.prompt_tokens == len(PROMPT) and stats.reused_tokens == 0
    assert stats.generated_tokens == 12
    assert 0 < stats.prefill_seconds <= stats.time_to_first_token
    assert stats.decode_seconds > 0 and stats.decode_tokens_per_second > 0
    assert stats.prefill_tokens_per_second > 0


def test_generation_stops_when_the_context_is_full(tiny_model):
    cache = tiny_model.new_cache(16)
    generation, _ = run(tiny_model, cache=cache, settings=SamplingSettings(temperature=0, max_tokens=50), stop_ids=())
    assert generation.stats.stop_reason == "context_full"
    assert len(cache) == 16


def test_a_prompt_longer_than_the_context_is_refused(tiny_model):
    with pytest.raises(ContextOverflowError, match="--ctx-size"):
        tiny_model.generate(list(range(40)), GREEDY, cache=tiny_model.new_cache(32))


def test_seeded_sampling_is_reproducible(tiny_model):
    settings = SamplingSettings(temperature=1.0, seed=11, max_tokens=15)
    first, _ = run(tiny_model, settings=settings, stop_ids=())
    second, _ = run(tiny_model, settings=settings, stop_ids=())
    assert first.tokens == second.tokens
