"""The real REPL (prompt_toolkit reading keys from a pipe) with tiny models."""

import io
import re
import threading

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

import llama_chat
import llama_chat.repl.app
from llama_chat import Llama, SamplingSettings
from llama_chat.chat.consent import Consent
from llama_chat.chat.session import Session
from llama_chat.chat.tool_runner import ToolRunner
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.generation import GenerationStats, Piece
from llama_chat.errors import LlamaChatError
from llama_chat.options import DraftLength
from llama_chat.repl.app import ChatCompleter, history_path, run_repl, toolbar
from llama_chat.repl.render import Renderer
from llama_chat.repl.tool_view import ChatCallView

from .conftest import tiny_args
from .test_session import GREEDY, assert_consistent, chat_model, replay
from .tool_model import SUNNY, WEATHER, Weather
from .waiting import wait_until

ENTER, ESCAPE, CTRL_C, CTRL_D = "\r", "\x1b", "\x03", "\x04"


def refuse_to_load(path):
    raise LlamaChatError(f"{path}: no such file or directory")


def chat(session, *lines, keys="", load_model=refuse_to_load, console=None, history=None):
    """Type the lines (each then Enter) and any raw keys into the REPL; return (exit code, output).
    Lines may be bytes, as a terminal sends them (not necessarily UTF-8)."""
    output = io.StringIO()
    renderer = Renderer(console or Console(file=output, width=200))
    typed = b"".join((line if isinstance(line, bytes) else line.encode()) + ENTER.encode() for line in lines)
    with create_pipe_input() as pipe:
        pipe.send_bytes(typed + keys.encode())
        code = run_repl(session, load_model, renderer=renderer, input=pipe, output=DummyOutput(),
                        history=history or InMemoryHistory())
    return code, (console.file.getvalue() if console else output.getvalue())


class ScriptedGeneration:
    """Stands in for a Generation: streams a given text one character per piece."""

    def __init__(self, tokenizer, text):
        self.tokens = tokenizer.encode(text)
        self.text = ""
        self.stats = GenerationStats(prompt_tokens=1, generated_tokens=len(self.tokens), stop_reason="stop_token")
        self._pieces = list(text)

    def __iter__(self):
        for char in self._pieces:
            self.text += char
            yield Piece(None, char)


def script_replies(monkeypatch, model, *texts):
    replies = iter(texts)
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: ScriptedGeneration(model.tokenizer, next(replies)))


def test_settings_change_through_slash_commands():
    session = Session(chat_model(), SamplingSettings())
    code, output = chat(session, "/temperature 0.2", "/top_k 5", "/top_p 0.5", "/min_p 0.1",
                        "/repeat_penalty 1.3", "/repeat_last_n 16", "/max_tokens 7", "/seed 3", "/temp 0.25", "/quit")
    assert code == 0
    assert session.settings == SamplingSettings(temperature=0.25, top_k=5, top_p=0.5, min_p=0.1, repeat_penalty=1.3,
                                                repeat_last_n=16, max_tokens=7, seed=3)
    assert "temperature = 0.25" in output and "seed = 3" in output
    chat(session, "/seed random", "/bye")
    assert session.settings.seed is None


