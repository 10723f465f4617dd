"""Replies that call tools, with a tiny model trained to call (tests/tool_model.py): the call
runs on a yes and its result reaches the model, a no is told to it, the limit stops a loop,
Ctrl-C keeps what there is, and conversations with calls save, reopen and branch."""

import json

import jsonschema
import pytest

from llama_chat.chat.consent import ALL, Consent
from llama_chat.chat.events import Done, Text, ToolCalls
from llama_chat.chat.exchange import CallResult, Outcome
from llama_chat.chat.session import Session
from llama_chat.chat.tool_offer import MAX_CALLS
from llama_chat.chat.tool_runner import DECLINED, Answer, ToolRunner
from llama_chat.chat.turn import STOPPED
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError
from llama_chat.options import DraftLength
from llama_chat.text.tool_calls import HERMES, ToolCall, ToolChoice, read_calls
from llama_chat.tools.tool import ToolSpec

from .tool_model import ANSWER, PARIS, QUESTION, SUNNY, WEATHER, Weather, trained_caller

GREEDY = SamplingSettings(temperature=0, max_tokens=200)


class ScriptedView:
    """Answers each question as told, and keeps what it was shown."""

    def __init__(self, *answers: Answer | None) -> None:
        self.answers = list(answers)
        self.shown: list = []

    def show_call(self, call, tool, preview) -> None:
        self.shown.append(("call", call.name, dict(call.arguments)))

    def ask(self, call, tool):
        return self.answers.pop(0)

    def show_result(self, call, result) -> None:
        self.shown.append(("result", call.name, result.outcome))


def session_with_weather(max_calls: int = MAX_CALLS, lookup: int = 0):
    session = Session(trained_caller(), GREEDY)
    session.set_lookup(DraftLength(lookup))
    session.set_tools([WEATHER], max_calls)
    weather = Weather()
    return session, weather


def runner(weather: Weather, view, consent: Consent | None = None) -> ToolRunner:
    return ToolRunner(lambda: {WEATHER.name: weather}, consent or Consent(), view)


def test_the_runner_turns_a_tool_raising_into_a_result():
    """Whatever a tool raises, in its check, its preview or its run, is the model's to hear
    of: the chat goes on."""

    class Raising:
        def __init__(self, name: str, where: str, error: Exception) -> None:
            self.spec = ToolSpec(name, "raises")
            self.where, self.error = where, error

        def refusal(self, arguments):
            if self.where == "refusal":
                raise self.error
            return None

        def preview(self, arguments):
            if self.where == "preview":
                raise self.error
            return None

        def run(self, arguments):
            raise self.error

    tools = {"checked": Raising("checked", "refusal", FileNotFoundError(2, "No such file or directory")),
             "previewed": Raising("previewed", "preview", ValueError("a value it did not expect")),
             "ran": Raising("ran", "run", OSError(40, "Too many levels of symbolic links"))}
    runner = ToolRunner(lambda: tools, Consent(ahead=frozenset({ALL})), ScriptedView())
    assert [(result.text, result.outcome) for result in (runner.run_call(ToolCall(name, {}, "call00001"))
                                                        for name in tools)] == [
        ("the tool failed: [Errno 2] No such file or directory", Outcome.FAILED),
        ("the tool failed: a value it did not expect", Outcome.FAILED),
        ("the tool failed: [Errno 40] Too many levels of symbolic links", Outcome.FAILED)]


@pytest.mark.parametrize("lookup", [0, 8])
def test_a_call_runs_on_yes_and_its_result_reaches_the_model(lookup):
    session, weather = session_with_weather(lookup=lookup)
    view = ScriptedView(Answer.YES)
    exchange = session.send(QUESTION).run(runner(weather, view))
    assert weather.calls == [PARIS]
    assert view.shown == [("call", "get_weather", PARIS), ("result", "get_weather", Outcome.RAN)]
    assert [(call.name, dict(call.arguments)) for call in exchange.rounds[0].calls] == [("get_weather", PARIS)]
    assert exchange.rounds[0].results[0].text == SUNNY
    assert exchange.reply == ANSWER  # what the model learned to say with that result
    # The kept ids are the conversation as its format renders it, calls and results included,
    # and the cache holds them.
    rendered = session.chat_format.encode(session.conversation.messages(), add_generation_prompt=False)
    assert session.transcript.ids == rendered
    assert session.cache.tokens == session.transcript.ids[: len(session.cache.tokens)]


