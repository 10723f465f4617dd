import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

import llama_chat.cli.loaders
import llama_chat.repl.app
from llama_chat import SamplingSettings
from llama_chat.chat.display import visible
from llama_chat.chat.session import Session
from llama_chat.cli import main
from llama_chat.cli.chat import chat_parser, settle_flags
from llama_chat.cli.load_progress import LoadProgress

from .test_session import chat_model


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def loads(monkeypatch):
    """Every model load gives a tiny chat model; returns the list of (path, options) asked for."""
    calls = []

    def load(path, options, **keywords):
        calls.append((str(path), as_keywords(options, **keywords)))
        return chat_model(name="tiny")

    monkeypatch.setattr(llama_chat.cli.loaders, "load", load)
    return calls


def as_keywords(options, **keywords) -> dict:
    """A load's options as the keywords llama_chat.load takes for them, with the others it was given."""
    kernel_dtype = options.kernels.kernel_dtype
    return {"device": options.device, "dtype": options.dtype, "chat_format": options.chat_format,
            "quantize": options.quantize, "kernel_dtype": str(kernel_dtype or "auto").removeprefix("torch."),
            "kv_dtype": options.kv_dtype, **keywords}


def greedy_reply(text, **settings):
    session = Session(chat_model(), SamplingSettings(temperature=0, **settings))
    turn = session.send(text)
    turn.run()
    return turn.text


