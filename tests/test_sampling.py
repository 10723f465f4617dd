import math

import pytest
import torch

from llama_chat.engine.sampling import (
    Sampler,
    SamplingSettings,
    apply_repeat_penalty,
    min_p_filter,
    top_p_filter,
)
from llama_chat.errors import SettingError

# Probabilities 0.5, 0.3, 0.15, 0.05 in a shuffled order.
PROBS = torch.tensor([0.15, 0.5, 0.05, 0.3])
LOGITS = PROBS.log()


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


def test_greedy_is_argmax():
    generator = torch.Generator().manual_seed(0)
    sampler = Sampler(SamplingSettings(temperature=0))
    for _ in range(20):
        logits = torch.randn(1000, generator=generator)
        assert sampler(logits) == int(logits.argmax())


def top_k_kept(k: int) -> set[int]:
    """The tokens a sampler with top-k alone may draw."""
    sampler = Sampler(SamplingSettings(temperature=1.0, top_k=k, top_p=1.0, min_p=0.0))
    return set(torch.nonzero(sampler.probabilities(LOGITS)).flatten().tolist())


def test_top_k_keeps_the_k_best():
    assert top_k_kept(2) == {1, 3}
    assert top_k_kept(0) == {0, 1, 2, 3}


@pytest.mark.parametrize("p, expected", [(0.5, {1}), (0.79, {1, 3}), (0.81, {0, 1, 3}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    assert kept(top_p_filter(LOGITS, p)) == expected


@pytest.mark.parametrize("min_p, expected", [(0.0, {0, 1, 2, 3}), (0.2, {0, 1, 3}), (0.5, {1, 3}), (0.7, {1})])
def test_min_p_keeps_tokens_near_the_best(min_p, expected):
    assert kept(min_p_filter(LOGITS, min_p)) == expected


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([2.0, -2.0, 1.0, 3.0])
    penalised = apply_repeat_penalty(logits, [0, 1, 1], 2.0)
    assert penalised.tolist() == [1.0, -4.0, 1.0, 3.0]
    assert logits.tolist() == [2.0, -2.0, 1.0, 3.0]  # input untouched


def test_repeat_penalty_only_looks_at_the_recent_window():
    logits = torch.tensor([5.0, 4.9])
    sampler = Sampler(SamplingSettings(temperature=0, repeat_penalty=2.0, repeat_last_n=2))
    assert sampler(logits, history=[0, 1, 1]) == 0  # token 0 is outside the window
    assert sampler(logits, history=[1, 0, 0]) == 1  # only token 0 is in the window


def test_same_seed_same_tokens_and_other_seed_other_tokens():
    logits = torch.zeros(50)

    def draws(seed):
        sampler = Sampler(SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        return [sampler(logits) for _ in range(30)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_draws_follow_the_filtered_distribution():
    settings = SamplingSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=1)
    sampler = Sampler(settings)
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[sampler(LOGITS)] += 1
    assert counts[2] == 0  # outside the top 3
    expected = torch.tensor([0.15, 0.5, 0.0, 0.3]) / 0.95
    assert torch.allclose(counts / 4000, expected, atol=0.03)


def test_temperature_sharpens_the_distribution():
    cold = Sampler(SamplingSettings(temperature=0.1, top_k=0, top_p=1.0, min_p=0.0, seed=3))
    picks = [cold(LOGITS) for _ in range(200)]
    assert picks.count(1) > 195  # 0.5 vs 0.3 becomes about 0.994 at T=0.1
    assert math.isclose(0.5**10 / (0.5**10 + 0.3**10 + 0.15**10 + 0.05**10), 0.994, abs_tol=1e-3)


@pytest.mark.parametrize(
    "setting",
    [
        dict(temperature=-0.1),
        dict(top_k=-1),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(min_p=-0.1),
        dict(min_p=1.0),
        dict(repeat_penalty=0.0),
        dict(repeat_last_n=-1),
        dict(seed=-5),
        dict(seed=2**63),
        dict(max_tokens=0),
    ],
)
def test_invalid_settings_are_refused(setting):
    with pytest.raises(SettingError):
        SamplingSettings(**setting)
