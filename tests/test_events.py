"""A round's streamed text as events: the thinking apart and folded before the answer, the
calls' text left out, what was held back given at the round's end."""

from llama_chat.chat.events import RoundText, Text, Thinking, ThoughtDone
from llama_chat.engine.generation import Piece
from llama_chat.text.tool_calls import HERMES, LLAMA3


def events_of(round_text, pieces):
    events = [event for text in pieces for event in round_text.feed(Piece(1, text))]
    return events + round_text.end()


def test_the_thinking_comes_first_and_is_done_before_the_answer_starts():
    events = events_of(RoundText(None, opened=False), ["<think>", "wh", "y</think>\n\nH", "i"])
    assert events[:2] == [Thinking("wh"), Thinking("y")]
    assert isinstance(events[2], ThoughtDone) and events[2].thought.finished
    assert events[2].thought.tokens == 3
    assert events[3:] == [Text("H"), Text("i")]


def test_a_round_that_ends_within_its_thinking_is_done_unfinished():
    events = events_of(RoundText(None, opened=True), ["still ", "thinking"])
    assert events[:2] == [Thinking("still "), Thinking("thinking")]
    assert isinstance(events[2], ThoughtDone) and not events[2].thought.finished and len(events) == 3


def test_the_calls_text_is_left_out_and_what_was_held_back_comes_at_the_end():
    called = events_of(RoundText(HERMES, opened=False), ["Let me check. <tool", "_call>", '{"name": "x"}'])
    assert called == [Text("Let me check. ")]
    held = events_of(RoundText(HERMES, opened=False), ["See <tool"])
    assert held == [Text("See "), Text("<tool")]
    assert events_of(RoundText(LLAMA3, opened=False), [' {"name"', ": 1}"]) == []


def test_with_splitting_off_the_thinking_stays_in_the_text():
    events = events_of(RoundText(HERMES, opened=False, split=False), ["<think>why</think>", "Hi <tool_call>{}"])
    assert events == [Text("<think>why</think>"), Text("Hi ")]


def test_the_end_is_given_once():
    round_text = RoundText(None, opened=True)
    assert len(round_text.end()) == 1 and round_text.end() == []
