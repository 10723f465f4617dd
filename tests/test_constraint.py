"""Structured answers (engine/constraint.py): replies held to a JSON schema, a regex or a
grammar, the mask at every temperature, speculation (prompt lookup, a draft model) under a
format, and one line for a bad format."""

import json
import re

import jsonschema
import pytest
import torch

import llama_chat.cli.chat
from llama_chat import Llama, SamplingSettings
from llama_chat.chat.session import Session
from llama_chat.cli import main
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.constraint import AnswerFormat, FormatError, engine_tokenizer
from llama_chat.engine.sampling import Sampler
from llama_chat.engine.speculation import Speculation
from llama_chat.options import DraftLength

from .conftest import tiny_args
from .test_repl import chat
from .test_session import GREEDY, chat_model, say

DIGITS_THEN_LETTERS = r"[0-9]{2,4}-[a-z]{1,5}"


@pytest.fixture(scope="module")
def model() -> Llama:
    return Llama.random(tiny_args(max_seq_len=256), seed=0)


def test_the_mask_forbids_tokens_when_sampling(model):
    constraint = AnswerFormat("regex", "[ab]+").start(model.tokenizer)
    logits = torch.randn(model.args.vocab_size, generator=torch.Generator().manual_seed(0)) * 4
    sampler = Sampler(SamplingSettings(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    masked = constraint.mask(logits)
    drawn = {sampler(masked) for _ in range(500)}
    assert drawn == {ord("a"), ord("b")}  # both drawn, nothing else ever
    assert masked[model.tokenizer.eos_id] == float("-inf")  # an empty answer may not end


def test_a_stop_token_is_allowed_only_where_the_format_may_end(model):
    constraint = AnswerFormat("regex", "ab?").start(model.tokenizer)
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
    constraint = AnswerFormat("regex", DIGITS_THEN_LETTERS).start(model.tokenizer)
    generation = model.generate(model.tokenizer.encode("answer:"), settings, processor=constraint)
    text = "".join(piece.text for piece in generation)
    assert re.fullmatch(DIGITS_THEN_LETTERS, text), text
    assert generation.stats.stop_reason in ("format_complete", "stop_token")
    assert generation.stats.constraint_masks == len(generation.tokens) + (generation.stats.stop_reason == "stop_token")


@pytest.mark.parametrize("max_tokens", [9, 40])  # nine: just enough
def test_what_the_format_forces_is_drafted_and_the_reply_is_whole(model, max_tokens):
    forcing = r'\{"key":[0-9]\}'  # nine tokens of ByteTokenizer, all but the digit forced
    settings = SamplingSettings(temperature=1.0, seed=0, max_tokens=max_tokens)
    generation = model.generate(model.tokenizer.encode("go"), settings, processor=AnswerFormat("regex", forcing).start(
        model.tokenizer))
    text = "".join(piece.text for piece in generation)
    assert re.fullmatch(forcing, text), text
    assert generation.stats.stop_reason == "format_complete"
    assert generation.stats.drafted_tokens == generation.stats.accepted_tokens >= 5


# A prompt that repeats itself, so that prompt lookup finds matches (as in test_speculation),
# and a format that refuses two of its tokens.
PHRASE = [(i * 7) % 50 + 3 for i in range(40)]
MOST_BYTES = "[" + "".join(f"\\x{b:02x}" for b in sorted(set(range(3, 53)) - {10, 24})) + "]{1,40}"


def greedy_reply(model, prompt, speculation):
    """The reply's tokens, and for each check of drafts against the format: (drafts, allowed)."""
    constraint = AnswerFormat("regex", MOST_BYTES).start(model.tokenizer)
    checks = []
    check = constraint.allowed_prefix

    def recording(tokens):
        checks.append((len(tokens), check(tokens)))
        return checks[-1][1]

    constraint.allowed_prefix = recording
    settings = SamplingSettings(temperature=0, max_tokens=40)
    generation = model.generate(prompt, settings, speculation=speculation, processor=constraint)
    list(generation)
    return generation, checks


def test_greedy_replies_are_the_same_with_prompt_lookup_under_a_format(model):
    plain, _ = greedy_reply(model, PHRASE * 2, None)
    drafted, _ = greedy_reply(model, PHRASE * 2, Speculation(lookup=DraftLength(4)))
    assert drafted.tokens == plain.tokens and len(plain.tokens) >= 20
    assert re.fullmatch(MOST_BYTES, bytes(plain.tokens).decode())
    assert 0 < drafted.stats.accepted_tokens < drafted.stats.drafted_tokens  # kept, and refused by the model
    # The reply again, the format's refused bytes after every third of its tokens: drafts
    # of them are refused by the format before the model sees them.
    prompt = PHRASE * 2 + [t for i, token in enumerate(plain.tokens) for t in ([token, 10] if i % 3 == 0 else [token])]
    plain, _ = greedy_reply(model, prompt, None)
    drafted, checks = greedy_reply(model, prompt, Speculation(lookup=DraftLength(4)))
    assert drafted.tokens == plain.tokens
    assert any(allowed < count for count, allowed in checks)
    assert drafted.stats.accepted_tokens > 0


# About a quarter of the byte vocabulary: a random model's own choices fall in and out of it.
WORDS = "[a-zA-Z0-9 ]{8,24}"


def noisy_copy(model: Llama, seed: int = 2) -> Llama:
    """The model with noise on every weight: a draft model that agrees with it in part."""
    draft = chat_model(name="tiny draft")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for theirs, ours in zip(draft.transformer.parameters(), model.transformer.parameters()):
            theirs.copy_(ours + 0.3 * ours.std() * torch.randn(ours.shape, generator=generator))
    return draft


def formatted_session(model: Llama, settings: SamplingSettings, draft: Llama | None) -> Session:
    session = Session(model, settings)
    session.set_format(AnswerFormat("regex", WORDS))
    if draft is not None:
        session.set_draft(draft, "draft.gguf")
        session.speculation.draft_length = DraftLength(4)  # drafts at every step, whatever they cost here
    return session


def test_a_greedy_reply_under_a_format_is_the_same_with_a_draft_model():
    model = chat_model()
    settings = SamplingSettings(temperature=0, max_tokens=30)
    plain, drafted = formatted_session(model, settings, None), formatted_session(model, settings, noisy_copy(model))
    stats = []
    for text in ("hello", "tell me more", "and then?"):
        expected, turn = say(plain, text), say(drafted, text)
        assert re.fullmatch(WORDS, turn.text), turn.text
        assert turn.generation.tokens == expected.generation.tokens
        stats.append(turn.stats)
    drafts, kept = sum(s.drafted_tokens for s in stats), sum(s.accepted_tokens for s in stats)
    assert 0 < kept < drafts  # drafts were verified, some kept and some refused


def test_every_sampled_reply_with_a_draft_model_keeps_to_the_format():
    """At temperature 1 the draft model's tokens are drawn from its own distribution, format
    or not, and stay whole: the acceptance rule, on the format's masked distribution, must
    refuse every one outside it and draw its replacement inside."""
    model = chat_model()
    draft = noisy_copy(model)
    drafts = kept = 0
    for seed in range(6):
        settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=30)
        session = formatted_session(model, settings, draft)
        turn = say(session, "hello")
        assert re.fullmatch(WORDS, turn.text), (seed, turn.text)
        assert turn.stats.stop_reason in ("format_complete", "stop_token")
        drafts, kept = drafts + turn.stats.drafted_tokens, kept + turn.stats.accepted_tokens
    assert 0 < kept < drafts


@pytest.mark.parametrize(
    ("format", "message"),
    [
        (AnswerFormat("schema", '{"type": "objekt"}', "person.json"),
         "the JSON schema person.json cannot be used (Invalid type: objekt): give a JSON Schema object"),
        (AnswerFormat("schema", '{"type": '), "the JSON schema '{\"type\": ' is not JSON"),
        (AnswerFormat("regex", "[a-"), "the regex '[a-' cannot be used (at 1(8): invalid regex"),
        (AnswerFormat("grammar", "start: missing"), "the grammar 'start: missing' cannot be used"),
    ],
    ids=["bad schema", "schema not JSON", "bad regex", "bad grammar"],
)
def test_a_bad_format_is_one_line(format, message, model):
    for tokenizer in (None, model.tokenizer):
        with pytest.raises(FormatError) as raised:
            format.check(tokenizer)
        assert str(raised.value).startswith(message)
        assert "\n" not in str(raised.value)



def test_the_format_is_chosen_shown_and_measured_in_the_chat():
    session = Session(chat_model(), GREEDY)
    code, output = chat(session, "/format regex [a-c]{3}", "/settings", "hello", "/stats", "/format schema nope.json",
                        "/format regex [a-", "/format yaml", "/format", "/format json", "/format off", "/quit")
    assert code == 0
    assert "format: regex '[a-c]{3}'" in output and "format = regex '[a-c]{3}'" in output
    assert re.fullmatch("[a-c]{3}", session.conversation.exchanges[0].reply)
    assert re.search(r"format \d+\.\d\d ms/token \(\d+\.\d% of a step\)", output)
    assert "cannot read the JSON schema file nope.json (No such file or directory): give a readable file" in output
    assert "the regex '[a-' cannot be used" in output
    assert "/format takes json, schema FILE|JSON, regex PATTERN, grammar FILE or off, not 'yaml'" in output
    assert "format: json (any JSON object)" in output and "format: off" in output
    assert session.format is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--json-schema", '{"type": "objekt"}'], "the JSON schema '{\"type\": \"objekt\"}' cannot be used"),
        (["--regex", "(?=x)"], "the regex '(?=x)' cannot be used"),
        (["--grammar", "missing.lark"], "cannot read the grammar file missing.lark (No such file or directory)"),
    ],
)
def test_a_bad_format_flag_is_one_line_before_anything_loads(flags, message, capsys, monkeypatch):
    monkeypatch.setattr(llama_chat.cli.chat, "load_options", lambda options: pytest.fail("the model was loaded"))
    assert main(["-p", "hi", *flags]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"llama-chat: {message}") and error.count("\n") == 1


