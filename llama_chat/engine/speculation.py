"""Speculative decoding: tokens drafted cheaply, checked by one verify step of the model.

A drafter guesses the tokens that come next: `PromptLookup` proposes what followed the
latest earlier occurrence of the last few tokens in the conversation, `DraftModel` a
smaller model's own choices. The model then runs the last token and the drafts in one
step, which reads its weights once for all of them, and `accept` keeps the drafts the
model would have produced itself:
- at temperature 0, a draft is kept while it is the model's own choice, so replies are
  those without drafts;
- when sampling, by the speculative-sampling rule: a draft d drafted with probability
  q(d) is kept with probability min(1, p(d)/q(d)), and the first one refused is replaced
  by a draw from the normalised max(0, p - q), so replies are distributed as without
  drafts. p and q come from the same Sampler settings (penalty, temperature, filters).
The refused draft and everything after it are taken back from the cache.

How many tokens to draft is chosen by measurement (`DraftPlanner`): the expected tokens
a verify step yields, from the acceptance seen so far, against what steps of that many
tokens have cost on this machine; where no length pays, nothing is drafted.

The decode step that puts these together, `SpeculativeStep`, and `accept`, the rule that
keeps drafts, are in engine/sampling beside the plain step: the tokens a reply's processor
forces (a format's) are its first drafts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.errors import UsageError
from llama_chat.options import DraftLength

MOST_DRAFTED = 8  # tokens drafted at most by default: a verify step of 9
NGRAM_SIZES = (3, 2)  # the tail lengths prompt lookup matches, longest first
GAIN_MARGIN = 1.1  # drafting must promise this much more speed than single steps
# Before a multi-token step has been timed: its cost per extra token, against one token's
# step (measured 0.2-0.35 on the integer kernels), so that a first verify step is tried.
PRIOR_SLOPE = 0.3
ACCEPTANCE_WINDOW = 24  # drafts and refusals that acceptance is estimated over, about
RATE_MEMORY = 0.95  # the weight of earlier rounds in the seconds a token, per round
MIN_RATE_TOKENS = 8  # tokens each kind of round must have given before their rates are compared
RETRY_AFTER = 32  # after this many decisions in a row to draft nothing, one draft is tried


@dataclass
class Draft:
    """Tokens guessed to come next, and the distribution each was drawn from (None: drafted
    with certainty, as prompt lookup does)."""

    tokens: list[int]
    probabilities: list[torch.Tensor] | None = None


class PromptLookup:
    """Drafts what followed the latest earlier occurrence of the conversation's last few
    tokens. Built once per reply; the conversation only grows while it is in use."""

    def __init__(self) -> None:
        self._latest: dict[tuple[int, ...], int] = {}  # an n-gram -> where it last ended
        self._indexed = 0  # n-grams ending before this position are indexed

    def propose(self, history: Sequence[int], limit: int) -> Draft:
        # Index every n-gram that ends before the last position: the tail's own occurrence
        # must not match itself.
        end = len(history)
        for stop in range(max(self._indexed, 1), end):
            for size in NGRAM_SIZES:
                if stop >= size:
                    self._latest[tuple(history[stop - size : stop])] = stop
        self._indexed = max(self._indexed, end)
        for size in NGRAM_SIZES:
            found = self._latest.get(tuple(history[end - size :])) if end >= size else None
            if found is not None:
                return Draft(list(history[found : found + limit]))
        return Draft([])


class DraftModel:
    """A smaller model sharing the target's vocabulary, with a KV cache of its own that
    follows the conversation: each proposal first feeds it what it has not seen."""

    def __init__(self, model, path: str = "") -> None:
        self.model = model
        self.path = path
        self.cache: KVCache | None = None
        self.seconds_a_token = 0.0  # its single steps, measured

    def propose(self, history: Sequence[int], limit: int, sampler, capacity: int) -> Draft:
        """Up to `limit` tokens drawn by `sampler` (engine/sampling's, the reply's settings
        with a generator of its own), with the distributions they were drawn from when sampling."""
        if self.cache is None or self.cache.capacity != capacity:
            self.cache = self.model.new_cache(capacity)
        kept = self.cache.keep_common_prefix(history, at_most=len(history) - 1)
        logits = self.model.runner(self.cache, history[kept:])
        greedy = sampler.settings.temperature == 0
        tokens, distributions = [], []
        started = time.perf_counter()
        for index in range(limit):
            if greedy:
                tokens.append(sampler(logits, [*history, *tokens]))
            else:
                distributions.append(sampler.probabilities(logits, [*history, *tokens]))
                tokens.append(sampler.draw(distributions[-1]))
            if index + 1 < limit and self.cache.remaining() > 0:
                logits = self.model.runner(self.cache, tokens[-1:])
        if limit > 1:
            self.seconds_a_token = (time.perf_counter() - started) / limit
        return Draft(tokens, None if greedy else distributions)


def check_same_vocabulary(target, draft) -> None:
    """Refuse, in one line, a draft model whose tokens are not the target's."""
    ours, theirs = target.tokenizer, draft.tokenizer
    if ours.vocab_size != theirs.vocab_size or target.args.vocab_size != draft.args.vocab_size:
        raise UsageError(
            f"the draft model has {draft.args.vocab_size} tokens and the model {target.args.vocab_size}: "
            "a draft model must share the model's vocabulary"
        )
    for token in range(ours.vocab_size):
        mine, other = ours.decode([token]), theirs.decode([token])
        if mine != other:
            raise UsageError(
                f"token {token} is {other!r} for the draft model and {mine!r} for the model: "
                "a draft model must share the model's vocabulary"
            )


