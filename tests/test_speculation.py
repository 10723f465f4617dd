"""Speculative decoding (engine/speculation.py): drafts by prompt lookup or a draft model,
checked by one verify step; greedy replies unchanged, sampled ones distributed as before."""

import dataclasses
import itertools

import pytest
import torch

from llama_chat import Llama, SamplingSettings
from llama_chat.chat.session import Session
from llama_chat.engine.sampling import Sampler, accept
from llama_chat.engine.speculation import (
    Acceptance,
    Draft,
    DraftModel,
    DraftPlanner,
    PromptLookup,
    Speculation,
)
from llama_chat.errors import UsageError
from llama_chat.options import DraftLength
from llama_chat.text.tokenizer import ByteTokenizer

from .conftest import tiny_args
from .test_session import GREEDY, assert_consistent, chat_model, say

# A prompt that repeats itself, so that prompt lookup finds matches.
PHRASE = [(i * 7) % 50 + 3 for i in range(40)]
PROMPT = PHRASE * 2
FORCED_LOOKUP = [Speculation(lookup=DraftLength(4)), Speculation(lookup=DraftLength(8)),
                 Speculation(lookup=DraftLength())]


def reply(model, settings, speculation=None, prompt=PROMPT, cache=None):
    generation = model.generate(prompt, settings, cache=cache, stop_ids=(), speculation=speculation)
    list(generation)
    return generation


@pytest.fixture(scope="module")
def echo_model():
    """A tiny random model trained on nothing, but whose greedy reply to PROMPT repeats
    spans of it often enough: lookup drafts are kept and refused."""
    return Llama.random(tiny_args(), seed=0)


@pytest.mark.parametrize("speculation", FORCED_LOOKUP, ids=["lookup 4", "lookup 8", "lookup auto"])
def test_greedy_replies_are_the_same_with_prompt_lookup(echo_model, speculation):
    settings = SamplingSettings(temperature=0, max_tokens=40)
    plain = reply(echo_model, settings)
    drafted = reply(echo_model, settings, speculation)
    assert drafted.tokens == plain.tokens and len(plain.tokens) == 40
    stats = drafted.stats
    if not speculation.lookup.automatic:  # auto drafts only where this machine's timings say it pays
        assert 0 < stats.accepted_tokens < stats.drafted_tokens  # some kept, some refused and rolled back


def test_lookup_zero_drafts_nothing(echo_model):
    drafted = reply(echo_model, SamplingSettings(temperature=0, max_tokens=30), Speculation(lookup=DraftLength(0)))
    assert drafted.stats.drafted_tokens == 0


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup()
    history = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup.propose(history, 3).tokens == [7, 8, 5]  # the later of two matches of (1, 2, 3)
    assert lookup.propose([*history, 7, 8], 2).tokens == [5, 1]  # grows with the conversation
    assert PromptLookup().propose([4, 5, 6, 7], 3).tokens == []  # no earlier occurrence


def test_a_draft_model_gives_the_same_greedy_reply(echo_model):
    settings = SamplingSettings(temperature=0, max_tokens=40)
    plain = reply(echo_model, settings)
    for draft_seed in (0, 1):  # itself (every draft kept), and another model (most refused)
        draft = DraftModel(Llama.random(tiny_args(), seed=draft_seed))
        drafted = reply(echo_model, settings, Speculation(draft=draft, draft_length=DraftLength(4)))
        assert drafted.tokens == plain.tokens
        assert drafted.stats.drafted_tokens > 0
        if draft_seed == 0:
            assert drafted.stats.accepted_tokens == drafted.stats.drafted_tokens
        else:
            assert drafted.stats.accepted_tokens < drafted.stats.drafted_tokens
        # The draft's own cache followed the conversation (past it, only its last drafts).
        followed = draft.cache.keep_common_prefix(PROMPT + drafted.tokens)
        assert followed > len(PROMPT) + len(drafted.tokens) - 10


def test_the_cache_after_refused_drafts_is_the_one_without_speculation(echo_model):
    settings = SamplingSettings(temperature=0, max_tokens=40)
    plain_cache, drafted_cache = echo_model.new_cache(128), echo_model.new_cache(128)
    plain = reply(echo_model, settings, cache=plain_cache)
    drafted = reply(echo_model, settings, Speculation(lookup=DraftLength(8)), cache=drafted_cache)
    assert drafted.stats.accepted_tokens < drafted.stats.drafted_tokens
    assert drafted_cache.tokens == plain_cache.tokens == PROMPT + plain.tokens[:-1]
    # The rolled-back positions were written again: the next step agrees with a fresh pass.
    following = [plain.tokens[-1], 7]
    expected = echo_model.logits(PROMPT + plain.tokens + [7])[-1]
    assert torch.allclose(echo_model.runner(drafted_cache, following), expected, atol=1e-4, rtol=0)