def test_a_turn_with_calls_streams_its_rounds_as_events():
    session, weather = session_with_weather()
    turn = session.send(QUESTION)
    events = list(turn.events(runner(weather, ScriptedView(Answer.YES))))
    kinds = [type(event) for event in events]
    assert kinds.count(ToolCalls) == 1 and kinds.count(Done) == 1 and kinds[-1] is Done
    calls = kinds.index(ToolCalls)
    assert events[calls].tool_round.calls[0].name == "get_weather"
    shown = "".join(event.text for event in events if isinstance(event, Text))
    assert "<tool_call>" not in shown  # the call is the tool runner's to show
    assert "".join(event.text for event in events[calls:] if isinstance(event, Text)) == turn.exchange.reply == ANSWER
    assert events[-1].calls_made == 1 and events[-1].stats == turn.stats


def test_no_is_told_to_the_model_and_always_asks_no_more():
    session, weather = session_with_weather()
    view = ScriptedView(Answer.NO)
    turn = session.send(QUESTION)
    exchange = turn.run(runner(weather, view))
    assert weather.calls == []
    assert exchange.rounds[0].results == [CallResult(DECLINED, Outcome.DECLINED)]
    assert DECLINED in session.model.tokenizer.decode(turn.prompts[1].ids)
    consent = Consent()
    session.clear()  # the model learned to call at a conversation's start
    session.send(QUESTION).run(runner(weather, ScriptedView(Answer.ALWAYS), consent))
    session.clear()
    session.send(QUESTION).run(runner(weather, ScriptedView(), consent))  # nothing left to answer: not asked
    assert len(weather.calls) == 2 and consent.always == {"get_weather"}


def test_without_anyone_to_ask_a_call_is_declined():
    session, weather = session_with_weather()
    exchange = session.send(QUESTION).run(runner(weather, ScriptedView(None)))
    assert weather.calls == [] and exchange.rounds[0].results[0].outcome == Outcome.DECLINED
    allowed = Consent(ahead=frozenset({"get_weather"}))
    session.clear()
    session.send(QUESTION).run(runner(weather, ScriptedView(), allowed))
    assert weather.calls == [PARIS]


def test_the_limit_stops_a_model_that_calls_again_and_again():
    unlimited, weather = session_with_weather()
    exchange = unlimited.send("Weather twice?").run(runner(weather, ScriptedView(Answer.YES, Answer.YES)))
    assert len(weather.calls) == 2 and len(exchange.rounds) == 2  # what it learned: two calls in turn
    limited, weather = session_with_weather(max_calls=1)
    turn = limited.send("Weather twice?")
    exchange = turn.run(runner(weather, ScriptedView(Answer.YES)))
    assert len(weather.calls) == 1 and len(exchange.rounds) == 1
    assert "<tool_call>" not in exchange.reply  # the last round could not open a call
    assert turn.calls_made == 1


def test_ctrl_c_while_a_call_runs_keeps_the_round_and_the_chat_goes_on():
    session, weather = session_with_weather()

    class Interrupted(Weather):
        def run(self, arguments):
            raise KeyboardInterrupt

    turn = session.send(QUESTION)
    with pytest.raises(KeyboardInterrupt):
        turn.run(runner(Interrupted(), ScriptedView(Answer.YES)))
    exchange = session.conversation.exchanges[-1]
    assert exchange.interrupted and exchange.reply == ""
    assert exchange.rounds[0].results == [CallResult(STOPPED, Outcome.CANCELLED)]
    assert session.transcript.ids is None  # rendered anew for the next turn
    after = session.retry().run(runner(weather, ScriptedView(Answer.YES)))
    assert after.reply == ANSWER and weather.calls == [PARIS]


