"""Choosing the next token: the sampling settings, the small pure functions that turn logits
into a token, and the decode steps that use them (from the token just chosen to the next).

Order of application, as in Hugging Face transformers: repetition penalty,
temperature, top-k, top-p, min-p, then a draw (or argmax when temperature is 0).
Filters return logits with the removed tokens set to -inf.

The plain step feeds the last token and samples the next. The speculative step (where
something drafts, see engine/speculation) feeds the last token and the drafts in one verify
step, and `accept` keeps the drafts the model would have chosen itself.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.engine.processors import LogitsProcessor
from llama_chat.engine.speculation import Draft, PromptLookup, Speculation
from llama_chat.errors import SettingError

if TYPE_CHECKING:
    from llama_chat.engine.runners import Runner


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is chosen. Invalid values raise SettingError on construction."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        # Types first (a hand-edited saved file may hold 2.5 tokens or "hot"); bool is no number.
        for field in dataclasses.fields(self):  # annotations are strings here: "int", "float", "int | None"
            value = getattr(self, field.name)
            if value is None and field.type.endswith("| None"):
                continue
            whole = field.type.startswith("int")
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                raise SettingError(f"{field.name} must be {'a whole number' if whole else 'a number'}, not {value!r}")
        checks = [
            (self.temperature >= 0, "temperature must be 0 (greedy) or more"),
            (self.top_k >= 0, "top_k must be 0 (off) or a positive number of tokens"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]; 1 turns it off"),
            (0 <= self.min_p < 1, "min_p must be in [0, 1); 0 turns it off"),
            (self.repeat_penalty > 0, "repeat_penalty must be positive; 1 turns it off"),
            (self.repeat_last_n >= 0, "repeat_last_n must be 0 or more"),
            # torch's generators take seeds below 2**64; a saved conversation keeps them below 2**63
            (self.seed is None or 0 <= self.seed < 2**63, "seed must be a whole number from 0 to 2**63 - 1"),
            (self.max_tokens > 0, "max_tokens must be a positive number of tokens"),
        ]
        for passed, message in checks:
            if not passed:
                raise SettingError(message)


# The numeric settings as people see them: a placeholder for the value and a line of help,
# shared by the command-line flags and the chat's slash commands.
SETTING_HELP = {
    "temperature": ("T", "randomness: 0 always picks the likeliest token"),
    "top_k": ("K", "sample among the K likeliest tokens (0: off)"),
    "top_p": ("P", "sample among the likeliest tokens holding probability P (1: off)"),
    "min_p": ("P", "drop tokens less than P times as likely as the likeliest (0: off)"),
    "repeat_penalty": ("R", "make recently seen tokens less likely (1: off)"),
    "repeat_last_n": ("N", "how many recent tokens the repeat penalty looks at"),
    "max_tokens": ("N", "the longest reply, in tokens"),
}


def apply_repeat_penalty(logits: torch.Tensor, recent_ids: Sequence[int], penalty: float) -> torch.Tensor:
    """Make recently seen tokens less likely: positive logits divided, negative multiplied."""
    if penalty == 1.0 or not recent_ids:
        return logits
    ids = torch.tensor(sorted(set(recent_ids)), dtype=torch.long, device=logits.device)
    seen = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability adds up to at least p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= p  # the most likely token always has mass_before 0
    drop = torch.empty_like(drop_sorted).scatter_(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens at least min_p times as likely as the most likely one."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


class Sampler:
    """Chooses next tokens under fixed settings, drawing from its own seeded generator."""

    def __init__(self, settings: SamplingSettings) -> None:
        self.settings = settings
        seed = settings.seed if settings.seed is not None else random.SystemRandom().randrange(2**63)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = ()) -> int:
        """The next token id given 1-D float logits and the ids that came before."""
        logits, candidates = self._filtered(logits, history)
        if self.settings.temperature == 0:
            return int(torch.argmax(logits))
        choice = self.draw(torch.softmax(logits, dim=-1))
        return int(candidates[choice]) if candidates is not None else choice

    def probabilities(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        """The distribution [vocab] the next token is drawn from (at temperature 0, all of it
        on the likeliest token): what a speculative step weighs drafts by."""
        filtered, candidates = self._filtered(logits, history)
        if self.settings.temperature == 0:
            return torch.zeros(logits.numel()).index_fill_(0, torch.argmax(filtered), 1.0)
        probs = torch.softmax(filtered, dim=-1)
        if candidates is None:
            return probs
        return torch.zeros(logits.numel()).index_put_((candidates,), probs)

    def draw(self, probs: torch.Tensor) -> int:
        """An index drawn from probs (which need not add up to 1) with this sampler's generator."""
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        """A number drawn uniformly from [0, 1) with this sampler's generator."""
        return float(torch.rand(1, generator=self.generator))

    def _filtered(self, logits: torch.Tensor, history: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits after the penalty, and at a positive temperature after the scaling and the
        filters too; with top-k, only the k best, whose ids come second (else None)."""
        s = self.settings
        logits = logits.detach().float().cpu()
        if s.repeat_last_n:
            logits = apply_repeat_penalty(logits, history[-s.repeat_last_n :], s.repeat_penalty)
        if s.temperature == 0:
            return logits, None
        candidates = None
        if 0 < s.top_k < logits.numel():
            # Work on the k best only: the other filters and the draw then touch k values.
            logits, candidates = torch.topk(logits, s.top_k)
        logits = apply_temperature(logits, s.temperature)
        return min_p_filter(top_p_filter(logits, s.top_p), s.min_p), candidates


@dataclass(frozen=True)
class StepResult:
    """What a step gives: the drafts the model kept, then the token it chose after them."""

    token: int
    kept: list[int] = dataclasses.field(default_factory=list)
    drafted: int = 0  # drafts the model weighed


class DecodeStep(Protocol):
    def __call__(self, token: int, history: Sequence[int], remaining: int) -> StepResult:
        """Feed `token` (history is everything before it) and choose what follows; at most
        `remaining` tokens may come before the chosen one."""


class PlainStep:
    """Feeds the last token and chooses the next from the model's logits, as the reply's
    processor allows."""

    def __init__(self, runner: Runner, cache: KVCache, sampler: Sampler, processor: LogitsProcessor) -> None:
        self.runner = runner
        self.cache = cache
        self.sampler = sampler
        self.processor = processor

    def choose(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        return self.sampler(self.processor.mask(logits), history)

    def __call__(self, token: int, history: Sequence[int], remaining: int = 0) -> StepResult:
        return StepResult(self.choose(self.runner(self.cache, [token]), history))


def accept(
    drafted: Draft, logits: torch.Tensor, sampler: Sampler, history: Sequence[int],
    mask: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
) -> tuple[int, int]:
    """How many drafts the model keeps, and the token it chooses after them (in place of the
    first refused draft, or after the last one). logits [len(drafts) + 1, vocab] are the
    verify step's, row i after the i-th draft; history is everything before the drafts.
    `mask(row logits, i)`, given, forbids tokens (a format's); rows are asked for in order."""
    greedy = sampler.settings.temperature == 0
    context = list(history)

    def row(index: int) -> torch.Tensor:
        return logits[index] if mask is None else mask(logits[index], index)

    for index, token in enumerate(drafted.tokens):
        if greedy:
            chosen = sampler(row(index), context)
            if chosen != token:
                return index, chosen
        else:
            p = sampler.probabilities(row(index), context)
            q = drafted.probabilities[index] if drafted.probabilities is not None else None
            drafted_with = 1.0 if q is None else float(q[token])
            if sampler.uniform() * drafted_with >= float(p[token]):  # refused: min(1, p/q) not met
                residual = p.clone()
                if q is None:
                    residual[token] = 0.0
                else:
                    residual = (p - q).clamp_(min=0.0)
                return index, sampler.draw(residual if float(residual.sum()) > 0 else p)
        context.append(token)
    return len(drafted.tokens), sampler(row(len(drafted.tokens)), context)


class SpeculativeStep:
    """A decode step that drafts: the tokens the processor forces, else as many of the
    drafter's guesses as the planner finds pay. The last token and the drafts go through
    one verify step, and `accept` keeps what the model would have chosen itself; with
    nothing drafted, it is the plain step."""

    def __init__(self, plain: PlainStep, speculation: Speculation | None) -> None:
        self.plain = plain
        self.draft_model = speculation.draft if speculation is not None else None
        self.planner = speculation.planner(plain.runner) if speculation is not None else None
        self.lookup = PromptLookup()
        # A draft model draws from a generator of its own, with the same settings.
        self.draft_sampler = None
        if self.draft_model is not None:
            settings = plain.sampler.settings
            draft_seed = None if settings.seed is None else settings.seed + 1
            self.draft_sampler = Sampler(dataclasses.replace(settings, seed=draft_seed))

    def __call__(self, token: int, history: Sequence[int], remaining: int) -> StepResult:
        started = time.perf_counter()
        cache = self.plain.cache
        if cache.max_rollback() is not None:  # refused drafts must be taken back exactly
            remaining = min(remaining, cache.max_rollback())
        # What the format forces next (a JSON key, its quotes) is drafted first: the verify
        # step then keeps the model's own choices, one step for the lot.
        drafted = Draft(self.plain.processor.forced()[:remaining])
        forced = bool(drafted.tokens)
        if not forced and self.planner is not None:
            drafted = self._guess(history, remaining)
        if not drafted.tokens:
            chosen = self.plain(token, history)
            if self.planner is not None:
                self.planner.record_round(False, time.perf_counter() - started, 1)
            return chosen
        start = len(cache)
        verified = self.plain.runner(cache, [token, *drafted.tokens], every_logits=True)
        kept, chosen = accept(drafted, verified, self.plain.sampler, history, self._verify_masks(drafted))
        cache.trim(start + 1 + kept)  # the refused drafts' keys and values go
        if not forced:  # the planner weighs the drafters' guesses, not the format's
            self.planner.record(len(drafted.tokens), kept)
            self.planner.record_round(True, time.perf_counter() - started, kept + 1)
        return StepResult(chosen, drafted.tokens[:kept], len(drafted.tokens))

    def _guess(self, history: Sequence[int], remaining: int) -> Draft:
        """The drafter's guesses, as many as pay and fit, up to the first a processor refuses:
        one the model could never keep. Drafts drawn from a distribution stay whole: their
        refusal by the sampling rule, and the draw that replaces them, keep replies
        distributed as without drafts."""
        seconds = 0.0 if self.draft_model is None else self.draft_model.seconds_a_token
        count = min(self.planner.length(seconds), remaining)
        if count <= 0:
            return Draft([])
        if self.draft_model is None:
            drafted = self.lookup.propose(history, count)
        else:
            drafted = self.draft_model.propose(history, count, self.draft_sampler, self.plain.cache.capacity)
        if not drafted.tokens or drafted.probabilities is not None:
            return drafted
        return Draft(drafted.tokens[: self.plain.processor.allowed_prefix(drafted.tokens)])

    def _verify_masks(self, drafted: Draft) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """Masks for the verify step's rows in order, row i after the first i drafts: the
        processor takes each draft only when the model has kept it, so nothing is taken back."""
        processor = self.plain.processor
        taken = 0

        def masked(logits: torch.Tensor, row: int) -> torch.Tensor:
            nonlocal taken
            for draft in drafted.tokens[taken:row]:
                processor.advance(draft)
            taken = row
            return processor.mask(logits)

        return masked