@pytest.mark.parametrize("line, message", [
    ("/temperature -1", "temperature must be 0 (greedy) or more"),
    ("/temperature hot", "/temperature needs a number, got 'hot'"),
    ("/temperature nan", "/temperature needs a finite number"),
    ("/top_k 2.5", "/top_k needs a whole number, got '2.5'"),
    ("/top_p 0", "top_p must be in (0, 1]"),
    ("/min_p 1", "min_p must be in [0, 1)"),
    ("/repeat_penalty 0", "repeat_penalty must be positive"),
    ("/max_tokens 0", "max_tokens must be a positive number"),
    ("/seed -2", "seed must be a whole number from 0 to 2**63 - 1"),
    ("/markdown maybe", "/markdown takes on or off, got 'maybe'"),
    ("/think aloud", "/think takes show or hide, got 'aloud'"),
    ("/undo now", "/undo takes no argument"),
    ("/load", "this command needs a model path"),
    ("/tempreature 1", "unknown command /tempreature: did you mean /temperature?"),
    ("/temper 1", "unknown command /temper: did you mean /temperature?"),
    ("/unknownthing", "unknown command /unknownthing: (/help lists the commands)"),
    ("/", "unknown command /: (/help lists the commands)"),
    ("/save ~no-such-user-here/chat.json", "cannot expand ~no-such-user-here/chat.json: no such user"),
    ("/lookup many", "/lookup takes auto or a number of tokens (0: off), not 'many'"),
    ("/lookup", "this command needs a number of tokens or auto"),
    ("/draft missing.gguf", "could not load the draft model missing.gguf: missing.gguf: no such file or directory"),
])
def test_bad_values_are_refused_and_nothing_changes(line, message):
    settings = SamplingSettings(temperature=0.5, seed=1)
    session = Session(chat_model(), settings)
    code, output = chat(session, line, "/exit")
    assert code == 0
    assert message in output
    assert session.settings == settings and session.conversation.exchanges == []


def test_speculation_is_set_from_the_chat():
    session = Session(chat_model(), GREEDY)
    wider = Llama.random(tiny_args(vocab_size=300), seed=1)
    same_vocabulary = chat_model(seed=1, name="tiny draft")
    drafts = {"wide.gguf": wider, "draft.gguf": same_vocabulary}
    code, output = chat(session, "/lookup 5", "/settings", "/draft wide.gguf", "/draft draft.gguf", "/settings",
                        "hello", "/stats", "/draft off", "/lookup 0", "/quit", load_model=drafts.__getitem__)
    assert code == 0
    assert "prompt lookup: up to 5 tokens" in output and "lookup = up to 5 tokens" in output
    assert "the draft model has 300 tokens and the model 260" in output
    assert "drafting with tiny draft" in output and "draft = " in output and "draft.gguf" in output
    assert "(the draft model drafts instead)" in output
    assert "draft model off; prompt lookup: up to 5 tokens" in output and "prompt lookup: off" in output
    assert session.speculation.draft is None and session.speculation.lookup == DraftLength(0)
    assert session.conversation.exchanges and session.conversation.exchanges[0].reply


def test_help_lists_every_command():
    _, output = chat(Session(chat_model()), "/help", "/help retry", "/quit")
    for name in ["/temperature /temp", "/top_k", "/top_p", "/min_p", "/repeat_penalty", "/max_tokens", "/seed",
                 "/settings", "/system", "/clear", "/retry", "/undo", "/load", "/save", "/open", "/stats",
                 "/device", "/markdown", "/quit /exit /bye"]:
        assert name in output
    assert "generate the last reply again" in output


def test_second_turn_feeds_only_the_new_tokens():
    session = Session(chat_model(), GREEDY)
    chat(session, "hello", "/quit")
    cached = len(session.cache.tokens)
    unfed = 0 if session.last_stats.stop_reason == "stop_token" else 1
    code, output = chat(session, "world", "/stats", "/quit")
    # <|im_end|> "\n" closing the reply, then <|im_start|> "user\nworld" <|im_end|> "\n" <|im_start|> "assistant\n"
    new_tokens = 2 + 1 + len("user\nworld") + 1 + 1 + 1 + len("assistant\n")
    assert session.last_stats.reused_tokens == cached
    assert session.last_stats.prefilled_tokens == unfed + new_tokens
    assert f"prompt {unfed + new_tokens} new + {cached} cached tokens" in output


def test_multi_line_input_and_ctrl_c_at_the_prompt():
    session = Session(chat_model(), GREEDY)
    keys = "line one" + ESCAPE + ENTER + "line two" + ENTER + "typed then" + CTRL_C + "hello" + ENTER + "/quit" + ENTER
    code, _ = chat(session, keys=keys)
    assert code == 0
    assert [e.user for e in session.conversation.exchanges] == ["line one\nline two", "hello"]