@dataclass
class Acceptance:
    """How often drafts are kept, as a chain: each draft kept with probability `alpha` while
    the ones before it were. Counted from kept drafts and refusals, starting from one of
    each, over a window of about the last WINDOW of them so that it follows a conversation
    from one kind of reply to another. Beside it, the seconds a token that rounds with and
    without drafts have taken, all costs included: what auto finally goes by."""

    kept: float = 1.0
    refused: float = 1.0
    seconds: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    tokens: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})

    def record(self, drafted: int, kept: int) -> None:
        self.kept += kept
        self.refused += kept < drafted
        total = self.kept + self.refused
        if total > ACCEPTANCE_WINDOW:
            self.kept, self.refused = self.kept * ACCEPTANCE_WINDOW / total, self.refused * ACCEPTANCE_WINDOW / total

    def record_round(self, drafted: bool, seconds: float, tokens: int) -> None:
        """A round (a single step, or drafting and a verify step) took `seconds` for `tokens`."""
        self.seconds[drafted] = RATE_MEMORY * self.seconds[drafted] + seconds
        self.tokens[drafted] = RATE_MEMORY * self.tokens[drafted] + tokens

    def drafting_is_slower(self) -> bool:
        """Whether rounds with drafts have lately cost more a token than rounds without."""
        if min(self.tokens.values()) < MIN_RATE_TOKENS:
            return False
        return self.seconds[True] / self.tokens[True] > self.seconds[False] / self.tokens[False]

    @property
    def alpha(self) -> float:
        return self.kept / (self.kept + self.refused)


class DraftPlanner:
    """Chooses how many tokens to draft from the acceptance seen so far in the conversation
    and the measured cost of the model's calls by size (`runner.seconds`, kept by the
    runner)."""

    def __init__(self, limit: int, automatic: bool, runner, acceptance: Acceptance | None = None) -> None:
        self.limit = limit
        self.automatic = automatic
        self.runner = runner
        self.acceptance = acceptance or Acceptance()
        self.declined = 0  # decisions in a row to draft nothing

    def record(self, drafted: int, kept: int) -> None:
        self.acceptance.record(drafted, kept)

    def record_round(self, drafted: bool, seconds: float, tokens: int) -> None:
        self.acceptance.record_round(drafted, seconds, tokens)

    def length(self, draft_seconds_a_token: float = 0.0) -> int:
        """Tokens to draft now: the limit when forced, else the length that promises the most
        tokens a second (0 where none beats single steps by the margin)."""
        if not self.automatic:
            return self.limit
        seconds = self.runner.seconds  # as measured so far, this reply's calls included
        single = seconds.get(1)
        if single is None:
            return 0
        alpha = self.acceptance.alpha
        # Each extra token's cost, from every size timed: their median, which one step slowed
        # by the machine's other work does not move.
        wider = [(cost - single) / (rows - 1) for rows, cost in seconds.items() if rows > 1]
        slope = max(0.0, statistics.median(wider)) if wider else PRIOR_SLOPE * single
        best, best_rate = 0, GAIN_MARGIN / single
        if self.acceptance.drafting_is_slower():
            best_rate = float("inf")  # what the costs promise, the rounds did not deliver
        for count in range(1, self.limit + 1):
            expected = (1 - alpha ** (count + 1)) / (1 - alpha)  # tokens a verify step of count drafts yields
            rate = expected / (single + slope * count + draft_seconds_a_token * count)
            if rate > best_rate:
                best, best_rate = count, rate
        self.declined = self.declined + 1 if best == 0 else 0
        if self.declined == RETRY_AFTER:  # measure again now and then: the machine's load changes
            self.declined = 0
            return 1
        return best


@dataclass
class Speculation:
    """How a reply drafts: with a draft model when there is one, else by prompt lookup.
    `lookup` and `draft_length` say how many tokens each drafts."""

    lookup: DraftLength = field(default_factory=DraftLength)
    draft: DraftModel | None = None
    draft_length: DraftLength = field(default_factory=DraftLength)
    acceptance: Acceptance = field(default_factory=Acceptance)  # over the conversation's replies

    def planner(self, runner) -> DraftPlanner | None:
        """A planner for one reply, None when nothing is drafted."""
        length = self.lookup if self.draft is None else self.draft_length
        if length.off:
            return None
        most = MOST_DRAFTED if length.automatic else length.most
        return DraftPlanner(most, length.automatic, runner, self.acceptance)
