"""Logits processors (engine/processors.py): the rule a reply follows, passed to the decode
loop, with and without speculation."""

from collections import Counter

import pytest
import torch

from llama_chat import Llama, SamplingSettings
from llama_chat.engine.processors import LogitsProcessor
from llama_chat.engine.speculation import Speculation
from llama_chat.options import DraftLength

from .conftest import tiny_args

PHRASE = [(i * 7) % 50 + 3 for i in range(40)]
PROMPT = PHRASE * 2  # repeats itself: prompt lookup finds drafts


class Ban(LogitsProcessor):
    """Never this token: a processor with a mask and nothing more."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.taken: list[int] = []

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[self.token] = float("-inf")
        return logits

    def advance(self, token: int) -> None:
        self.taken.append(token)


class Forcing(LogitsProcessor):
    """Forces these tokens next, allows `allowed` of any drafts, and finishes when told."""

    def __init__(self, forced=(), allowed=None, finished=False, extra_tokens=0) -> None:
        self._forced, self._allowed, self._finished = list(forced), allowed, finished
        self.extra_tokens = extra_tokens

    def forced(self) -> list[int]:
        return self._forced

    def allowed_prefix(self, tokens) -> int:
        return len(tokens) if self._allowed is None else min(self._allowed, len(tokens))

    @property
    def finished(self) -> bool:
        return self._finished


@pytest.fixture(scope="module")
def model():
    return Llama.random(tiny_args(), seed=0)


def reply(model, settings, processor=None, speculation=None):
    generation = model.generate(PROMPT, settings, stop_ids=(), speculation=speculation, processor=processor)
    list(generation)
    return generation


@pytest.mark.parametrize("speculation", [None, Speculation(lookup=DraftLength(4))], ids=["plain", "lookup"])
def test_a_processor_passed_to_the_loop_is_obeyed(model, speculation):
    settings = SamplingSettings(temperature=0, max_tokens=40)
    free = reply(model, settings, speculation=speculation)
    banned = Counter(free.tokens).most_common(1)[0][0]
    ban = Ban(banned)
    held = reply(model, settings, ban, speculation)
    assert banned not in held.tokens and len(held.tokens) == 40
    assert ban.taken == held.tokens  # it followed every token, drafts kept included
    if speculation is not None:
        assert held.stats.accepted_tokens > 0
        assert held.tokens == reply(model, settings, Ban(banned)).tokens  # the same reply as without drafts


def test_a_sampled_reply_obeys_a_processor_with_speculation(model):
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_tokens=40)
    free = reply(model, settings)
    banned = Counter(free.tokens).most_common(1)[0][0]
    for speculation in (None, Speculation(lookup=DraftLength(4))):
        held = reply(model, settings, Ban(banned), speculation)
        assert banned not in held.tokens and len(held.tokens) == 40


def test_a_processor_has_no_say_where_it_does_not_override():
    """What a reply with no rule runs with: nothing masked, forced, refused or finished."""
    nothing = LogitsProcessor()
    logits = torch.tensor([0.5, -1.0, 2.0])
    assert torch.equal(nothing.mask(logits), logits)
    assert nothing.forced() == [] and nothing.allowed_prefix([1, 2]) == 2
    assert not nothing.finished and nothing.extra_tokens == 0
    ban = Ban(1)
    ban.advance(3)
    assert ban.taken == [3] and ban.forced() == [] and ban.allowed_prefix([1, 2, 3]) == 3
    assert Forcing(forced=[5, 6, 7]).forced() == [5, 6, 7] and Forcing(allowed=2).allowed_prefix([1, 2, 3]) == 2


def test_a_reply_without_a_processor_is_the_one_with_a_processor_of_no_say(model):
    settings = SamplingSettings(temperature=0, max_tokens=20)
    free = reply(model, settings)
    assert not free.constrained and free.tokens == reply(model, settings, LogitsProcessor()).tokens


def test_the_loop_ends_when_a_processor_is_finished(model):
    generation = reply(model, SamplingSettings(temperature=0, max_tokens=40), Forcing(finished=True))
    assert len(generation.tokens) == 1 and generation.stats.stop_reason == "format_complete"
