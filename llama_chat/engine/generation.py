"""Streaming generation: reuse the cached prefix, prefill the rest, then decode token by token."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.engine.sampling import Sampler, SamplingSettings
from llama_chat.errors import ContextOverflowError
from llama_chat.text.detokenizer import StreamingDetokenizer
from llama_chat.text.tokenizer import Tokenizer

# Appends ids to a cache and returns the float32 logits after the last one (Llama.feed).
Feed = Callable[[KVCache, Sequence[int]], torch.Tensor]


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
    stop_reason: str = ""  # stop_token, stop_string, max_tokens, context_full, interrupted

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
        feed: Feed,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        settings: SamplingSettings,
        cache: KVCache,
        stop_ids: Iterable[int],
        stop_strings: Iterable[str] = (),
    ) -> None:
        if not prompt_ids:
            raise ValueError("generation needs at least one prompt token")
        if len(prompt_ids) >= cache.capacity:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {cache.capacity}: "
                "shorten it or raise --ctx-size"
            )
        self.feed = feed
        self.tokenizer = tokenizer
        self.prompt_ids = list(prompt_ids)
        self.settings = settings
        self.cache = cache
        self.stop_ids = frozenset(stop_ids)
        self.stop_strings = list(stop_strings)
        self.stats = GenerationStats(prompt_tokens=len(self.prompt_ids))
        self.tokens: list[int] = []
        self.text = ""

    def __iter__(self) -> Iterator[Piece]:
        started = time.perf_counter()
        self.stats.stop_reason = "interrupted"  # until the loop says otherwise
        logits = self._prefill()
        self.stats.prefill_seconds = time.perf_counter() - started
        sampler = Sampler(self.settings)
        detokenizer = StreamingDetokenizer(self.tokenizer)
        stops = StopStrings(self.stop_strings)
        history = list(self.prompt_ids)
        first_token_at = None
        reason = "max_tokens"
        for step in range(self.settings.max_tokens):
            token = sampler(logits, history)
            now = time.perf_counter()
            if first_token_at is None:
                first_token_at = now
                self.stats.time_to_first_token = now - started
            self.stats.decode_seconds = now - first_token_at
            if token in self.stop_ids:
                reason = "stop_token"
                break
            history.append(token)
            self.tokens.append(token)
            self.stats.generated_tokens += 1
            text, hit_stop_string = stops.feed(detokenizer.add(token))
            self.text += text
            yield Piece(token, text)
            if hit_stop_string:
                reason = "stop_string"
                break
            if step + 1 == self.settings.max_tokens:
                break
            if self.cache.room() == 0:
                reason = "context_full"
                break
            logits = self.feed(self.cache, [token])
        self.stats.stop_reason = reason
        if reason != "stop_string":
            rest, _ = stops.feed(detokenizer.flush())
            rest += stops.flush()
            if rest:
                self.text += rest
                yield Piece(None, rest)

    def _prefill(self):
        """Feed the prompt tokens not already cached; return the last position's logits."""
        # The last prompt token must be fed to get logits for what follows it.
        reused = self.cache.keep_common_prefix(self.prompt_ids, at_most=len(self.prompt_ids) - 1)
        self.stats.reused_tokens = reused
        return self.feed(self.cache, self.prompt_ids[reused:])