def test_a_conversation_with_calls_saves_reopens_and_branches(tmp_path):
    session, weather = session_with_weather()
    session.send(QUESTION).run(runner(weather, ScriptedView(Answer.YES)))
    path, cached = session.save(tmp_path / "calls.json")
    assert cached == len(session.cache)
    reopened, _ = session_with_weather()
    note = reopened.open(path)
    assert note is None  # the ids and the cache were used as saved
    assert reopened.conversation.messages() == session.conversation.messages()
    assert reopened.transcript.ids == session.transcript.ids
    assert reopened.conversation.exchanges[0].rounds == session.conversation.exchanges[0].rounds
    retried = reopened.retry().run(runner(weather, ScriptedView(Answer.YES)))
    assert retried.reply == ANSWER and [version.number for version in reopened.conversation.versions()] == [1, 2]
    assert reopened.conversation.exchanges[0] is retried
    reopened.switch_version(1)  # the reopened version, its calls with it
    assert reopened.conversation.exchanges[0] is not retried
    assert reopened.conversation.exchanges[0].rounds == session.conversation.exchanges[0].rounds


ROUND_REFUSALS = {
    "a result's outcome": (lambda round_: round_["results"][0].update(outcome=5), "a tool result needs a text 'text'"),
    "rounds not a list": (None, "'tool_rounds' must be a list"),
    "a call without its results": (lambda round_: round_.update(results=[]), "a tool round must be an object"),
    "arguments not text": (lambda round_: round_["calls"][0].update(arguments={"\ud800": "\udc00"}),
                           "a tool round holds characters that are not text (lone surrogates); not opened"),
}


@pytest.mark.parametrize("damage", ROUND_REFUSALS)
def test_a_conversation_file_with_a_malformed_round_is_refused_in_one_line(tmp_path, damage):
    """Arguments a file holds go into the next render as text: ones that cannot be written as
    UTF-8 are refused at /open, not met by the next message."""
    session, _ = session_with_weather()
    session.send(QUESTION).run(runner(Weather(), ScriptedView(Answer.YES)))
    path, _ = session.save(tmp_path / "calls.json")
    lines = path.read_text().split("\n")
    at = next(number for number, line in enumerate(lines) if "tool_rounds" in line)
    reply = json.loads(lines[at])
    change, message = ROUND_REFUSALS[damage]
    if change is None:
        reply["tool_rounds"] = {"text": "not a list"}
    else:
        change(reply["tool_rounds"][0])
    lines[at] = json.dumps(reply)
    path.write_text("\n".join(lines))
    reopened, _ = session_with_weather()
    with pytest.raises(LlamaChatError) as refused:
        reopened.open(path)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert reopened.conversation.exchanges == []  # nothing of the file taken


def test_a_saved_conversation_opened_with_other_tools_offered_is_rendered_anew(tmp_path):
    session, weather = session_with_weather()
    session.send(QUESTION).run(runner(weather, ScriptedView(Answer.YES)))
    path, _ = session.save(tmp_path / "calls.json")
    without_tools = Session(trained_caller(), GREEDY)
    note = without_tools.open(path)
    assert "cache was not used" in note
    messages = without_tools.conversation.messages()
    assert without_tools.transcript.ids == without_tools.chat_format.encode(messages, add_generation_prompt=False)


@pytest.mark.parametrize("lookup", [0, 8])
def test_calls_sampled_at_temperature_one_always_parse_and_fit_the_schema(lookup):
    """100 sampled calls a way (200 in all): each parses and validates with jsonschema. Asked
    what it never learned, with a call required, the model's arguments wander far."""
    session, _ = session_with_weather(lookup=lookup)
    model, offer = session.model, session.offer
    prompt = session.chat_format.encode([{"role": "user", "content": "What is the weather like in Rome today?"}])
    validator = jsonschema.Draft202012Validator(WEATHER.parameters)
    calls, replies = [], 0
    while len(calls) < 100:
        replies += 1
        assert replies <= 400, f"only {len(calls)} calls in 400 replies"
        settings = SamplingSettings(temperature=1.0, max_tokens=300, seed=replies)
        required = offer.constraint_format(model.tokenizer, ToolChoice.REQUIRED)
        constraint = required.start(model.tokenizer, model.stop_ids)
        generation = model.generate(prompt, settings, cache=session.cache, speculation=session.speculation,
                                    processor=constraint)
        list(generation)
        read = read_calls(HERMES, generation.text)  # raises where a call does not parse
        for call in read.calls:
            assert call.name == "get_weather"
            validator.validate(dict(call.arguments))
        calls += read.calls
    distinct = {repr(dict(call.arguments)) for call in calls}
    assert len(distinct) > 10  # sampled: the arguments wander, within the schema