def test_tab_then_enter_takes_a_completion_without_sending(monkeypatch):
    # Completion runs between key presses, so the keys come one by one, as typed: each once the
    # prompt's line shows what the keys before it did.
    session = Session(chat_model(), SamplingSettings())
    prompts = []
    make_prompt = llama_chat.repl.app.prompt_session
    monkeypatch.setattr(llama_chat.repl.app, "prompt_session",
                        lambda *args, **kwargs: prompts.append(make_prompt(*args, **kwargs)) or prompts[-1])

    def line():
        return prompts[0].default_buffer

    exit_codes = []
    with create_pipe_input() as pipe:
        repl = threading.Thread(target=lambda: exit_codes.append(run_repl(
            session, refuse_to_load, renderer=Renderer(Console(file=io.StringIO())), input=pipe,
            output=DummyOutput(), history=InMemoryHistory())))
        repl.start()
        try:
            assert wait_until(lambda: prompts and prompts[0].app.is_running)
            for keys, shown in [
                ("/temper", lambda: line().text == "/temper"),
                ("\t", lambda: line().text == "/temperature" and line().complete_state is not None),
                (ENTER, lambda: line().complete_state is None),  # the completion taken...
            ]:
                pipe.send_text(keys)
                assert wait_until(shown), (keys, line().text)
            assert line().text == "/temperature" and session.settings.temperature != 0.5  # ...and nothing sent
            pipe.send_text(" 0.5" + ENTER)
            assert wait_until(lambda: session.settings.temperature == 0.5)
        finally:
            pipe.send_text("/quit" + ENTER)
            repl.join(timeout=30)
    assert exit_codes == [0] and session.settings.temperature == 0.5


def test_ctrl_d_at_an_empty_prompt_leaves_with_code_0():
    session = Session(chat_model(), GREEDY)
    assert chat(session, "hi", keys=CTRL_D)[0] == 0
    assert len(session.conversation.exchanges) == 1


def test_ctrl_c_during_streaming_keeps_the_session_alive(monkeypatch):
    model = chat_model()
    session = Session(model, SamplingSettings(temperature=0, max_tokens=10))
    session.speculation.lookup = DraftLength(0)  # a step per token

    class UntilCtrlC:
        """Ctrl-C lands while the model computes: here, in the fourth call (the prefill, then
        one per generated token), so three tokens have been shown; the runner's other
        attributes are its own."""

        calls = 0

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, cache, ids, **options):
            self.calls += 1
            if self.calls == 4:
                raise KeyboardInterrupt
            return self.inner(cache, ids, **options)

    monkeypatch.setattr(model, "runner", UntilCtrlC(model.runner))
    code, output = chat(session, "hello", "go on", "/quit")
    assert code == 0
    first, second = session.conversation.exchanges
    # three tokens, then <|im_end|> "\n"
    assert first.interrupted and len(session.transcript.spans.get(first).reply) == 3 + 2
    assert "[interrupted] 3 tokens" in output
    assert not second.interrupted and second.user == "go on"
    assert_consistent(session)
    # The reply after the interruption is what a fresh cache gives for the same conversation.
    spans = session.transcript.spans.get(first), session.transcript.spans.get(second)
    prompt = spans[0].user + spans[0].reply + spans[1].user
    fresh = model.generate(prompt, session.settings, cache=model.new_cache())
    list(fresh)
    assert spans[1].reply[:-2] == fresh.tokens


def test_a_reply_with_calls_and_thinking_is_drawn_round_by_round(monkeypatch):
    """The text before the call, the line ended; the call, asked about, and its result; then
    the next round's thinking folded to its line before the answer, then the stats."""
    model = chat_model(max_seq_len=2048)
    session = Session(model, GREEDY)
    session.set_tools([WEATHER])
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    script_replies(monkeypatch, model, "Checking " + call, "<think>ok</think>\n\nSunny.")
    console = Console(file=io.StringIO(), width=80)
    renderer = Renderer(console)
    weather = Weather()
    questions = []
    view = ChatCallView(renderer, lambda question: questions.append(question) or "y")
    renderer.play(session.send("Weather?"), ToolRunner(lambda: {"get_weather": weather}, Consent(), view))
    times = re.sub(r"\d+\.\d s", "T s", console.file.getvalue())
    assert times.splitlines()[:6] == [
        "Checking ", '⚙ get_weather (built-in) {"city": "Paris"}', "→ get_weather: ran in T s", f"  {SUNNY}",
        "thought for 0 tokens, T s", "Sunny."]
    assert times.splitlines()[6].endswith("1 tool call (T s)") and len(times.splitlines()) == 7
    assert weather.calls == [{"city": "Paris"}] and len(questions) == 1
    assert session.conversation.exchanges[-1].reply == "<think>ok</think>\n\nSunny."