# What the default model answers in: nested objects, arrays, enums and numbers.
PET_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "kind": {"enum": ["cat", "dog", "bird", "fish"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "weight": {"type": "number", "minimum": 0, "maximum": 100},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16}, "vip": {"type": "boolean"}},
            "required": ["name", "vip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["small", "big", "calm", "loud"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "kind", "age", "weight", "owner", "tags"],
    "additionalProperties": False,
}
PROMPTS = [f"Describe {pet} as JSON." for pet in (
    "a sleepy cat", "an old dog", "a parrot that talks", "a goldfish", "a puppy", "a fat cat", "a racing pigeon",
    "a guard dog", "a kitten", "a koi", "a tiny bird", "a loud dog", "a calm fish", "a stray cat", "a sheepdog",
    "a canary", "a cat called Tom", "a dog owned by a king", "a bird owned by a child", "a fish in a bowl",
)]


def schema_errors(value, schema) -> list[str]:
    """Where value breaks the schema, by jsonschema (an independent validator of the whole
    of JSON Schema, not only the keywords these schemas use), as a list of lines."""
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, error.absolute_path)) or '$'}: {error.message}"
            for error in validator.iter_errors(value)]


def test_the_validator_follows_json_schema_not_python_types():
    """What a validator written from these schemas' keywords would get wrong: 5.0 is an
    integer in JSON Schema, True is not one, a missing or an extra key is an error."""
    jsonschema.Draft202012Validator.check_schema(PET_SCHEMA)
    pet = {"name": "Tom", "kind": "cat", "age": 5.0, "weight": 4, "owner": {"name": "Ann", "vip": False},
           "tags": ["calm"]}
    assert schema_errors(pet, PET_SCHEMA) == []
    assert schema_errors({**pet, "age": True}, PET_SCHEMA) == ["age: True is not of type 'integer'"]
    assert len(schema_errors({**pet, "colour": "red"}, PET_SCHEMA)) == 1
    assert len(schema_errors({key: value for key, value in pet.items() if key != "tags"}, PET_SCHEMA)) == 1