def test_drafts_stop_at_the_context_and_max_tokens(echo_model):
    """A verify step never runs past the context: the reply ends at the same token."""
    settings = SamplingSettings(temperature=0, max_tokens=200)
    plain = reply(echo_model, settings, cache=echo_model.new_cache(120))
    drafted = reply(echo_model, settings, Speculation(lookup=DraftLength(8)), cache=echo_model.new_cache(120))
    assert plain.stats.stop_reason == drafted.stats.stop_reason == "context_full"
    assert drafted.tokens == plain.tokens and drafted.stats.drafted_tokens > 0
    exact = reply(echo_model, SamplingSettings(temperature=0, max_tokens=7), Speculation(lookup=DraftLength(8)))
    assert len(exact.tokens) == 7 and exact.tokens == plain.tokens[:7]


def test_retry_undo_and_a_full_context_keep_the_session_consistent():
    model = chat_model(max_seq_len=160)
    settings = SamplingSettings(temperature=0, max_tokens=40)
    plain, drafted = Session(model, settings), Session(model, settings)
    drafted.speculation.lookup = DraftLength(6)
    texts = ["abcabcabcabc abcabc", "abc abc abc abc", "xyzxyz xyzxyz xyz"]
    for text in texts:  # the third overflows the context: the oldest exchange is dropped
        assert say(plain, text).text == say(drafted, text).text
        assert_consistent(drafted)
    plain_retry, drafted_retry = plain.retry(), drafted.retry()
    plain_retry.run(), drafted_retry.run()
    assert plain_retry.text == drafted_retry.text
    assert_consistent(drafted)
    plain.undo(), drafted.undo()
    assert say(plain, "abcabc").text == say(drafted, "abcabc").text
    assert_consistent(drafted)
    assert drafted.last_stats.drafted_tokens > 0


def test_a_draft_model_of_another_vocabulary_is_refused():
    model = chat_model()
    session = Session(model, GREEDY)
    wider = Llama.random(tiny_args(vocab_size=300), seed=1)
    with pytest.raises(UsageError, match="draft model has 300 tokens and the model 260"):
        session.set_draft(wider)
    other_specials = ByteTokenizer(["<|im_start|>", "<|im_end|>", "<s>", "<|other|>"])
    renamed = Llama.random(tiny_args(vocab_size=other_specials.vocab_size), other_specials, seed=1)
    with pytest.raises(UsageError, match=r"token 259 is '<\|other\|>' for the draft model and '</s>'"):
        session.set_draft(renamed)
    assert session.speculation.draft is None


class Timings:
    """A model step's timings, as Runner.seconds gives them."""

    def __init__(self, seconds):
        self.seconds = seconds


@pytest.mark.parametrize("seconds, kept, refused, draft_seconds, expected", [
    ({}, 1, 1, 0.0, 0),  # no single step timed yet: nothing to weigh drafts against
    ({1: 0.010}, 1, 1, 0.0, 1),  # the prior slope (0.3 a token) and even odds: one draft
    ({1: 0.010, 9: 0.030}, 40, 1, 0.0, 8),  # cheap wide steps, drafts nearly always kept
    ({1: 0.010, 5: 0.050, 9: 0.090}, 40, 1, 0.0, 0),  # a token of a wide step costs a whole step
    ({1: 0.010, 9: 0.030}, 1, 20, 0.0, 0),  # drafts mostly refused
    ({1: 0.010, 9: 0.030}, 40, 1, 0.010, 0),  # a draft model as slow as the model
    ({1: 0.010, 2: 0.2, 9: 0.030, 5: 0.020}, 40, 1, 0.0, 8),  # one slowed step does not move the median
])
def test_auto_drafts_as_many_tokens_as_the_measured_costs_repay(seconds, kept, refused, draft_seconds, expected):
    planner = DraftPlanner(8, True, Timings(seconds), Acceptance(kept, refused))
    assert planner.length(draft_seconds) == expected
    forced = DraftPlanner(5, False, Timings(seconds))
    assert forced.length(draft_seconds) == 5


def test_acceptance_follows_the_recent_drafts():
    acceptance = Acceptance()
    for _ in range(30):
        acceptance.record(8, 8)
    assert acceptance.alpha > 0.95
    for _ in range(6):  # the conversation turns to replies drafts do not foresee
        acceptance.record(4, 0)
    assert acceptance.alpha < 0.8 and acceptance.kept + acceptance.refused <= 24 + 1e-9


def test_auto_stops_drafting_when_rounds_with_drafts_cost_more_a_token():
    acceptance = Acceptance(kept=40, refused=1)
    planner = DraftPlanner(8, True, Timings({1: 0.010, 9: 0.030}), acceptance)
    assert planner.length() == 8
    for _ in range(10):
        acceptance.record_round(False, 0.010, 1)
        acceptance.record_round(True, 0.030, 2)  # 15 ms a token against 10: the costs misled
    assert planner.length() == 0
    for _ in range(40):
        acceptance.record_round(True, 0.030, 9)
    assert planner.length() == 8