def test_retry_undo_and_clear_leave_the_conversation_as_a_fresh_run_would():
    model = chat_model()
    session = Session(model, SamplingSettings(temperature=1.0, seed=4, max_tokens=6), system="Be brief.")
    chat(session, "one", "two", "/temperature 0", "/retry", "/quit")
    fresh = replay(model, ["one", "two"], SamplingSettings(temperature=1.0, seed=4, max_tokens=6), system="Be brief.")
    fresh.settings = GREEDY
    fresh.retry().run()
    assert session.transcript.ids == fresh.transcript.ids
    assert_consistent(session)

    chat(session, "three", "/undo", "four", "/quit")
    fresh_turn = fresh.send("four")
    fresh_turn.run()
    assert session.conversation.exchanges[-1].reply == fresh_turn.text
    assert session.transcript.ids == fresh.transcript.ids
    assert [e.user for e in session.conversation.exchanges] == ["one", "two", "four"]

    chat(session, "/clear", "five", "/quit")
    assert [e.user for e in session.conversation.exchanges] == ["five"] and session.conversation.system == "Be brief."
    assert session.transcript.ids == replay(model, ["five"], system="Be brief.").transcript.ids
    assert_consistent(session)


def test_context_overflow_drops_old_turns_and_keeps_going():
    session = Session(chat_model(max_seq_len=128), SamplingSettings(temperature=0, max_tokens=8),
                      system="Be kind.", context_size=128)
    lines = [f"message number {index}" for index in range(6)]
    code, output = chat(session, *lines, "x" * 300, "still here?", "/quit")
    assert code == 0
    assert "context full: dropped the" in output
    assert "that message is 3" in output and "more than the context of 128 tokens" in output
    assert session.conversation.exchanges[-1].user == "still here?" and len(session.conversation.exchanges) < 7
    assert session.conversation.messages()[0]["content"] == "Be kind."
    assert_consistent(session)


def test_save_then_open_restores_the_conversation(tmp_path):
    model = chat_model()
    session = Session(model, GREEDY, system="S", model_path=tmp_path / "m.gguf")
    path = tmp_path / "talk.json"
    chat(session, "one", "two", f"/save {path}", "/quit")
    other = Session(model, SamplingSettings(), model_path=tmp_path / "m.gguf")
    code, output = chat(other, "/temperature 0.9", f"/open {path}", "/quit")
    assert f"opened {path}: 2 exchanges" in output
    assert other.conversation.messages() == session.conversation.messages()
    assert other.transcript.ids == session.transcript.ids and other.settings == GREEDY


def test_failed_load_keeps_the_old_model_and_the_conversation(tmp_path):
    model = chat_model()
    session = Session(model, GREEDY)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF not really")
    load = llama_chat.load
    code, output = chat(session, "one", f"/load {tmp_path / 'missing'}", f"/load {broken}", "two", "/quit",
                        load_model=lambda path: load(path, device="cpu"))
    assert code == 0
    assert output.count("could not load") == 2 and "still chatting with tiny" in output
    assert "no such file or directory" in output
    assert session.model is model and [e.user for e in session.conversation.exchanges] == ["one", "two"]
    assert_consistent(session)