@pytest.fixture(scope="module")
def default_model() -> Llama:
    return llama_chat.load(download_model(DEFAULT_MODEL), device="cpu")


@pytest.mark.needs_kernels  # llama-chat's kernels: twenty replies in seconds, not minutes
def test_the_default_model_answers_valid_json_for_a_schema(default_model):
    answer_format = AnswerFormat("schema", json.dumps(PET_SCHEMA))
    answer_format.check(default_model.tokenizer)
    settings = SamplingSettings(temperature=0.7, seed=0, max_tokens=120)
    for prompt in PROMPTS:
        session = Session(default_model, settings, context_size=512)
        session.set_format(answer_format)
        turn = session.send(prompt)
        turn.run()
        assert turn.stats.stop_reason in ("format_complete", "stop_token"), (prompt, turn.text)
        assert schema_errors(json.loads(turn.text), PET_SCHEMA) == [], (prompt, turn.text)


OPEN_SCHEMA = {  # nothing bounds its strings or its array: only the token budget does
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                   "owner": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    "required": ["name", "tags", "owner"],
}


@pytest.mark.needs_kernels
@pytest.mark.parametrize("max_tokens", [12, 30])
def test_a_reply_cut_by_its_budget_closes_what_is_open_and_parses(default_model, max_tokens):
    """Near max_tokens a formatted reply turns to closing its strings, arrays and objects, and
    may go past max_tokens to finish them: every reply parses, at any budget."""
    answer_format = AnswerFormat("schema", json.dumps(OPEN_SCHEMA))
    overran = 0
    for seed, prompt in enumerate(PROMPTS[:8]):
        session = Session(default_model, SamplingSettings(temperature=0.7, seed=seed, max_tokens=max_tokens),
                          context_size=512)
        session.set_format(answer_format)
        turn = session.send(prompt)
        turn.run()
        answer = json.loads(turn.text)
        assert schema_errors(answer, OPEN_SCHEMA) == [], turn.text
        assert sorted(answer) == ["name", "owner", "tags"], turn.text  # nothing beside what is required
        assert turn.stats.stop_reason == "format_complete", turn.text
        overran += turn.stats.generated_tokens > max_tokens
    assert overran  # some replies needed the closing tokens past the budget


