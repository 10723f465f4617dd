"""Structured answers: replies held to a JSON schema, a regular expression or a grammar.

The grammar engine is llguidance. It is given the model's vocabulary as the bytes each
token stands for (see Tokenizer.token_bytes), so it works alike for every tokenizer;
that vocabulary is built once per tokenizer. An `AnswerFormat` is what the user asked for;
each reply starts a `Constraint` of its own from it: a logits processor that at every
step says which tokens may come next (the others' logits become -inf before sampling),
follows the tokens taken, drafts what the format forces and checks other drafts. Near
the end of its budget it turns to closing what is open, so that the answer still parses.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import llguidance
import numpy
import torch

from llama_chat.engine.processors import LogitsProcessor
from llama_chat.errors import LlamaChatError
from llama_chat.paths import expanded
from llama_chat.text.tokenizer import Tokenizer

ANY_JSON_OBJECT = '{"type": "object"}'
_SPECIAL = b"\xff"  # how llguidance tells a control token from text
# A formatted reply still open at max_tokens goes on closing what is open (its strings,
# arrays and objects), up to this many tokens more, so that it parses; it turns to closing
# this many tokens before the budget's end (a quarter of it for short budgets).
CLOSING_TOKENS = 64


def closing_from(max_tokens: int) -> int:
    """The token of a formatted reply from which it closes what is open."""
    return max_tokens - min(CLOSING_TOKENS, max(8, max_tokens // 4))


class FormatError(LlamaChatError):
    """A JSON schema, regex or grammar that cannot be read or used (one line)."""


_engine_tokenizers: weakref.WeakKeyDictionary[Tokenizer, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_json_closers: weakref.WeakKeyDictionary[Tokenizer, numpy.ndarray] = weakref.WeakKeyDictionary()


class _Vocabulary:
    """A llama-chat tokenizer as llguidance reads one: every token's bytes, and encoding."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        # Weakly: the engine keeps this object, and the cache of engines is by tokenizer.
        self._tokenizer = weakref.ref(tokenizer)
        self.tokens = []
        self.special_token_ids = []
        # The JSON closers (see json_closers) from the same pass over the vocabulary.
        self.closers = numpy.zeros((3, tokenizer.vocab_size), dtype=numpy.bool_)
        for token in range(tokenizer.vocab_size):
            text = tokenizer.token_bytes(token)
            if text is None:
                self.special_token_ids.append(token)
                text = _SPECIAL + (tokenizer.token_name(token) or f"<{token}>").encode("utf-8")
            elif text and not text.strip(b'",]}'):
                self.closers[:, token] = (text.startswith(b'"') and b"," not in text, b"," not in text, True)
            self.tokens.append(text)
        stops = sorted(tokenizer.stop_ids)
        self.closers[:, stops] = True
        self.eos_token_id = stops[0] if stops else None
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer().encode(text)


def engine_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The tokenizer llguidance works with, built once per llama-chat tokenizer (0.25 s for the
    default model's 49152 tokens)."""
    built = _engine_tokenizers.get(tokenizer)
    if built is None:
        vocabulary = _Vocabulary(tokenizer)
        # Every stop token ends a reply, so each may close a finished answer.
        stops = sorted(tokenizer.stop_ids) or None
        built = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocabulary), eos_token=stops)
        _engine_tokenizers[tokenizer] = built
        _json_closers[tokenizer] = vocabulary.closers
    return built


def json_closers(tokenizer: Tokenizer) -> numpy.ndarray:
    """The tokens a reply near its token budget is steered to, so that it still parses, in
    rows of a bit a token, the first row with an allowed token winning: [0] those that end
    a string first (a quote, then any of quotes, brackets and braces) or stop the reply;
    [1] any spelled with quotes, brackets and braces alone; [2] those with commas too (a
    required property still to come). A quote comes first: inside a string a bracket is
    only text. Made with the engine's vocabulary, once per tokenizer."""
    engine_tokenizer(tokenizer)
    return _json_closers[tokenizer]


@dataclass(frozen=True)
class AnswerFormat:
    """What replies must look like: `kind` is json (any JSON object), schema (a JSON schema's
    text), regex or grammar (llguidance's Lark-like grammar text); `source` says where the
    text came from, for messages and /settings."""

    kind: str
    text: str = ""
    source: str = ""

    def grammar(self) -> str:
        """llguidance's grammar for this format; a schema that is not JSON raises FormatError."""
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.text)
        if self.kind == "grammar":
            return llguidance.LLMatcher.grammar_from_lark(self.text)
        text = ANY_JSON_OBJECT if self.kind == "json" else self.text
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as error:
            raise FormatError(f"the JSON schema {self._shown()} is not JSON ({error}): {_ADVICE['schema']}") from None
        if not isinstance(schema, dict):
            raise FormatError(f"the JSON schema {self._shown()} is not a JSON object: {_ADVICE['schema']}")
        # Compact JSON (no whitespace between items): fewer tokens, and no room for a small
        # model to wander into blank lines; a schema's own "x-guidance" options come first.
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})

    def check(self, tokenizer: Tokenizer | None = None) -> None:
        """Refuse, in one line (FormatError), a schema, regex or grammar the engine cannot use
        (with no tokenizer, before a model is loaded: what can be told from the text alone)."""
        engine = None if tokenizer is None else engine_tokenizer(tokenizer)
        error = llguidance.LLMatcher.validate_grammar(self.grammar(), engine)
        if error:
            what = "JSON schema" if self.kind == "schema" else self.kind
            reason = " ".join(error.split())
            raise FormatError(f"the {what} {self._shown()} cannot be used ({reason}): {_ADVICE[self.kind]}")

    def start(self, tokenizer: Tokenizer, stop_ids: Iterable[int] = ()) -> Constraint:
        """A new reply's constraint (the engine reads the grammar as it goes: this is quick).
        `stop_ids`, the ids that end the model's replies (its chat format's turn ends too),
        may end the reply wherever the tokenizer's own stop ids may."""
        engine = engine_tokenizer(tokenizer)
        closers = json_closers(tokenizer) if self.kind in ("json", "schema") else None
        matcher = llguidance.LLMatcher(engine, self.grammar(), log_level=0)
        ends = sorted(set(stop_ids) - tokenizer.stop_ids)
        end = min(tokenizer.stop_ids) if tokenizer.stop_ids else None
        return Constraint(matcher, engine.vocab_size, closers, ends if end is not None else [], end)

    def describe(self) -> str:
        """The format in a few words, for /settings."""
        if self.kind == "json":
            return "json (any JSON object)"
        return f"{self.kind} {self._shown()}"

    def _shown(self) -> str:
        if self.source:
            return self.source
        return repr(self.text if len(self.text) <= 60 else self.text[:59] + "…")