def test_load_of_a_real_file_switches_weights_and_keeps_the_conversation(tmp_path):
    from .test_gguf import tiny_hf_model, write_gguf

    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=7))
    model = chat_model()
    session = Session(model, GREEDY)
    code, output = chat(session, "one", f"/load {path}", "two", "/quit",
                        load_model=lambda path: llama_chat.load(path, device="cpu"))
    assert session.model is not model and session.model.name == "tiny.gguf"
    assert session.model_path == str(path) and session.capacity == 128  # the file's context is 128
    weights = session.model.weights.packing
    assert weights in ("Q8_0", "int8")  # Q8_0 blocks on llama-chat's kernels, int8 rows on PyTorch's
    assert f"loaded tiny.gguf on cpu, {weights} weights, decode step eager, context 128 tokens" in output
    assert [e.user for e in session.conversation.exchanges] == ["one", "two"]
    assert_consistent(session)


def test_load_switches_weights_and_keeps_the_conversation():
    session = Session(chat_model(), GREEDY)
    other = chat_model(seed=2, name="other")
    code, output = chat(session, "one", "/load other.gguf", "two", "/device", "/quit", load_model=lambda path: other)
    assert session.model is other and "loaded other on cpu, float32 weights, decode step eager, context" in output
    assert re.search(r"cpu \(float32; decode step eager; \d+ of \d+ threads", output)  # /device says it all
    assert [e.user for e in session.conversation.exchanges] == ["one", "two"]
    assert_consistent(session)
    # /device: the device line, then memory held now, resident and the process's own
    resident, own = re.search(r"memory: (\d+) MB resident, (\d+) MB of it this process's own", output).groups()
    assert 0 < int(own) <= int(resident)


def test_model_output_is_displayed_literally(monkeypatch):
    model = chat_model()
    session = Session(model, GREEDY)
    reply = "[bold]not bold[/bold] :smile: \x1b[31mred?\x07"
    script_replies(monkeypatch, model, reply)
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    monkeypatch.delenv("NO_COLOR", raising=False)
    _, output = chat(session, "hi", "/quit", console=console)
    assert "[bold]not bold[/bold] :smile: \\x1b[31mred?\\x07" in output
    assert "\x1b[31m" not in output and "\x07" not in output
    assert "\x1b[2m" in output  # the stats line is dim on a terminal
    assert session.conversation.exchanges[0].reply == reply


def test_plain_output_when_not_a_terminal_or_no_color(monkeypatch):
    session = Session(chat_model(), GREEDY)
    _, output = chat(session, "hi", "/markdown on", "hello", "/quit")
    assert "\x1b" not in output
    monkeypatch.setenv("NO_COLOR", "1")
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    _, output = chat(session, "hi", "/bogus", console=console, keys="/quit" + ENTER)
    assert "\x1b[" not in output


def test_markdown_on_renders_finished_replies(monkeypatch):
    model = chat_model()
    session = Session(model, GREEDY)
    script_replies(monkeypatch, model, "plain **strong** text", "plain **strong** text")
    monkeypatch.delenv("NO_COLOR", raising=False)
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    _, output = chat(session, "a", "/markdown on", "b", "/quit", console=console)
    before, after = output.split("markdown = on")
    assert "**strong**" in before and "**strong**" not in after and "strong" in after


def test_stats_and_settings_show_the_state():
    session = Session(chat_model(), GREEDY, system="Be brief.")
    _, output = chat(session, "/stats", "hi", "/stats", "/settings", "/system", "/quit")
    assert "no reply yet" in output
    assert f"context: {session.context_used()} of 512 tokens, 1 exchange" in output
    assert "temperature = 0" in output and "system = 'Be brief.'" in output
    assert "system prompt: Be brief." in output


def test_slash_slash_sends_a_message_starting_with_a_slash():
    session = Session(chat_model(), GREEDY)
    chat(session, "//etc/hosts is a file", "/quit")
    assert session.conversation.exchanges[0].user == "/etc/hosts is a file"


def test_history_is_kept_in_the_xdg_state_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert history_path() == tmp_path / "llama-chat" / "history"
    session = Session(chat_model(), GREEDY)
    output = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text("/settings\r/quit\r")
        run_repl(session, refuse_to_load, renderer=Renderer(Console(file=output)), input=pipe, output=DummyOutput())
    assert "/settings" in history_path().read_text()


