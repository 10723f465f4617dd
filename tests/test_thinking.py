"""A reasoning model's <think> part: split from the answer as it streams, folded or shown,
kept by /save, and sent back to the model as its template says."""

import io
import json
import re
import subprocess
import sys

import pyte
import pytest
from rich.console import Console

from llama_chat.chat.session import Session
from llama_chat.chat.thinking import ANSWER, THINKING, ThinkingSplitter
from llama_chat.engine.generation import Piece
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.loading import load
from llama_chat.repl.render import Renderer

from .reciting_model import OPENS_THINKING, write_reciting_model
from .terminal import Terminal

GREEDY = SamplingSettings(temperature=0.0, max_tokens=20)
# The model writes "<think>why</think>Hi"; with OPENS_THINKING the generation prompt has written "<think>\n".
WRITES_ITS_THINKING = ["<think>", "w", "h", "y", "</think>", "H", "i"]
THINKS_AFTER_THE_CUE = ["w", "h", "y", "</think>", "H", "i"]


def split(pieces, opened=False):
    splitter = ThinkingSplitter(opened)
    parts = [part for text in pieces for part in splitter.feed(Piece(1, text))] + splitter.finish()
    return parts, splitter


@pytest.mark.parametrize("pieces, thinking_tokens", [
    (["<think>", "why", "</think>", "\n\nHi"], 3),
    (["  <th", "ink>wh", "y</th", "ink", ">\n", "\nH", "i"], 5),
    (["<", "t", "h", "i", "n", "k", ">", "w", "h", "y", "<", "/", "t", "h", "i", "n", "k", ">", "H", "i"], 18),
])
def test_thinking_and_answer_come_apart_wherever_the_pieces_break(pieces, thinking_tokens):
    parts, splitter = split(pieces)
    assert "".join(text for part, text in parts if part == THINKING) == splitter.thinking == "why"
    assert "".join(text for part, text in parts if part == ANSWER) == splitter.answer == "Hi"
    assert [part for part, _ in parts] == sorted((part for part, _ in parts), key=[THINKING, ANSWER].index)
    assert splitter.thought.finished and splitter.thought.tokens == thinking_tokens


def test_a_reply_without_thinking_is_all_answer_and_a_cut_one_all_thinking():
    parts, splitter = split(["<thin", "gs>", " fine"])  # starts like the marker, is not
    assert {part for part, _ in parts} == {ANSWER} and splitter.answer == "<things> fine"
    assert splitter.thought is None
    parts, splitter = split(["still ", "thinking </th"], opened=True)
    assert "".join(text for _, text in parts) == "still thinking </th"
    assert not splitter.thought.finished and splitter.thought.line().endswith(", unfinished")
    assert splitter.thought.line().startswith("thought for 2 tokens, ")


@pytest.fixture(scope="module")
def thinking_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("thinking")
    return (write_reciting_model(folder / "writes.gguf", WRITES_ITS_THINKING),
            write_reciting_model(folder / "cued.gguf", THINKS_AFTER_THE_CUE, OPENS_THINKING))


def test_a_template_that_drops_earlier_thinking_is_followed_and_the_cache_reused_up_to_it(thinking_models):
    model = load(thinking_models[1], quantize="none", dtype="float32")
    session = Session(model, GREEDY)
    first = session.send("hello")
    first.run()
    assert first.prompt_thinking == "<think>\n" and first.text == "why</think>Hi"
    assert session.conversation.exchanges[0].reply == "<think>\nwhy</think>Hi"  # kept whole
    cached = list(session.cache.tokens)
    second = session.send("again")
    second.run()
    rendered = model.tokenizer.decode(second.prompt)
    assert rendered.count("why") == 0 and rendered.count("Hi") == 1  # the first reply's answer only
    assert second.prompt == model.chat_format.encode(session.conversation.messages()[:-1])
    # Reused: everything up to the first reply's generation prompt ("<|im_start|>assistant\n"), not its thinking.
    cue = model.chat_format.encode([{"role": "user", "content": "hello"}])
    assert second.stats.reused_tokens == len(cue) - 2 and cached[:len(cue)] == cue
    # The kept ids are the template's: the second reply's thinking (and its generation prompt) gone too.
    messages = session.conversation.messages()
    assert session.transcript.ids == model.chat_format.encode(messages, add_generation_prompt=False)