def chi_square_p_value(counts: dict, expected: dict, samples: int) -> float:
    """The chance of a fit at least this bad if counts were drawn from `expected` (chances
    by outcome); outcomes expected fewer than 5 times are pooled into one cell."""
    cells = [key for key, chance in expected.items() if chance * samples >= 5]
    observed = [counts.get(key, 0) for key in cells]
    wanted = [expected[key] * samples for key in cells]
    observed.append(samples - sum(observed))
    wanted.append(samples - sum(wanted))
    statistic = sum((o - w) ** 2 / w for o, w in zip(observed, wanted) if w > 0)
    degrees = sum(w > 0 for w in wanted) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2), torch.tensor(statistic / 2)))


SAMPLED = SamplingSettings(temperature=0.9, top_k=3, top_p=0.95, min_p=0.05, repeat_penalty=1.3, max_tokens=3, seed=1)


def exact_reply_distribution(model: Llama, prompt: list[int], settings: SamplingSettings) -> dict:
    """The chance of every 3-token reply without speculation, from the sampler's own
    distributions at each step (penalty, temperature and filters applied)."""
    sampler = Sampler(settings)
    chances = {(): 1.0}
    for _ in range(settings.max_tokens):
        longer = {}
        for reply_so_far, chance in chances.items():
            history = prompt + list(reply_so_far)
            probs = sampler.probabilities(model.logits(history)[-1], history)
            for token in torch.nonzero(probs).flatten().tolist():
                longer[(*reply_so_far, token)] = chance * float(probs[token])
        chances = longer
    return chances


def test_sampled_replies_keep_their_distribution():
    """Speculative sampling draws replies from the distribution plain sampling draws from:
    a chi-square test over every 3-token reply, with refused drafts included."""
    model = Llama.random(tiny_args(), seed=0)
    prompt = PHRASE[:6] * 2
    expected = exact_reply_distribution(model, prompt, SAMPLED)
    # The draft: the model with noise added to every weight, so that it agrees in part.
    draft_model = Llama.random(tiny_args(), seed=0)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for weight in draft_model.transformer.parameters():
            weight.add_(0.5 * weight.std() * torch.randn(weight.shape, generator=generator))
    # The test can fail: the draft's own replies are far from the model's.
    draft_replies = exact_reply_distribution(draft_model, prompt, SAMPLED)
    overlap = sum(min(p, draft_replies.get(key, 0.0)) for key, p in expected.items())
    assert overlap < 0.8, overlap
    speculation = Speculation(draft=DraftModel(draft_model), draft_length=DraftLength(2))
    samples, counts = 1500, {}
    drafted = accepted = 0
    cache = model.new_cache(64)
    for seed in range(samples):
        settings = dataclasses.replace(SAMPLED, seed=seed)
        generation = reply(model, settings, speculation, prompt=prompt, cache=cache)
        counts[tuple(generation.tokens)] = counts.get(tuple(generation.tokens), 0) + 1
        drafted += generation.stats.drafted_tokens
        accepted += generation.stats.accepted_tokens
    assert (drafted, 0 < accepted < drafted) == (samples, True), accepted  # a draft each, some kept, some refused
    assert chi_square_p_value(counts, expected, samples) > 1e-3


@pytest.mark.parametrize("drafter", ["draft model", "lookup"])
def test_the_acceptance_rule_draws_from_the_model_distribution(drafter):
    """One position, many draws: the kept-or-replaced token follows p whatever drafted it
    (a draft model drawing from q, or prompt lookup proposing token 3 for certain)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    sampler = Sampler(SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3))
    logits = torch.log(p).repeat(2, 1)
    counts = dict.fromkeys(range(4), 0)
    generator = torch.Generator().manual_seed(4)
    for _ in range(4000):
        if drafter == "draft model":
            token = int(torch.multinomial(q, 1, generator=generator))
            kept, chosen = accept(Draft([token], [q]), logits, sampler, [])
        else:
            token = 3
            kept, chosen = accept(Draft([token]), logits, sampler, [])
        counts[token if kept else chosen] += 1
    expected = {token: float(p[token]) for token in range(4)}
    assert chi_square_p_value(counts, expected, 4000) > 1e-3
    # Keeping every draft would follow q, or always give 3.
    naive = {token: float(q[token]) for token in range(4)} if drafter == "draft model" else {3: 1.0}
    assert chi_square_p_value(counts, naive, 4000) < 1e-6


@pytest.mark.parametrize("pair", list(itertools.product([0.0, 1.0], repeat=2)))
def test_greedy_acceptance_keeps_a_draft_only_when_it_is_the_model_choice(pair):
    first, second = pair
    logits = torch.tensor([[first, 1 - first], [second, 1 - second]])
    kept, chosen = accept(Draft([0]), logits, Sampler(SamplingSettings(temperature=0)), [])
    assert (kept, chosen) == ((1, int(second < 0.5)) if first > 0.5 else (0, 1))
