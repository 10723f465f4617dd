"""A model's chat template runs in a process of its own, under limits of time, output and memory."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import llama_chat
from llama_chat.chat.session import Session
from llama_chat.cli import main
from llama_chat.errors import LlamaChatError
from llama_chat.text import template_runner
from llama_chat.text.template_runner import TemplateRunner, UnusableTemplateError

from .test_gguf import tiny_hf_model, write_gguf
from .test_repl import chat
from .test_session import GREEDY, assert_consistent, chat_model, say

LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
FLOOD = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"
# Loops that never write (an empty loop body is done in moments): hours of rendering.
SPIN = ("{% set ns = namespace(n=0) %}{% for a in range(100000) %}{% for b in range(100000) %}"
        "{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}")
HOARD = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}"
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture
def short_time_limit(monkeypatch):
    monkeypatch.setattr(template_runner, "RENDER_SECONDS", 0.5)


@pytest.mark.parametrize(
    ("source", "limit", "seconds"),
    # The output and memory limits under the usual time limit: on a busy machine, half a
    # second could pass before half a gigabyte is taken.
    [(LOOPS, "ran for more than 0.5 s", 0.5), (FLOOD, "wrote more than 1,048,576 characters", None),
     (HOARD, "needed more than 512 MB of memory", None)],
)
def test_a_template_past_a_limit_is_stopped_and_never_run_again(monkeypatch, source, limit, seconds):
    if seconds is not None:
        monkeypatch.setattr(template_runner, "RENDER_SECONDS", seconds)
    runner = TemplateRunner(source, "hostile.gguf", context_length=2048)
    with pytest.raises(UnusableTemplateError) as first:
        runner.render({"messages": []})
    assert str(first.value) == (
        f"the chat template of hostile.gguf {limit}, so llama-chat stopped it; "
        "use --chat-format to pick another (llama2, llama3, chatml, gemma, plain, template)"
    )
    assert runner._worker is None  # its process was ended
    with pytest.raises(UnusableTemplateError) as again:
        runner.render({"messages": []})
    assert str(again.value) == str(first.value) and runner._worker is None  # refused without a new process


def test_the_output_limit_grows_with_the_context():
    writes_two_million = "{% for i in range(2000) %}{{ 'y' * 1000 }}{% endfor %}"
    assert len(TemplateRunner(writes_two_million, "long.gguf", context_length=262144).render({})) == 2_000_000
    with pytest.raises(UnusableTemplateError, match="wrote more than 1,048,576 characters"):
        TemplateRunner(writes_two_million, "short.gguf", context_length=4096).render({})


def test_a_template_of_megabytes_is_refused_before_it_runs():
    with pytest.raises(UnusableTemplateError, match="is 2,097,152 characters long, more than the 1,048,576"):
        TemplateRunner("x" * (2 << 20), "huge.gguf", context_length=2048)


def test_the_worker_restarts_after_ctrl_c_and_after_running_out_of_memory(monkeypatch):
    runner = TemplateRunner(CHATML, "fine.gguf", context_length=2048)
    assert runner.render({"messages": [{"role": "user", "content": "hi"}]}) == "<|im_start|>user\nhi<|im_end|>\n"
    first = runner._worker.process

    def interrupted(request, seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner._worker, "ask", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.render({"messages": []})
    assert first.poll() is not None  # the interrupted worker was ended, not left mid-request
    assert runner.render({"messages": [], "add_generation_prompt": True}) == "<|im_start|>assistant\n"
    assert runner._worker.process is not first


def test_errors_inside_the_template_stay_errors_of_one_conversation():
    runner = TemplateRunner("{{ raise_exception('roles must alternate') }}", "strict.gguf", context_length=2048)
    with pytest.raises(LlamaChatError, match="of strict.gguf rejected the conversation: roles must alternate"):
        runner.render({})
    assert runner.refusal is None  # another conversation may render


def test_a_hostile_template_ends_a_one_shot_chat_with_one_line(tmp_path, capsys):
    path = write_gguf(tmp_path / "flood.gguf", tiny_hf_model(), chat_template=FLOOD)
    assert main(["--model", str(path), "--device", "cpu", "-p", "hi"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "the chat template of flood.gguf wrote more than 1,048,576 characters" in error
    assert "--chat-format" in error


def test_the_chat_format_flag_leaves_a_hostile_template_unrun(tmp_path, capsys):
    path = write_gguf(tmp_path / "flood.gguf", tiny_hf_model(), chat_template=FLOOD)
    assert main(["--model", str(path), "--device", "cpu", "-p", "hi", "--chat-format", "plain",
                 "--max-tokens", "2"]) == 0


def test_load_of_a_file_with_a_hostile_template_keeps_the_model_and_the_conversation(tmp_path, short_time_limit):
    path = write_gguf(tmp_path / "loops.gguf", tiny_hf_model(), chat_template=LOOPS)
    model = chat_model()
    session = Session(model, GREEDY)
    code, output = chat(session, "one", f"/load {path}", "two", "/quit",
                        load_model=lambda path: llama_chat.load(path, device="cpu"))
    assert code == 0
    assert "the chat template of loops.gguf ran for more than 0.5 s" in output
    assert session.model is model and [e.user for e in session.conversation.exchanges] == ["one", "two"]


def test_a_template_that_hangs_late_in_a_chat_refuses_the_turn_and_loses_nothing(short_time_limit):
    hangs_on_the_fifth_message = "{% if messages | length > 4 %}" + LOOPS + "{% endif %}" + CHATML
    model = chat_model(template=hangs_on_the_fifth_message, format_name="template")
    session = Session(model, GREEDY)
    say(session, "one")
    say(session, "two")
    kept = (session.conversation.messages(), list(session.cache.tokens))
    with pytest.raises(UnusableTemplateError, match="ran for more than 0.5 s"):
        session.send("three")
    assert (session.conversation.messages(), list(session.cache.tokens)) == kept
    with pytest.raises(UnusableTemplateError, match="ran for more than 0.5 s"):
        session.send("four")  # refused at once: the worker is not started again
    assert model.chat_format.runner._worker is None
    assert session.conversation.messages() == kept[0]



@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGHUP"])
def test_a_render_ends_with_the_process_that_asked_for_it(signal_name):
    """The chat killed (or its terminal closed) while a looping template renders: the
    renderer, in a session of its own, goes (its watch looks every 0.25 s) instead of looping
    on for hours."""
    asker = subprocess.Popen(
        [sys.executable, "-c",
         "from llama_chat.text.template_runner import TemplateRunner\n"
         f"runner = TemplateRunner({SPIN!r}, 'hostile.gguf', context_length=2048)\n"
         "print('ready', flush=True)\n"
         "runner.render({'messages': []})"],
        stdout=subprocess.PIPE, text=True,
    )
    assert asker.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 10
    while not (workers := _workers_of(asker.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 1  # the renderer, at work (its limit is 5 s, far off)
    asker.send_signal(getattr(signal, signal_name))
    asker.wait()
    deadline = time.monotonic() + 2.0  # the target: nothing of llama-chat's outlives a chat by more
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in workers if _running(pid)] == []


def _workers_of(parent: int) -> list[int]:
    """The renderers whose parent is `parent`, read from /proc (ps cuts long command lines to
    the width of a terminal it finds on any of its standard streams)."""
    workers = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int(_stat_fields(entry.name)[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that has just ended
        if ppid == parent and b"template_worker" in command:
            workers.append(int(entry.name))
    return workers


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name: state, ppid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for a parent to collect it."""
    try:
        state = _stat_fields(pid)[0]
    except OSError:
        return False
    return state != "Z"