def test_a_template_that_keeps_thinking_reuses_the_whole_cache(thinking_models):
    model = load(thinking_models[0], quantize="none", dtype="float32")
    session = Session(model, GREEDY)
    first = session.send("hello")
    first.run()
    assert first.prompt_thinking == "" and session.conversation.exchanges[0].reply == "<think>why</think>Hi"
    held = len(session.cache.tokens)
    second = session.send("again")
    second.run()
    assert second.stats.reused_tokens == held
    assert model.tokenizer.decode(second.prompt).count("<think>why</think>Hi") == 1


def test_save_keeps_the_thinking(thinking_models, tmp_path):
    session = Session(load(thinking_models[1], quantize="none", dtype="float32"), GREEDY)
    session.send("hello").run()
    path, _ = session.save(tmp_path / "c.json")
    saved = json.loads(path.read_text())
    assert saved["messages"][-1] == {**saved["messages"][-1], "role": "assistant", "content": "<think>\nwhy</think>Hi"}
    reopened = Session(load(thinking_models[1], quantize="none", dtype="float32"), GREEDY)
    reopened.open(path)
    assert reopened.conversation.exchanges[0].reply == "<think>\nwhy</think>Hi"


@pytest.mark.parametrize("show", [False, True])
@pytest.mark.parametrize("markdown", [False, True])
def test_the_renderer_folds_or_shows_the_thinking(thinking_models, monkeypatch, show, markdown):
    monkeypatch.delenv("NO_COLOR", raising=False)
    session = Session(load(thinking_models[1], quantize="none", dtype="float32"), GREEDY)
    for terminal in (False, True):
        console = Console(file=io.StringIO(), force_terminal=terminal, width=80, height=20)
        Renderer(console, markdown=markdown, show_thinking=show).play(session.send("hello"))
        output = re.sub(r"\x1b\[[0-9;]*m", "", console.file.getvalue())  # styles off: the text
        assert "thought for 4 tokens, " in output and "Hi" in output and "</think>" not in output
        if not terminal or show:  # folding on a terminal: drawn, then erased (the pseudo-terminal test)
            assert ("why" in output) == show


def test_p_prints_the_answer_and_think_show_the_whole_reply(thinking_models):
    command = [sys.executable, "-m", "llama_chat", "-m", str(thinking_models[1]), "--compile", "off",
               "--temperature", "0", "-p", "hello", "--stats"]
    hidden = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert hidden.returncode == 0, hidden.stderr
    assert hidden.stdout == "Hi\n" and "thought for 4 tokens" in hidden.stderr
    shown = subprocess.run([*command, "--think", "show"], capture_output=True, text=True, timeout=120)
    assert shown.stdout == "<think>\nwhy</think>Hi\n"


def screen_of(output: bytes) -> list[str]:
    """What a terminal of 100 columns shows after these bytes (cursor movements applied)."""
    screen = pyte.Screen(100, 40)
    pyte.ByteStream(screen).feed(output)
    return [line.rstrip() for line in screen.display]


def test_thinking_folded_then_shown_on_a_terminal(thinking_models):
    command = [sys.executable, "-m", "llama_chat", "-m", str(thinking_models[0]), "--compile", "off",
               "--temperature", "0"]
    chat = Terminal(command, {"COLUMNS": "100", "LINES": "40", "TERM": "xterm"})
    try:
        assert chat.read_until(b"Ctrl-D leaves", 60), chat.text()
        sent = len(chat.output)
        chat.type(b"hello\r")
        assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
        folded = screen_of(chat.output)
        assert b"why" in chat.output[sent:]  # drawn while it streamed, dim
        reply = folded.index(next(line for line in folded if line.startswith("thought for 5 tokens, ")))
        assert folded[reply + 1] == "Hi" and not any("why" in line for line in folded)
        sent = len(chat.output)
        chat.type(b"/think show\r")
        assert chat.read_until(b"think = show", 30, after=sent), chat.text()
        sent = len(chat.output)
        chat.type(b"again\r")
        assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
        shown = screen_of(chat.output)
        row = shown.index("why")
        assert shown[row + 1].startswith("thought for 5 tokens, ") and shown[row + 2] == "Hi"
    finally:
        chat.kill()