# Three colours, a line each: rules, a repetition and a terminal of alternatives, in
# llguidance's Lark syntax. Unformatted, the default model answers this prompt with a
# numbered list of sentences.
COLOUR_GRAMMAR = """\
start: item{3}
item: "- " COLOUR "\\n"
COLOUR: "red" | "green" | "blue" | "yellow" | "orange" | "purple" | "black" | "white"
"""
THREE_COLOURS = r"(- (red|green|blue|yellow|orange|purple|black|white)\n){3}"


@pytest.mark.needs_kernels  # the command line loads the default model anew: seconds on llama-chat's kernels
def test_the_default_model_answers_within_a_grammar_given_on_the_command_line(default_model, tmp_path, capsys):
    grammar = tmp_path / "colours.lark"
    grammar.write_text(COLOUR_GRAMMAR)
    free = Session(default_model, SamplingSettings(temperature=0, max_tokens=40), context_size=512)
    unformatted = free.send("Name three colours.")
    unformatted.run()
    assert not re.fullmatch(THREE_COLOURS, unformatted.text)  # the test can fail: the grammar must act
    code = main(["--model", str(download_model(DEFAULT_MODEL)), "-p", "Name three colours.", "--grammar", str(grammar),
                 "--temperature", "0", "--max-tokens", "40", "--compile", "off", "--stats"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.endswith("\n") and re.fullmatch(THREE_COLOURS, out[:-1]), out
    assert "format " in err and "ms/token" in err  # the statistics line counts the format's time


def test_the_default_model_answers_a_json_object_after_format_json_in_the_chat(default_model):
    settings = SamplingSettings(temperature=0, max_tokens=60)
    free = Session(default_model, settings, context_size=512).send("Describe a cat as JSON.")
    free.run()
    with pytest.raises(json.JSONDecodeError):  # the test can fail: unformatted, the reply is prose
        json.loads(free.text)
    session = Session(default_model, settings, context_size=512)
    code, output = chat(session, "/format json", "Describe a cat as JSON.", "/stats", "/quit")
    assert code == 0 and "format: json (any JSON object)" in output
    reply = session.conversation.exchanges[0].reply
    answer = json.loads(reply)
    assert isinstance(answer, dict) and answer, reply  # an object, and not an empty one
    assert reply in output and "ended by format_complete" in output  # shown as it streamed; ended by the format