def test_a_render_past_its_cpu_time_is_ended_by_the_system():
    """The bound of a render whose chat is not there to stop it: its CPU time."""
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\n"
         "from llama_chat.text import template_worker\n"
         "template_worker.RENDER_CPU_SECONDS = 1\n"
         "template_worker.serve(sys.stdin.buffer, sys.stdout.buffer)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    assert b'"ready"' in worker.stdout.readline()
    worker.stdin.write(json.dumps({"source": SPIN, "variables": {}, "max_chars": 100}).encode() + b"\n")
    worker.stdin.flush()
    assert worker.wait(timeout=60) == -signal.SIGXCPU


# The renderer's own failures: it does not start, it dies, or the template does not compile.
# Each is one line, and the chat goes on.
NESTED_TOO_DEEP = "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}"  # Jinja's parser recurses past Python's limit
PICK = "use --chat-format to pick another (llama2, llama3, chatml, gemma, plain, template)"


def renderer_start_failing_once(monkeypatch, fail) -> None:
    """The first start of a renderer goes through `fail(command, **options)`; later ones start
    as usual."""
    real_popen = subprocess.Popen
    starts = []

    def popen(command, **options):
        if "llama_chat.text.template_worker" in command and not starts:
            starts.append(command)
            return fail(real_popen, command, **options)
        return real_popen(command, **options)

    monkeypatch.setattr(template_runner.subprocess, "Popen", popen)


