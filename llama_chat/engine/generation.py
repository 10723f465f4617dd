"""Streaming generation: reuse the cached prefix, prefill the rest, then decode token by token."""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.engine.processors import LogitsProcessor
from llama_chat.engine.sampling import DecodeStep, PlainStep, Sampler, SamplingSettings, SpeculativeStep
from llama_chat.engine.speculation import Speculation
from llama_chat.errors import ContextOverflowError
from llama_chat.text.detokenizer import StreamingDetokenizer
from llama_chat.text.held_prefix import HeldPrefix
from llama_chat.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from llama_chat.engine.runners import Runner


class StopReason(enum.StrEnum):
    """How a reply ended. Each is a string, the words people are shown."""

    STOP_TOKEN = "stop_token"
    STOP_STRING = "stop_string"
    FORMAT_COMPLETE = "format_complete"  # its processor allows nothing more
    MAX_TOKENS = "max_tokens"
    CONTEXT_FULL = "context_full"
    INTERRUPTED = "interrupted"  # stopped from outside before it ended (Ctrl-C, an error)


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
    stop_reason: StopReason | None = None  # None until the reply starts
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


class Generation:
    """An iterable of Pieces for one reply; `stats`, `tokens` and `text` fill in as it runs.

    The cache's token list always matches what its buffers hold, so a caller may stop
    iterating at any point (Ctrl-C) and the cache remains valid for the next turn: the
    last sampled token is only fed in when the next one is wanted.
    """

    def __init__(
        self,
        runner: Runner,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        settings: SamplingSettings,
        cache: KVCache,
        stop_ids: Iterable[int],
        stop_strings: Iterable[str] = (),
        speculation: Speculation | None = None,
        processor: LogitsProcessor | None = None,
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
        self.constrained = processor is not None  # the reply follows a rule: its format
        self.processor = processor if processor is not None else LogitsProcessor()  # one with no say
        self.stats = GenerationStats(prompt_tokens=len(self.prompt_ids))
        self.tokens: list[int] = []
        self.text = ""
        self._first_token_at: float | None = None
        self._started_at = 0.0
        self._tokens: _TokenStream | None = None  # from the first piece asked for
        self._handed = 0  # tokens taken from the stream, the stop token included
        self._ended = False
        self._detokenizer: StreamingDetokenizer | None = None  # from the first piece asked for
        self._stops = HeldPrefix(self.stop_strings)  # text that may begin a stop string waits

    def __iter__(self) -> Iterator[Piece]:
        # A plain iterator over next_piece: no generator frame stands between the model
        # call and whoever shows the pieces.
        return iter(self.next_piece, None)

    def next_piece(self) -> Piece | None:
        """The reply's next piece of text (with its token; the last may hold text alone),
        or None once the reply has ended."""
        if self._ended:
            return None
        if self._tokens is None:
            self._start()
        if self._handed >= self._token_limit():
            return self._end(StopReason.MAX_TOKENS)
        token = self._tokens.next()
        if token is None:
            return self._end(StopReason.FORMAT_COMPLETE if self.processor.finished else StopReason.CONTEXT_FULL)
        self._handed += 1
        self._time()
        if token in self.stop_ids:
            return self._end(StopReason.STOP_TOKEN)
        self.tokens.append(token)
        self.stats.generated_tokens += 1
        text, stop = self._stops.feed(self._detokenizer.add(token))
        self.text += text
        if stop is not None:
            self._end(StopReason.STOP_STRING)
        return Piece(token, text)

    def _start(self) -> None:
        self._started_at = time.perf_counter()
        self.stats.stop_reason = StopReason.INTERRUPTED  # until the reply ends otherwise
        self._detokenizer = StreamingDetokenizer(self.tokenizer)
        logits = self._prefill()
        self.stats.prefill_seconds = time.perf_counter() - self._started_at
        self._tokens = _TokenStream(self, logits)

    def _end(self, reason: StopReason) -> Piece | None:
        """Record how the reply ended; the text held back, unless a stop string ended it."""
        self._ended = True
        if reason == StopReason.MAX_TOKENS and self.processor.finished:  # with the last token allowed
            reason = StopReason.FORMAT_COMPLETE
        self.cache.checkpoint()  # where the conversation goes back to when the next exchange is undone
        self.stats.constraint_seconds = self.processor.seconds
        self.stats.constraint_masks = self.processor.masks
        self.stats.stop_reason = reason
        if reason == StopReason.STOP_STRING:
            return None  # nothing after a stop string
        rest, stop = self._stops.feed(self._detokenizer.flush())
        rest += self._stops.release() if stop is None else ""
        if not rest:
            return None
        self.text += rest
        return Piece(None, rest)

    def _decode_step(self, plain: PlainStep) -> DecodeStep:
        """The plain step, unless something drafts: speculation, or a processor that forces tokens."""
        if self.speculation is None and not self.constrained:
            return plain
        return SpeculativeStep(plain, self.speculation)

    def _time(self) -> None:
        """A token has come: the first is timed from the start, the decode from the first on."""
        now = time.perf_counter()
        if self._first_token_at is None:
            self._first_token_at = now
            self.stats.time_to_first_token = now - self._started_at
        self.stats.decode_seconds = now - self._first_token_at

    def _token_limit(self) -> int:
        """max_tokens, and the tokens the processor may take past them to end whole."""
        return self.settings.max_tokens + self.processor.extra_tokens

    def _prefill(self):
        """Feed the prompt tokens not already cached; return the last position's logits."""
        # The last prompt token must be fed to get logits for what follows it.
        reused = self.cache.keep_common_prefix(self.prompt_ids, at_most=len(self.prompt_ids) - 1)
        self.stats.reused_tokens = reused
        logits = self.runner(self.cache, self.prompt_ids[reused:])
        self.cache.checkpoint()  # where a retried reply starts again
        return logits


class _TokenStream:
    """A reply's tokens in order, each fed to the model only once the next one is wanted
    (none once there is no space for it, or the processor allows nothing more). A step gives
    the next token, after the drafts the model kept if it drafted.

    It holds what it needs of its generation, not the generation itself: no reference cycle
    keeps a finished reply's cache alive until the garbage collector runs."""

    def __init__(self, generation: Generation, logits: torch.Tensor) -> None:
        self.processor, self.settings, self.stats = generation.processor, generation.settings, generation.stats
        self.cache = generation.cache
        self.prompt_length = len(generation.prompt_ids)
        self.history = list(generation.prompt_ids)
        plain = PlainStep(generation.runner, generation.cache, Sampler(generation.settings), generation.processor)
        self.step = generation._decode_step(plain)
        self.chosen: int | None = plain.choose(logits, self.history)  # sampled, not yet handed out
        self.kept: collections.deque[int] = collections.deque()  # drafts the last step kept, not yet handed out
        self.stepped = False  # whether `chosen` came from a step (not from the prompt's logits)

    def next(self) -> int | None:
        processor = self.processor
        if not self.kept and self.chosen is None and not self._step():
            return None
        if self.kept:  # the processor took them in the verify step
            token = self.kept.popleft()
        elif self.stepped and processor.finished:  # the format has taken the kept drafts, and no more
            self.chosen = None
            return None
        else:
            token, self.chosen = self.chosen, None
            processor.advance(token)
        self.history.append(token)
        return token

    def _step(self) -> bool:
        """Feed the last token and take the next (and any kept drafts); False when there is
        no space for another token, or the processor has ended the reply."""
        processor = self.processor
        generated = len(self.history) - self.prompt_length
        # Tokens the reply may still take, the one just chosen included: within its token
        # limit, and the positions left in the cache (where that token is fed first).
        limit = self.settings.max_tokens + processor.extra_tokens  # the processor may extend it to end whole
        remaining = min(limit - generated, self.cache.remaining())
        if remaining == 0 or processor.finished:
            return False
        processor.near_end(generated, self.settings.max_tokens, remaining)
        taken = self.step(self.history[-1], self.history, remaining - 1)
        self.stats.drafted_tokens += taken.drafted
        self.stats.accepted_tokens += len(taken.kept)
        self.kept.extend(taken.kept)
        self.chosen, self.stepped = taken.token, True
        return True