def test_completion_of_commands_arguments_and_paths(tmp_path):
    (tmp_path / "weights.gguf").write_text("")
    completer = ChatCompleter()

    def complete(text):
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]

    assert complete("/tem") == ["temperature", "temp"]
    assert complete("/markdown o") == ["on", "off"]
    assert complete(f"/load {tmp_path}/wei") == ["ghts.gguf"]
    assert complete(f"/save {tmp_path}/w") == ["eights.gguf"]
    assert complete("hello") == [] and complete("/temperature 0") == []


def test_toolbar_shows_model_device_temperature_and_context():
    session = Session(chat_model(), SamplingSettings(temperature=0.3))
    assert toolbar(session) == " tiny | cpu | temperature 0.3 | context 0/512 "


@pytest.fixture(scope="module")
def default_model():
    return llama_chat.load(download_model(DEFAULT_MODEL), device="cpu", dtype="float32")


def test_two_turns_with_the_default_model_reuse_the_cache(default_model):
    session = Session(default_model, SamplingSettings(temperature=0, max_tokens=40))
    code, output = chat(session, "What is the capital of France?", "And of Germany?", "/quit")
    assert code == 0
    first, second = session.conversation.exchanges
    assert "Paris" in first.reply and "Berlin" in second.reply
    chat_format = default_model.chat_format
    history = session.conversation.messages()[:2]
    asked = chat_format.encode(history + [{"role": "user", "content": "And of Germany?"}])
    new_turn = asked[len(chat_format.encode(history, False)):]
    im_end_and_newline = 2
    stats = session.last_stats
    span = session.transcript.spans.get(first)
    assert stats.reused_tokens == len(span.user) + len(span.reply) - im_end_and_newline
    assert stats.prefilled_tokens == im_end_and_newline + len(new_turn)
    assert f"prompt {stats.prefilled_tokens} new + {stats.reused_tokens} cached tokens" in output


def test_typed_text_that_is_not_utf8_is_read_with_replacement_characters(tmp_path):
    session = Session(chat_model(), GREEDY)
    code, output = chat(session, b"hi \xff there", b"/system be \xfe brief", "/quit")
    assert code == 0 and output.count("not UTF-8 text; each is read as U+FFFD") == 2
    assert session.conversation.exchanges[0].user == "hi \ufffd there"
    assert session.conversation.system == "be \ufffd brief"


def test_a_conversation_file_with_lone_surrogates_is_refused_in_one_line(tmp_path):
    session = Session(chat_model(), GREEDY, model_path=tmp_path / "m.gguf")
    path = tmp_path / "talk.json"
    chat(session, "one", f"/save {path}", "/quit")
    path.write_text(path.read_text().replace('"one"', '"one \\udcff"'))
    other = Session(chat_model(), GREEDY, model_path=tmp_path / "m.gguf")
    code, output = chat(other, f"/open {path}", "/quit")
    assert "message 1 holds characters that are not text (lone surrogates); not opened" in output
    assert other.conversation.exchanges == []


def test_the_start_up_line_is_one_short_line():
    code, output = chat(Session(chat_model(), GREEDY), "/quit")
    first = output.splitlines()[0]
    assert first.startswith("llama-chat: tiny on cpu, float32 weights, decode step eager, context 512 tokens")
    assert len(first) <= 120 and "measured" not in output


def test_info_reads_the_model_file_and_says_so_when_there_is_none(tmp_path):
    from gguf import GGMLQuantizationType as QType

    from .test_gguf import tiny_hf_model, write_gguf

    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=1), qtype=QType.Q8_0)
    session = Session(chat_model(), GREEDY, model_path=path)
    code, output = chat(session, "/info", "/quit")
    assert "layers:" in output and "Q8_0:" in output and str(path) in output
    code, output = chat(Session(chat_model(), GREEDY), "/info", "/quit")
    assert "tiny was not loaded from a file: there is nothing to read" in output