def cannot_fork(real_popen, command, **options):
    raise OSError(11, "Resource temporarily unavailable")


def without_jinja(directory):
    """A renderer that finds a jinja2 that will not import, as where it is not installed."""
    (directory / "jinja2").mkdir()
    (directory / "jinja2" / "__init__.py").write_text("raise ImportError('no jinja2 here')\n")

    def start(real_popen, command, *, env, **options):
        env = {**env, "PYTHONPATH": os.pathsep.join([str(directory), env["PYTHONPATH"]])}
        return real_popen(command, env=env, **options)

    return start


@pytest.mark.parametrize("failure, message", [
    ("cannot fork", "could not start the chat template's renderer: [Errno 11] Resource temporarily unavailable"),
    ("no jinja2", "the chat template's renderer did not start (is jinja2 installed?)"),
])
def test_a_renderer_that_does_not_start_refuses_one_turn_and_the_next_starts_it(monkeypatch, tmp_path, failure,
                                                                                message):
    model = chat_model(template=CHATML, format_name="template")
    session = Session(model, GREEDY)
    model.chat_format.runner.close()  # the next render starts a renderer: the first message's
    renderer_start_failing_once(monkeypatch, cannot_fork if failure == "cannot fork" else without_jinja(tmp_path))
    code, output = chat(session, "one", "two", "/quit")
    assert code == 0 and "Traceback" not in output
    assert [line for line in output.splitlines() if "renderer" in line] == [message]
    assert [e.user for e in session.conversation.exchanges] == ["two"]  # the turn refused left nothing behind
    assert session.transcript.spans.get(session.conversation.exchanges[0]).reply and session.transcript.ids is not None


def test_a_renderer_that_dies_is_one_line_and_the_chat_goes_on_with_another_model():
    """The renderer killed (by the system, out of memory, say): its template is refused from
    then on, without a new process each turn; /load of another model carries on the chat."""
    model = chat_model(template=CHATML, format_name="template")
    session = Session(model, GREEDY)
    say(session, "one")
    worker = model.chat_format.runner._worker.process
    worker.kill()
    worker.wait()
    other = chat_model(name="other")
    code, output = chat(session, "two", "three", "/load other.gguf", "four", "/quit", load_model=lambda path: other)
    assert code == 0 and "Traceback" not in output
    crashed = f"the chat template of the model crashed its renderer, so llama-chat stopped it; {PICK}"
    assert [line for line in output.splitlines() if "renderer" in line] == [crashed, crashed]
    assert model.chat_format.runner._worker is None  # refused at once the second time: no new renderer
    assert session.model is other and [e.user for e in session.conversation.exchanges] == ["one", "four"]
    assert_consistent(session)


def test_a_template_that_does_not_compile_is_refused_at_load_and_the_chat_goes_on(tmp_path):
    """Not a syntax error Jinja reports but a failure while compiling: too deeply nested for
    its parser."""
    path = write_gguf(tmp_path / "deep.gguf", tiny_hf_model(), chat_template=NESTED_TOO_DEEP)
    model = chat_model()
    session = Session(model, GREEDY)
    code, output = chat(session, "one", f"/load {path}", "two", "/quit",
                        load_model=lambda path: llama_chat.load(path, device="cpu"))
    assert code == 0 and "Traceback" not in output
    refused = [line for line in output.splitlines() if "could not load" in line]
    assert refused == [f"could not load {path}: the chat template of deep.gguf is invalid: RecursionError: "
                       f"maximum recursion depth exceeded in comparison; {PICK}; still chatting with tiny"]
    assert session.model is model and [e.user for e in session.conversation.exchanges] == ["one", "two"]
