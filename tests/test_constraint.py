"""Structured answers (engine/constraint.py): replies held to a JSON schema or a regex, the
mask at every temperature, speculation under a format, and one line for a bad format."""

import json
import re

import pytest
import torch

from llama_chat import Llama, SamplingSettings
from llama_chat.engine.constraint import Format, FormatError, engine_tokenizer
from llama_chat.engine.sampling import Sampler
from llama_chat.engine.speculation import Speculation

from .conftest import tiny_args

DIGITS_THEN_LETTERS = r"[0-9]{2,4}-[a-z]{1,5}"


@pytest.fixture(scope="module")
def model() -> Llama:
    return Llama.random(tiny_args(max_seq_len=256), seed=0)


def test_the_mask_forbids_tokens_when_sampling(model):
    constraint = Format("regex", "[ab]+").start(model.tokenizer)
    logits = torch.randn(model.args.vocab_size, generator=torch.Generator().manual_seed(0)) * 4
    sampler = Sampler(SamplingSettings(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    masked = constraint.mask(logits)
    drawn = {sampler(masked) for _ in range(500)}
    assert drawn == {ord("a"), ord("b")}  # both drawn, nothing else ever
    assert masked[model.tokenizer.eos_id] == float("-inf")  # an empty answer may not end


def test_a_stop_token_is_allowed_only_where_the_format_may_end(model):
    constraint = Format("regex", "ab?").start(model.tokenizer)
    eos = model.tokenizer.eos_id
    logits = torch.zeros(model.args.vocab_size)
    assert constraint.mask(logits)[eos] == float("-inf")
    constraint.advance(ord("a"))
    allowed = torch.isfinite(constraint.mask(logits)).nonzero().flatten().tolist()
    assert allowed == [ord("b"), eos]
    constraint.advance(ord("b"))
    assert constraint.finished


def test_the_engine_tokenizer_is_built_once_per_tokenizer(model):
    assert engine_tokenizer(model.tokenizer) is engine_tokenizer(model.tokenizer)


@pytest.mark.parametrize("seed", range(8))
def test_a_sampled_reply_matches_the_regex(model, seed):
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=20)
    constraint = Format("regex", DIGITS_THEN_LETTERS).start(model.tokenizer)
    generation = model.generate(model.tokenizer.encode("answer:"), settings, constraint=constraint)
    text = "".join(piece.text for piece in generation)
    assert re.fullmatch(DIGITS_THEN_LETTERS, text), text
    assert generation.stats.stop_reason in ("format_complete", "stop_token")
    assert generation.stats.constraint_masks == len(generation.tokens) + (generation.stats.stop_reason == "stop_token")


# A prompt that repeats itself, so that prompt lookup finds matches (as in test_speculation),
# and a format that refuses two of its tokens.
PHRASE = [(i * 7) % 50 + 3 for i in range(40)]
MOST_BYTES = "[" + "".join(f"\\x{b:02x}" for b in sorted(set(range(3, 53)) - {10, 24})) + "]{1,40}"


def greedy_reply(model, prompt, speculation):
    """The reply's tokens, and for each check of drafts against the format: (drafts, allowed)."""
    constraint = Format("regex", MOST_BYTES).start(model.tokenizer)
    checks = []
    check = constraint.allowed_prefix

    def recording(tokens):
        checks.append((len(tokens), check(tokens)))
        return checks[-1][1]

    constraint.allowed_prefix = recording
    settings = SamplingSettings(temperature=0, max_tokens=40)
    generation = model.generate(prompt, settings, speculation=speculation, constraint=constraint)
    list(generation)
    return generation, checks


def test_greedy_replies_are_the_same_with_prompt_lookup_under_a_format(model):
    plain, _ = greedy_reply(model, PHRASE * 2, None)
    drafted, _ = greedy_reply(model, PHRASE * 2, Speculation(lookup=4))
    assert drafted.tokens == plain.tokens and len(plain.tokens) >= 20
    assert re.fullmatch(MOST_BYTES, bytes(plain.tokens).decode())
    assert 0 < drafted.stats.accepted_tokens < drafted.stats.drafted_tokens  # kept, and refused by the model
    # The reply again, the format's refused bytes after every third of its tokens: drafts
    # of them are refused by the format before the model sees them.
    prompt = PHRASE * 2 + [t for i, token in enumerate(plain.tokens) for t in ([token, 10] if i % 3 == 0 else [token])]
    plain, _ = greedy_reply(model, prompt, None)
    drafted, checks = greedy_reply(model, prompt, Speculation(lookup=4))
    assert drafted.tokens == plain.tokens
    assert any(allowed < count for count, allowed in checks)
    assert drafted.stats.accepted_tokens > 0


@pytest.mark.parametrize(
    ("format", "message"),
    [
        (Format("schema", '{"type": "objekt"}', "person.json"),
         "the JSON schema person.json cannot be used (Invalid type: objekt): give a JSON Schema object"),
        (Format("schema", '{"type": '), "the JSON schema '{\"type\": ' is not JSON"),
        (Format("regex", "[a-"), "the regex '[a-' cannot be used (at 1(8): invalid regex"),
        (Format("grammar", "start: missing"), "the grammar 'start: missing' cannot be used"),
    ],
    ids=["bad schema", "schema not JSON", "bad regex", "bad grammar"],
)
def test_a_bad_format_is_one_line(format, message, model):
    for tokenizer in (None, model.tokenizer):
        with pytest.raises(FormatError) as raised:
            format.check(tokenizer)
        assert str(raised.value).startswith(message)
        assert "\n" not in str(raised.value)