def test_prompt_prints_only_the_reply_and_stats_go_to_stderr(loads, capsys):
    code = main(["--model", "tiny.gguf", "-p", "hello", "--temperature", "0", "--max-tokens", "5", "--stats"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out == visible(greedy_reply("hello", max_tokens=5)) + "\n"
    assert err.count("\n") == 1 and "tokens" in err and "cached tokens" in err
    assert loads == [("tiny.gguf", {"device": "auto", "dtype": "auto", "chat_format": None, "quantize": "auto",
                               "kernel_dtype": "auto", "shard": None, "progress": LoadProgress,
                               "kv_dtype": "auto"})]


def test_a_draft_model_is_loaded_in_the_default_weights_mode_and_keeps_the_reply(loads, capsys):
    argv = ["--model", "tiny.gguf", "-p", "hello", "--temperature", "0", "--max-tokens", "12", "--quantize", "none",
            "--dtype", "float32", "--draft", "tiny.gguf", "--lookup", "3"]
    assert main(argv) == 0
    assert capsys.readouterr().out == visible(greedy_reply("hello", max_tokens=12)) + "\n"
    assert [options.get("quantize", "auto") for _, options in loads] == ["none", "auto"]
    assert loads[1][1]["device"] == "auto" and loads[1][1]["dtype"] is None


def test_piped_stdin_is_the_prompt(loads, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
    assert main(["--model", "tiny.gguf", "--temperature", "0", "--max-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out == visible(greedy_reply("hello", max_tokens=4)) + "\n" and err == ""


def test_raw_is_plain_completion(loads, capsys):
    assert main(["--model", "tiny.gguf", "--raw", "-p", "Once upon", "--max-tokens", "3"]) == 0
    assert loads[0][1]["chat_format"] == "plain"


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-1", "-p", "x"], "temperature must be 0 (greedy) or more"),
    (["--top-p", "1.5", "-p", "x"], "top_p must be in (0, 1]"),
    (["--max-tokens", "0", "-p", "x"], "max_tokens must be a positive number"),
    (["--seed", str(2**64), "-p", "x"], "seed must be a whole number from 0 to 2**63 - 1"),
    (["--ctx-size", "0", "-p", "x"], "--ctx-size must be a positive number"),
    (["--raw"], "--raw needs a prompt"),
    (["--lookup", "some", "-p", "x"], "--lookup takes auto or a number of tokens (0: off), not 'some'"),
    (["--tp", "2", "--device", "cuda", "-p", "x"], "--tp runs on the cpu (gloo), not on cuda"),
    (["--tool-env", "HF_TOKEN,OPENAI_API_KEY=sk", "-p", "x"],
     "--tool-env: 'OPENAI_API_KEY=sk' is not the name of a variable: give names such as HF_TOKEN"),
])
def test_bad_usage_exits_2_with_one_line_before_loading(loads, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(sys, "stdin", FakeTerminal())
    assert main(["--model", "tiny.gguf", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llama-chat: ") and message in err and err.count("\n") == 1
    assert loads == []


def test_settled_flags_put_tensor_parallelism_on_the_cpu():
    options = chat_parser().parse_args(["--tp", "2", "-p", "x"])
    settle_flags(options)
    assert options.device == "cpu"
    alone = chat_parser().parse_args(["-p", "x"])
    settle_flags(alone)
    assert alone.device == "auto"


def test_empty_stdin_is_bad_usage(loads, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    assert main(["--model", "tiny.gguf"]) == 2
    assert "stdin is empty" in capsys.readouterr().err


def test_unparsable_flag_values_exit_2(capsys):
    for argv in (["--temperature", "nan"], ["--top-k", "many"], ["--kv-dtype", "int3"]):
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "not a finite number: 'nan'" in err and "argument --kv-dtype: invalid choice: 'int3'" in err


def test_missing_model_is_a_runtime_error_exit_1(tmp_path, capsys):
    assert main(["--model", str(tmp_path / "nothing.gguf"), "-p", "hi"]) == 1
    err = capsys.readouterr().err
    assert err == f"llama-chat: {tmp_path / 'nothing.gguf'}: no such file or directory\n"


def test_subcommands_still_go_through_the_error_boundary(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith("llama-chat: ")


def typed_chats(monkeypatch, *typed: list[str]) -> tuple[list[Session], io.StringIO]:
    """Each interactive chat that main() opens reads the next list of lines as typed (with
    the options main gives it, the keeper among them); returns the sessions the chats had
    and what they showed."""
    monkeypatch.setattr(sys, "stdin", FakeTerminal())
    shown, sessions, lines = io.StringIO(), [], iter(typed)
    real_run_repl = llama_chat.repl.app.run_repl

    def run_repl_typing(session, load_model, renderer, **options):
        sessions.append(session)
        renderer.console = Console(file=shown, width=200)
        with create_pipe_input() as pipe:
            pipe.send_text("".join(line + "\r" for line in next(lines)))
            return real_run_repl(session, load_model, renderer=renderer, input=pipe, output=DummyOutput(),
                                 history=InMemoryHistory(), **options)

    monkeypatch.setattr(llama_chat.repl.app, "run_repl", run_repl_typing)
    return sessions, shown


def test_flags_reach_the_interactive_chat(loads, monkeypatch, tmp_path):
    sessions, shown = typed_chats(monkeypatch, ["/settings", "hello", "/load other.gguf", "/quit"])
    argv = ["--model", "tiny.gguf", "--temperature", "0.1", "--top-k", "3", "--top-p", "0.8", "--min-p", "0.2",
            "--repeat-penalty", "1.2", "--repeat-last-n", "8", "--max-tokens", "4", "--seed", "9",
            "--system", "Be brief.", "--ctx-size", "256", "--device", "cpu", "--dtype", "float32",
            "--chat-format", "chatml", "--think", "show"]
    assert main(argv) == 0
    session = sessions[0]
    assert session.settings == SamplingSettings(temperature=0.1, top_k=3, top_p=0.8, min_p=0.2, repeat_penalty=1.2,
                                                repeat_last_n=8, max_tokens=4, seed=9)
    assert session.conversation.system == "Be brief." and session.capacity == 256
    assert "temperature = 0.1" in shown.getvalue() and "context = 256 tokens" in shown.getvalue()
    assert "think = show" in shown.getvalue()
    assert [e.user for e in session.conversation.exchanges] == ["hello"]
    # /load goes through the same loader, with the command line's device, dtype and format.
    assert loads[1] == ("other.gguf", {"device": "cpu", "dtype": "float32", "chat_format": "chatml", "quantize": "auto",
                                       "kernel_dtype": "auto", "shard": None, "progress": LoadProgress,
                                       "kv_dtype": "auto"})


# Bytes that are not UTF-8 reach Python as lone surrogates (its "surrogateescape" rule).
UNDECODABLE = "hello \udcff\udcfe world"


@pytest.mark.parametrize("where", ["-p", "stdin", "--raw", "--system"])
def test_text_that_is_not_utf8_is_read_with_replacement_characters(loads, capsys, monkeypatch, where):
    argv = ["--model", "tiny.gguf", "--temperature", "0", "--max-tokens", "4"]
    if where == "stdin":
        monkeypatch.setattr(sys, "stdin", io.StringIO(UNDECODABLE))
    elif where == "--system":
        argv += ["--system", UNDECODABLE, "-p", "hello"]
    else:
        argv += (["--raw"] if where == "--raw" else []) + ["-p", UNDECODABLE]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    shown = where if where != "--raw" else "-p"
    assert err == f"llama-chat: {shown} had 2 bytes that are not UTF-8 text; each is read as U+FFFD (\ufffd)\n"
    if where in ("-p", "stdin"):
        assert out == visible(greedy_reply("hello \ufffd\ufffd world", max_tokens=4)) + "\n"


def test_an_empty_prompt_is_refused_as_an_empty_stdin_is(loads, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", FakeTerminal())
    assert main(["--model", "tiny.gguf", "-p", ""]) == 2
    assert main(["--model", "tiny.gguf", "-p", "  \n"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("-p is empty: there is nothing to answer") == 2
    assert loads == []


def test_one_shot_turns_chain_through_open_and_save(loads, capsys, tmp_path):
    """Three runs, each one more turn of a saved conversation, reply as one session does;
    the second and third read nothing again (the cache came with the file)."""
    conversation = str(tmp_path / "c.json")
    common = ["--model", "tiny.gguf", "--temperature", "0", "--max-tokens", "6", "--stats", "--save", conversation]
    replies, errors = [], []
    for number, text in enumerate(["one", "two", "three"]):
        opening = ["--open", conversation] if number else []
        assert main([*common, *opening, "-p", text]) == 0
        out, err = capsys.readouterr()
        replies.append(out)
        errors.append(err)
    session = Session(chat_model(), SamplingSettings(temperature=0, max_tokens=6))
    for text, reply in zip(["one", "two", "three"], replies):
        turn = session.send(text)
        turn.run()
        assert reply == visible(turn.text) + "\n"
    assert "opened" in errors[2] and "2 exchanges" in errors[2]
    # A flag given with --open wins over the conversation's saved setting.
    assert main(["--model", "tiny.gguf", "--open", conversation, "-p", "four", "--max-tokens", "2", "--stats"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].split(" tokens,")[0].endswith("2")
    cached = int(errors[2].split(" tokens cached")[0].rsplit(" ", 1)[1])
    assert cached > 20 and f"+ {cached} cached tokens" in errors[2]


def test_resume_reopens_the_conversation_kept_by_the_chat(loads, monkeypatch, capsys):
    seen, _ = typed_chats(monkeypatch, ["hello", "/quit"], ["/quit"])
    assert main(["--model", "tiny.gguf", "--resume", "--temperature", "0"]) == 0
    assert "no conversation kept yet" in capsys.readouterr().err
    assert main(["--model", "tiny.gguf", "--resume", "--temperature", "0"]) == 0
    first, resumed = seen
    assert [e.user for e in resumed.conversation.exchanges] == ["hello"]
    assert resumed.conversation.exchanges[0].reply == first.conversation.exchanges[0].reply
    assert resumed.cache.tokens == first.cache.tokens[: len(resumed.cache.tokens)] and len(resumed.cache) > 10
    assert "resumed" in capsys.readouterr().err


def test_resume_after_the_chat_was_killed(tmp_path):
    """In a pseudo-terminal: a reply, then SIGKILL; --resume has the exchange and its cache."""
    from gguf import GGMLQuantizationType as QType

    from .terminal import Terminal
    from .test_gguf import tiny_hf_model, write_gguf

    model_file = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5), qtype=QType.F32)
    state = {"XDG_STATE_HOME": str(tmp_path / "state")}
    command = [sys.executable, "-m", "llama_chat", "-m", str(model_file), "--compile", "off", "--temperature", "0",
               "--max-tokens", "8"]
    chat = Terminal(command, state)
    try:
        assert chat.read_until(b"Ctrl-D leaves", 60), chat.text()
        sent = len(chat.output)
        chat.type(b"hello\r")
        assert chat.read_until(b"tok/s", 60, after=sent), chat.text()
        # The exchange is kept once the input is handled, before the next prompt.
        assert chat.read_prompt(30, after=chat.output.index(b"tok/s", sent)), chat.text()
    finally:
        chat.kill()
    resumed = subprocess.run([*command, "--resume", "-p", "again", "--stats"], capture_output=True, text=True,
                             timeout=120, env={**os.environ, **state})
    assert resumed.returncode == 0, resumed.stderr
    line = next(line for line in resumed.stderr.splitlines() if "resumed" in line)
    assert "1 exchange," in line
    cached = int(line.split(" tokens cached")[0].rsplit(" ", 1)[1])
    assert cached > 5 and f"+ {cached} cached tokens" in resumed.stderr


def test_bytes_piped_in_under_a_strict_locale_are_read_with_replacement_characters(tmp_path):
    """Real bytes through a real pipe, with Python's stdin decoding strict (as under
    en_US.UTF-8): one warning line, no traceback, a reply."""
    from gguf import GGMLQuantizationType as QType

    from .test_gguf import tiny_hf_model, write_gguf

    model_file = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5), qtype=QType.F32)
    command = [sys.executable, "-m", "llama_chat", "-m", str(model_file), "--compile", "off", "--max-tokens", "3"]
    finished = subprocess.run(command, input=b"hello \xff\xfe world\n", capture_output=True, timeout=120,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "en_US.UTF-8"})
    assert finished.returncode == 0, finished.stderr.decode(errors="replace")
    err = finished.stderr.decode()
    assert "stdin had 2 bytes that are not UTF-8 text" in err and "Traceback" not in err


def test_the_models_recommended_sampling_sits_between_flags_and_defaults(monkeypatch):
    """Flags and slash commands, then the model file, then its card, then llama-chat's
    defaults; /settings says where each value came from."""

    def load(path, options, **keywords):
        model = chat_model(name="tiny")
        model.recommended = (("model card", {"temperature": 0.2, "top_p": 0.9, "top_k": 20}),
                             ("model file", {"temperature": 0.15, "top_k": 30}))
        return model

    monkeypatch.setattr(llama_chat.cli.loaders, "load", load)
    sessions, shown = typed_chats(monkeypatch, ["/min_p 0.1", "/settings", "/quit"])
    assert main(["--model", "tiny.gguf", "--top-k", "5"]) == 0
    settings = sessions[0].settings
    assert (settings.temperature, settings.top_k, settings.min_p, settings.top_p) == (0.15, 5, 0.1, 0.9)
    text = shown.getvalue()
    assert "temperature = 0.15 (model file)" in text and "top_k = 5 (command line)" in text
    assert "min_p = 0.1 (set in the chat)" in text and "top_p = 0.9 (model card)\n" in text


def test_settings_show_a_model_files_float32_as_its_author_wrote_it(tmp_path, monkeypatch):
    from .test_gguf import tiny_hf_model, write_gguf

    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(seed=1),
                      extra=lambda writer: writer.add_float32("general.sampling.temp", 0.15))
    sessions, shown = typed_chats(monkeypatch, ["/settings", "/quit"])
    assert main(["--model", str(path), "--compile", "off"]) == 0
    assert "temperature = 0.15 (model file)\n" in shown.getvalue()


@pytest.mark.parametrize("why", ["Not a directory", "Permission denied"])
def test_a_cache_folder_that_cannot_be_written_is_reported_once_and_the_chat_goes_on(tmp_path, monkeypatch, capsys,
                                                                                    why):
    from gguf import GGMLQuantizationType as QType

    import llama_chat.paths

    from .test_gguf import tiny_hf_model, write_gguf

    model_file = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5), qtype=QType.Q8_0)
    if why == "Not a directory":  # a file where the folder would be
        (tmp_path / "a file").write_text("")
        monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path / "a file" / "cache"))
    else:  # a read-only folder (as root, permissions deny nothing: the access check is told so)
        read_only, real_access = tmp_path / "cache", os.access
        read_only.mkdir(mode=0o555)
        monkeypatch.setenv("LLAMA_CHAT_CACHE", str(read_only))
        monkeypatch.setattr(llama_chat.paths.os, "access", lambda path, mode: Path(path) != read_only
                            and real_access(path, mode))
    for _ in range(2):
        assert main(["-m", str(model_file), "-p", "hello", "--max-tokens", "3", "--compile", "wait"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 2 and "Traceback" not in err
    assert err.count(f"cannot be written ({why}); running without it") == 1
