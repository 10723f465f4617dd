"""Streaming generation: reuse the cached prefix, prefill the rest, then decode token by token."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.engine.sampling import Sampler, SamplingSettings
from llama_chat.engine.speculation import Draft, PromptLookup, Speculation, accept
from llama_chat.errors import ContextOverflowError
from llama_chat.text.detokenizer import StreamingDetokenizer
from llama_chat.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # the grammar engine loads only when a reply has a format
    from llama_chat.engine.constraint import Constraint


# A formatted reply still open at max_tokens goes on closing what is open (its strings,
# arrays and objects), up to this many tokens more, so that it parses; it turns to closing
# this many tokens before the budget's end (a quarter of it for short budgets).
CLOSING_TOKENS = 64


def closing_from(max_tokens: int) -> int:
    """The token of a formatted reply from which it closes what is open."""
    return max_tokens - min(CLOSING_TOKENS, max(8, max_tokens // 4))


@dataclass(frozen=True)
class Piece:
    """One generated token and the text it completes ("" while a character is partial).

    The last piece of a reply may carry text held back until the end (token_id None).
    """

    token_id: int | None
    text: str


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose keys/values were already cached
    prefill_seconds: float = 0.0
    time_to_first_token: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0  # from the first generated token to the last
    stop_reason: str = ""  # stop_token, stop_string, format_complete, max_tokens, context_full, interrupted
    drafted_tokens: int = 0  # tokens proposed by speculation (prompt lookup or a draft model)
    accepted_tokens: int = 0  # of those, the ones the model kept
    constraint_seconds: float = 0.0  # spent on a format's masks and draft checks
    constraint_masks: int = 0  # masks computed: one a sampled token

    @property
    def constraint_seconds_per_token(self) -> float:
        return self.constraint_seconds / self.constraint_masks if self.constraint_masks else 0.0

    @property
    def constraint_share(self) -> float:
        """The format's time against a decode step's (what a token takes, the format's share included)."""
        rate = self.decode_tokens_per_second
        return self.constraint_seconds_per_token * rate if rate else 0.0

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefilled_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        decoded = self.generated_tokens - 1  # the first token comes out of the prefill
        return decoded / self.decode_seconds if decoded > 0 and self.decode_seconds else 0.0


class StopStrings:
    """Holds back text that might be the start of a stop string; cuts at the first match."""

    def __init__(self, stop_strings: Iterable[str]) -> None:
        self.stop_strings = [s for s in stop_strings if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text that is safe to show now, and whether a stop string was reached."""
        self.pending += text
        matches = [i for i in (self.pending.find(s) for s in self.stop_strings) if i >= 0]
        if matches:
            safe, self.pending = self.pending[: min(matches)], ""
            return safe, True
        held = max((self._partial_match(s) for s in self.stop_strings), default=0)
        cut = len(self.pending) - held
        safe, self.pending = self.pending[:cut], self.pending[cut:]
        return safe, False

    def _partial_match(self, stop: str) -> int:
        for length in range(min(len(stop) - 1, len(self.pending)), 0, -1):
            if self.pending.endswith(stop[:length]):
                return length
        return 0

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest


class Generation:
    """An iterable of Pieces for one reply; `stats`, `tokens` and `text` fill in as it runs.

    The cache's token list always matches what its buffers hold, so a caller may stop
    iterating at any point (Ctrl-C) and the cache remains valid for the next turn: the
    last sampled token is only fed in when the next one is wanted.
    """

    def __init__(
        self,
        runner,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        settings: SamplingSettings,
        cache: KVCache,
        stop_ids: Iterable[int],
        stop_strings: Iterable[str] = (),
        speculation: Speculation | None = None,
        constraint: Constraint | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("generation needs at least one prompt token")
        if len(prompt_ids) >= cache.capacity:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {cache.capacity}: "
                "shorten it or raise --ctx-size"
            )
        self.runner = runner  # how the model runs on the cache (see engine/runners)
        self.tokenizer = tokenizer
        self.prompt_ids = list(prompt_ids)
        self.settings = settings
        self.cache = cache
        self.stop_ids = frozenset(stop_ids)
        self.stop_strings = list(stop_strings)
        self.speculation = speculation
        self.constraint = constraint  # the reply's format, if it has one
        # A draft model draws from a generator of its own, with the same settings.
        self.draft_sampler = None
        if speculation is not None and speculation.draft is not None:
            draft_seed = None if settings.seed is None else settings.seed + 1
            self.draft_sampler = Sampler(dataclasses.replace(settings, seed=draft_seed))
        self.stats = GenerationStats(prompt_tokens=len(self.prompt_ids))
        self.tokens: list[int] = []
        self.text = ""

    def __iter__(self) -> Iterator[Piece]:
        started = time.perf_counter()
        self.stats.stop_reason = "interrupted"  # until the loop says otherwise
        logits = self._prefill()
        self.stats.prefill_seconds = time.perf_counter() - started
        detokenizer = StreamingDetokenizer(self.tokenizer)
        stops = StopStrings(self.stop_strings)
        first_token_at = None
        reason = "max_tokens"
        tokens = self._next_tokens(logits, Sampler(self.settings))
        for step in range(self._token_limit()):
            token = next(tokens, None)
            if token is None:
                reason = "format_complete" if self._format_complete() else "context_full"
                break
            now = time.perf_counter()
            if first_token_at is None:
                first_token_at = now
                self.stats.time_to_first_token = now - started
            self.stats.decode_seconds = now - first_token_at
            if token in self.stop_ids:
                reason = "stop_token"
                break
            self.tokens.append(token)
            self.stats.generated_tokens += 1
            text, hit_stop_string = stops.feed(detokenizer.add(token))
            self.text += text
            yield Piece(token, text)
            if hit_stop_string:
                reason = "stop_string"
                break
        if reason == "max_tokens" and self._format_complete():  # with the last token allowed
            reason = "format_complete"
        self.cache.checkpoint()  # where the conversation goes back to when the next exchange is undone
        if self.constraint is not None:
            self.stats.constraint_seconds = self.constraint.seconds
            self.stats.constraint_masks = self.constraint.masks
        self.stats.stop_reason = reason
        if reason != "stop_string":
            rest, _ = stops.feed(detokenizer.flush())
            rest += stops.flush()
            if rest:
                self.text += rest
                yield Piece(None, rest)

    def _next_tokens(self, logits: torch.Tensor, sampler: Sampler) -> Iterator[int]:
        """The reply's tokens in order, each fed to the model only once the next one is wanted
        (ending when the context has no room for it, or the format is complete). With speculation, a token and the
        drafts after it are fed in one verify step, and the drafts the model keeps follow
        without a step of their own."""
        history = list(self.prompt_ids)
        planner = self.speculation.planner(self.runner) if self.speculation is not None else None
        lookup = PromptLookup()
        token = self._sample(sampler, logits, history)
        while True:
            if self.constraint is not None:
                self.constraint.advance(token)
            history.append(token)
            yield token
            if self.cache.room() == 0 or self._format_complete():
                return
            started = time.perf_counter()
            generated = len(history) - len(self.prompt_ids)
            room = min(self._token_limit() - generated - 1, self.cache.room() - 1)
            if self.cache.most_taken_back() is not None:  # refused drafts must be taken back exactly
                room = min(room, self.cache.most_taken_back())
            if self.constraint is not None:  # the last tokens of the budget close what is open
                self.constraint.closing = (generated >= closing_from(self.settings.max_tokens)
                                           or self.cache.room() <= CLOSING_TOKENS)
            # What the format forces next (a JSON key, its quotes) is drafted first: the verify
            # step then keeps the model's own choices, one step for the lot.
            drafted = Draft(self.constraint.forced()[:room]) if self.constraint is not None else Draft([])
            forced = bool(drafted.tokens)
            if not forced and planner is not None:
                count = min(planner.length(self._draft_seconds()), room)
                drafted = self._draft(lookup, history, count) if count > 0 else Draft([])
                if self.constraint is not None and drafted.tokens:
                    drafted = self._within_format(drafted)
            if not drafted.tokens:
                token = self._sample(sampler, self.runner(self.cache, [token]), history)
                if planner is not None:
                    planner.record_round(False, time.perf_counter() - started, 1)
                continue
            start = len(self.cache)
            verified = self.runner(self.cache, [token, *drafted.tokens], every_logits=True)
            masks = None if self.constraint is None else self._verify_masks(drafted)
            kept, token = accept(drafted, verified, sampler, history, masks)
            self.cache.trim(start + 1 + kept)  # the refused drafts' keys and values go
            if not forced:  # the planner weighs the drafters' guesses, not the format's
                planner.record(len(drafted.tokens), kept)
                planner.record_round(True, time.perf_counter() - started, kept + 1)
            self.stats.drafted_tokens += len(drafted.tokens)
            self.stats.accepted_tokens += kept
            for accepted in drafted.tokens[:kept]:
                history.append(accepted)
                yield accepted
            if self._format_complete():  # the format has taken the kept drafts, and no more
                return

    def _token_limit(self) -> int:
        """max_tokens, and for a formatted reply the tokens it may take past them to close."""
        return self.settings.max_tokens + (CLOSING_TOKENS if self.constraint is not None else 0)

    def _format_complete(self) -> bool:
        """Whether the format is complete and allows nothing more: the reply ends there."""
        return self.constraint is not None and self.constraint.finished

    def _sample(self, sampler: Sampler, logits: torch.Tensor, history: list[int]) -> int:
        return sampler(logits if self.constraint is None else self.constraint.mask(logits), history)

    def _within_format(self, drafted: Draft) -> Draft:
        """The drafts up to the first the format refuses: one the model could never keep.
        Drafts drawn from a distribution stay whole: their refusal by the sampling rule,
        and the draw that replaces them, keep replies distributed as without drafts."""
        if drafted.probabilities is not None:
            return drafted
        return Draft(drafted.tokens[: self.constraint.allowed_prefix(drafted.tokens)])

    def _verify_masks(self, drafted: Draft):
        """Masks for the verify step's rows in order, row i after the first i drafts: the
        format takes each draft only when the model has kept it, so nothing is taken back."""
        taken = 0

        def masked(logits: torch.Tensor, row: int) -> torch.Tensor:
            nonlocal taken
            for draft in drafted.tokens[taken:row]:
                self.constraint.advance(draft)
            taken = row
            return self.constraint.mask(logits)

        return masked

    def _draft(self, lookup: PromptLookup, history: list[int], count: int) -> Draft:
        draft_model = self.speculation.draft
        if draft_model is None:
            return lookup.propose(history, count)
        return draft_model.propose(history, count, self.draft_sampler, self.cache.capacity)

    def _draft_seconds(self) -> float:
        draft_model = self.speculation.draft
        return 0.0 if draft_model is None else draft_model.seconds_a_token

    def _prefill(self):
        """Feed the prompt tokens not already cached; return the last position's logits."""
        # The last prompt token must be fed to get logits for what follows it.
        reused = self.cache.keep_common_prefix(self.prompt_ids, at_most=len(self.prompt_ids) - 1)
        self.stats.reused_tokens = reused
        logits = self.runner(self.cache, self.prompt_ids[reused:])
        self.cache.checkpoint()  # where a retried reply starts again
        return logits