_ADVICE = {
    "schema": "give a JSON Schema object",
    "regex": "give a regular expression (Rust regex syntax: no lookaround or backreferences)",
    "grammar": "give a grammar in llguidance's Lark syntax, starting from a rule named start",
}


def read_format(kind: str, value: str = "") -> AnswerFormat:
    """A format from a flag or /format's words: json (any object), a schema as JSON text or
    a file, a regex as itself, a grammar from a file. Checked as far as the text alone tells."""
    if kind in ("json", "regex") or (kind == "schema" and value.lstrip().startswith("{")):
        chosen = AnswerFormat(kind, value)
    else:
        try:
            chosen = AnswerFormat(kind, expanded(value).read_text(encoding="utf-8"), source=value)
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else "not UTF-8 text"
            what = "JSON schema" if kind == "schema" else kind
            raise FormatError(f"cannot read the {what} file {value} ({reason}): give a readable file") from None
    chosen.check()
    return chosen


class Constraint(LogitsProcessor):
    """One reply's place in its grammar: the tokens allowed next, advanced token by token.

    `seconds` and `masks` count the time spent computing masks and checking drafts, for
    the reply's statistics."""

    extra_tokens = CLOSING_TOKENS

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, closers: numpy.ndarray | None = None,
        also_ends: Sequence[int] = (), end: int | None = None,
    ) -> None:
        self.matcher = matcher
        # Ids that end a reply beside the tokenizer's, allowed where `end` (one of its) is,
        # and taken as it.
        self._also_ends, self._end = list(also_ends), end
        self._bitmask = numpy.zeros((vocab_size + 31) // 32, dtype=numpy.int32)  # a bit a token
        self._vocab_size = vocab_size
        self._closers = closers
        # Set near the end of the reply's budget: where the format allows a closing token
        # (a quote, a bracket, a brace, a stop), only those, so the answer ends whole.
        self.closing = False
        self.seconds = 0.0
        self.masks = 0

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [vocab] with every token the grammar does not allow next set to -inf (a
        model with more logits than tokens has its extra ones refused too)."""
        started = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        bits = numpy.unpackbits(self._bitmask.view(numpy.uint8), bitorder="little")  # little-endian words
        vocab = logits.shape[-1]
        allowed = numpy.zeros(vocab, dtype=numpy.bool_)
        shared = min(vocab, self._vocab_size)
        allowed[:shared] = bits[:shared]
        if self._also_ends and allowed[self._end]:
            allowed[[token for token in self._also_ends if token < shared]] = True
        if self.closing and self._closers is not None:
            for closers in self._closers:
                closing = allowed[:shared] & closers[:shared]
                if closing.any():
                    allowed[:shared], allowed[shared:] = closing, False
                    break
        # In numpy, on one thread: on a busy machine torch's threads cost more than this work.
        values = logits.detach().float().cpu().numpy()
        masked = torch.from_numpy(numpy.where(allowed, values, numpy.float32("-inf")))
        self.seconds += time.perf_counter() - started
        self.masks += 1
        return masked

    def advance(self, token: int) -> None:
        """Take a sampled token (always one the mask allowed)."""
        started = time.perf_counter()
        if token in self._also_ends:
            token = self._end
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        self.seconds += time.perf_counter() - started

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of these tokens, in order from here, the grammar allows."""
        started = time.perf_counter()
        count = self.matcher.validate_tokens([self._end if token in self._also_ends else token for token in tokens])
        self.seconds += time.perf_counter() - started
        return count

    def forced(self) -> list[int]:
        """Tokens spelling the bytes the format forces next (a JSON key and its quotes): drafts
        that are almost always kept. The engine leaves out a last token that what follows
        could still change, and the model may still spell the same bytes otherwise."""
        started = time.perf_counter()
        tokens = self.matcher.compute_ff_tokens()
        self.seconds += time.perf_counter() - started
        return tokens

    def near_end(self, generated: int, max_tokens: int, remaining: int) -> None:
        """Close what is open over the last tokens of the budget, or of the positions left in the cache."""
        self.closing = generated >= closing_from(max_tokens) or remaining <= CLOSING_TOKENS

    @property
    def finished(self) -> bool:
        """Whether the answer is complete and nothing more may follow (the reply ends here)."""
        return self.matcher.is_stopped()

