"""llama-chat's own tools: file tools that touch only the folders they are given, refusing
in one line before anyone is asked, and a shell tool whose command, and all it started,
ends however its run ends."""

import argparse
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import llguidance
import pytest

from llama_chat.chat.exchange import Outcome
from llama_chat.chat.consent import ALL, Consent
from llama_chat.chat.tool_runner import ToolRunner
from llama_chat.cli.tool_options import add_tool_arguments, tool_use_from
from llama_chat.errors import LlamaChatError
from llama_chat.text.tool_calls import ToolCall
from llama_chat.tools import file_changes, read_tools, search_tool
from llama_chat.tools.built_in import built_in_tools
from llama_chat.tools.checks import Refused, check_arguments
from llama_chat.tools.folders import Folders
from llama_chat.tools.shell_tool import RunCommand
from llama_chat.tools.tool import BUILT_IN, Tool, ToolResult

from .processes import MARK, marked, marker  # noqa: F401  (marker: a fixture)
from .signals import ctrl_c_raises
from .waiting import wait_until

NAMES = ["read_file", "list_directory", "search_files", "write_file", "edit_file", "run_command"]
FIND = "list_directory or search_files finds the right name"


@pytest.fixture
def work(tmp_path) -> Path:
    """The working folder, inside a folder of the test's own (what lies beside it is outside)."""
    folder = Path(os.path.realpath(tmp_path)) / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def tools(work) -> dict:
    return {tool.spec.name: tool for tool in built_in_tools(Folders(work))}


def outside_line(tool: str, given: str, folders: str, leads: str = "") -> str:
    return (f"{tool}: {given}{leads} is outside the folders the tools may use ({folders}, and folders the user "
            f"adds with /tools folder): ask for a path inside them")


def within(seconds: float, work):
    """What `work()` gives, run in a thread and waited for (its end, not a fixed time) up to a
    generous `seconds`."""
    given = []
    thread = threading.Thread(target=lambda: given.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert given, f"still at work after {seconds} s"
    return given[0]


def refused_both_ways(tool, arguments) -> str:
    """The refusal, checked to be what a run gives too (a run makes its own checks)."""
    refusal = tool.refusal(arguments)
    assert refusal is not None
    assert tool.run(arguments) == ToolResult(refusal, is_error=True)
    return refusal


# The tools as the model sees them


def test_the_built_in_tools_and_their_schemas(tools):
    assert list(tools) == NAMES
    for tool in tools.values():
        assert isinstance(tool, Tool)
        assert tool.spec.source == BUILT_IN
        schema = tool.spec.parameters
        jsonschema.validators.validator_for(schema).check_schema(schema)
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])
        # the chat's grammar engine takes the schema as it is
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        assert llguidance.LLMatcher.validate_grammar(grammar, None) == ""


EXAMPLES = {
    "read_file": ({"path": "a.txt"}, {"path": "a.txt", "offset": 3, "limit": 10}),
    "list_directory": ({}, {"path": "src"}),
    "search_files": ({"pattern": "**/*.py"}, {"pattern": "*.md", "text": "TODO", "path": "docs"}),
    "write_file": ({"path": "a.txt", "content": ""},),
    "edit_file": ({"path": "a.txt", "old_text": "x", "new_text": ""},),
    "run_command": ({"command": "ls -l"},),
}
WRONG = {
    "read_file": ({}, {"path": ""}, {"path": "a", "offset": 0}, {"path": "a", "limit": 2001}, {"path": "a", "x": 1},
                  {"path": "a", "offset": True}, {"path": "a", "offset": 1.5}, {"path": 7}),
    "list_directory": ({"path": None}, {"folder": "."}),
    "search_files": ({"text": "x"}, {"pattern": "*", "text": ""}, {"pattern": ["*"]}),
    "write_file": ({"path": "a.txt"}, {"path": "a.txt", "content": 1}),
    "edit_file": ({"path": "a", "old_text": "", "new_text": "y"}, {"path": "a", "old_text": "x"}),
    "run_command": ({"command": ""}, {"cmd": "ls"}),
}


@pytest.mark.parametrize("name", NAMES)
def test_the_arguments_a_schema_allows_are_those_the_tool_takes(tools, name):
    """jsonschema, an independent validator, and the tools' own check agree on each example."""
    spec = tools[name].spec
    for arguments in EXAMPLES[name]:
        jsonschema.validate(arguments, spec.parameters)
        check_arguments(spec, arguments)
    for arguments in WRONG[name]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(arguments, spec.parameters)
        with pytest.raises(Refused, match=f"^{name}: .*: call {name} again with the arguments its schema allows$"):
            check_arguments(spec, arguments)


def test_arguments_that_do_not_fit_are_refused_in_one_line(tools):
    redo = "call read_file again with the arguments its schema allows"
    read = tools["read_file"]
    assert refused_both_ways(read, {"path": 7}) == f"read_file: path must be a non-empty string, not 7: {redo}"
    assert refused_both_ways(read, {"path": "a", "offset": 0}) == (
        f"read_file: offset must be an integer at least 1, not 0: {redo}")
    assert refused_both_ways(read, {"path": "a", "limit": 9999}) == (
        f"read_file: limit must be an integer at least 1 and at most 2000, not 9999: {redo}")
    assert refused_both_ways(read, {"file": "a"}) == (
        f"read_file: it takes no argument \"file\" (only path, offset, limit): {redo}")
    assert refused_both_ways(read, {}) == f"read_file: the argument path is missing: {redo}"
    assert refused_both_ways(read, ["a"]) == f"read_file: its arguments must be a JSON object, not [\"a\"]: {redo}"


# Confinement


def test_paths_outside_the_folders_are_refused_before_anyone_is_asked(work, tools):
    secret = work.parent / "secret.txt"
    secret.write_text("hidden\n")
    (work / "out").symlink_to(secret)
    read = tools["read_file"]
    assert refused_both_ways(read, {"path": str(secret)}) == outside_line("read_file", str(secret), str(work))
    assert refused_both_ways(read, {"path": "../secret.txt"}) == outside_line("read_file", "../secret.txt", str(work))
    assert refused_both_ways(read, {"path": "out"}) == outside_line("read_file", "out", str(work),
                                                                    f" (it leads to {secret})")
    assert refused_both_ways(read, {"path": "sub/../../secret.txt"}) == outside_line(
        "read_file", "sub/../../secret.txt", str(work))


@pytest.mark.parametrize("name, arguments", [
    ("list_directory", {"path": ".."}),
    ("search_files", {"pattern": "*", "path": "../outside"}),
    ("write_file", {"path": "../outside/new.txt", "content": "x"}),
    ("write_file", {"path": "link/new.txt", "content": "x"}),
    ("edit_file", {"path": "../outside/old.txt", "old_text": "old", "new_text": "new"}),
])
def test_every_file_tool_is_confined(work, tools, name, arguments):
    outside = work.parent / "outside"
    outside.mkdir()
    (outside / "old.txt").write_text("old\n")
    (work / "link").symlink_to(outside)
    refusal = refused_both_ways(tools[name], arguments)
    assert refusal.startswith(f"{name}: {arguments['path']}")
    assert refusal.endswith(f"is outside the folders the tools may use ({work}, and folders the user adds with "
                            "/tools folder): ask for a path inside them")
    assert sorted(path.name for path in outside.iterdir()) == ["old.txt"]
    assert (outside / "old.txt").read_text() == "old\n"


# A folder swapped for a link while the tools use it

RACE_SECONDS = 3.0  # how long the suite runs the race (the tools held 20 s of it too)
INSIDE = {"sub/file.txt": "inside marker\n", "sub/edit.txt": "a marker\n"}
ELSEWHERE = {"file.txt": "SECRET marker\n", "edit.txt": "a marker\n", "only-elsewhere.txt": "SECRET marker\n"}


class AllowedView:
    """A front end for calls allowed ahead: nothing is asked, results are kept."""

    def show_call(self, call, tool, preview) -> None:
        pass

    def ask(self, call, tool):
        raise AssertionError("a call allowed ahead was asked about")

    def show_result(self, call, result) -> None:
        pass


def swap_race(work: Path, folders: Folders, seconds: float = RACE_SECONDS) -> dict[str, list]:
    """Every file tool called through the runner, again and again, for `seconds` and until
    each has worked at least once, while a thread swaps the folder sub for a link to a folder
    outside and back as fast as it can; the results by tool."""
    elsewhere = work.parent / "elsewhere"
    elsewhere.mkdir()
    for name, text in ELSEWHERE.items():
        (elsewhere / name).write_text(text)
    (work / "sub").mkdir()
    for name, text in INSIDE.items():
        (work / name).write_text(text)
    (work / ".standby").symlink_to(elsewhere)
    stop = threading.Event()

    def put(source: Path, target: Path) -> None:
        """`source` renamed `target`, where a write made a folder of that name while it was gone."""
        while True:
            try:
                return os.rename(source, target)
            except OSError:
                shutil.rmtree(target, ignore_errors=True)

    def swap() -> None:
        sub, away, standby = work / "sub", work / ".away", work / ".standby"
        while not stop.is_set():
            os.rename(sub, away)
            put(standby, sub)  # sub is a link out now
            os.rename(sub, standby)
            put(away, sub)

    runner = ToolRunner(lambda: {tool.spec.name: tool for tool in built_in_tools(folders)},
                        Consent(ahead=frozenset({ALL})), AllowedView())
    calls = [
        ToolCall("read_file", {"path": "sub/file.txt"}, "call00001"),
        ToolCall("list_directory", {"path": "sub"}, "call00002"),
        ToolCall("search_files", {"pattern": "sub/*.txt", "text": "marker"}, "call00003"),
        ToolCall("write_file", {"path": "sub/new.txt", "content": "new marker\n"}, "call00004"),
        ToolCall("write_file", {"path": "sub/deeper/new.txt", "content": "new marker\n"}, "call00005"),
        ToolCall("edit_file", {"path": "sub/edit.txt", "old_text": "a marker", "new_text": "b marker"}, "call00006"),
        ToolCall("edit_file", {"path": "sub/edit.txt", "old_text": "b marker", "new_text": "a marker"}, "call00007"),
    ]
    results: dict[str, list] = {call.name: [] for call in calls}
    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + seconds

        def raced() -> bool:
            for call in calls:
                results[call.name].append(runner.run_call(call))
            worked = all(any(result.outcome == Outcome.RAN for result in kept) for kept in results.values())
            return time.monotonic() > end and worked

        assert wait_until(raced, seconds + 60), "some tool never worked while the folder was swapped"
    finally:
        stop.set()
        thread.join(10)
    return results


@pytest.mark.parametrize("openat2", [pytest.param(None, id="kernel"), pytest.param(False, id="walk")])
def test_a_folder_swapped_for_a_link_never_leads_out(work, openat2):
    """Nothing read from outside, nothing written outside, nothing raised, no descriptor left
    open, whichever way paths are opened (the kernel's openat2 where it has it, or the walk a name
    at a time)."""
    folders = Folders(work) if openat2 is None else Folders(work, openat2=openat2)
    descriptors = set(os.listdir("/proc/self/fd"))
    results = swap_race(work, folders)
    assert set(os.listdir("/proc/self/fd")) == descriptors  # every descriptor opened was closed
    texts = [result.text for kept in results.values() for result in kept]
    assert not [text for text in texts if "SECRET" in text or "only-elsewhere" in text]
    assert not [text for text in texts if text.startswith("the tool failed")]
    assert {path.name: path.read_text() for path in (work.parent / "elsewhere").iterdir()} == ELSEWHERE
    assert sorted(path.name for path in work.parent.iterdir()) == ["elsewhere", "work"]
    # what worked, worked inside
    assert ToolResult("inside marker\n") in [ToolResult(result.text) for result in results["read_file"]]
    assert sorted(path.name for path in work.iterdir()) == [".standby", "sub"]


def test_a_link_inside_to_a_file_inside_is_followed(work, tools):
    (work / "real.txt").write_text("real\n")
    (work / "alias.txt").symlink_to("real.txt")
    assert tools["read_file"].refusal({"path": "alias.txt"}) is None
    assert tools["read_file"].run({"path": "alias.txt"}) == ToolResult("real\n")


def test_a_folder_the_user_adds_is_allowed(work, tmp_path):
    notes = Path(os.path.realpath(tmp_path)) / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("milk\n")
    folders = Folders(work)
    read = {tool.spec.name: tool for tool in built_in_tools(folders)}["read_file"]
    assert read.refusal({"path": "../notes/todo.txt"}) == outside_line("read_file", "../notes/todo.txt", str(work))
    assert folders.add(notes) == notes
    assert read.run({"path": "../notes/todo.txt"}) == ToolResult("milk\n")
    assert read.run({"path": str(notes / "todo.txt")}) == ToolResult("milk\n")
    assert read.refusal({"path": "/"}) == outside_line("read_file", "/", f"{work}, {notes}")


def test_adding_what_is_no_folder_says_so(work):
    (work / "file.txt").write_text("")
    with pytest.raises(LlamaChatError) as raised:
        Folders(work).add("file.txt")
    assert str(raised.value) == "file.txt is not a folder: give one that exists to let the tools use it"


# read_file


def test_read_file_gives_the_lines_asked_for(work, tools):
    (work / "a.txt").write_text("one\ntwo\nthree\nfour")
    read = tools["read_file"]
    assert read.preview({"path": "a.txt"}) is None
    assert read.run({"path": "a.txt"}) == ToolResult("one\ntwo\nthree\nfour")
    assert read.run({"path": "a.txt", "offset": 2, "limit": 2}) == ToolResult("two\nthree\n")
    assert read.run({"path": "a.txt", "offset": 4}) == ToolResult("four")
    assert read.run({"path": "a.txt", "offset": 6}) == ToolResult(
        "read_file: offset 6 is past the end of a.txt, which has 4 lines: give an offset from 1 to 4", is_error=True)
    (work / "empty.txt").write_text("")
    assert read.run({"path": "empty.txt"}) == ToolResult("[empty.txt is empty]")


def test_read_file_refuses_what_it_cannot_read(work, tools):
    (work / "sub").mkdir()
    (work / "nul.bin").write_bytes(b"text\0more")
    (work / "latin1.txt").write_bytes(b"caf\xe9\n")
    os.mkfifo(work / "pipe")
    read = tools["read_file"]
    assert refused_both_ways(read, {"path": "nope.txt"}) == f"read_file: nope.txt does not exist: {FIND}"
    assert refused_both_ways(read, {"path": "sub"}) == (
        "read_file: sub is a folder, not a file: list_directory shows what it holds")
    assert refused_both_ways(read, {"path": "pipe"}) == (
        "read_file: pipe is not a regular file (a pipe, socket or device): read_file takes files only")
    for name in ("nul.bin", "latin1.txt"):
        assert refused_both_ways(read, {"path": name}) == (
            f"read_file: {name} is a binary file (not UTF-8 text): read_file reads text files only")


def test_bytes_not_utf8_past_the_start_are_an_error_when_read(work, tools):
    (work / "late.txt").write_bytes(b"x" * 9000 + b"\n\xff\n")
    read = tools["read_file"]
    assert read.refusal({"path": "late.txt"}) is None
    assert read.run({"path": "late.txt"}) == ToolResult(
        "read_file: late.txt is not all UTF-8 text (lines 1 to 2 have bytes that are not): "
        "read_file reads text files only", is_error=True)


def test_read_file_stops_at_2000_lines_and_says_how_to_read_on(work, tools):
    (work / "long.txt").write_text("".join(f"{number}\n" for number in range(1, 2501)))
    read = tools["read_file"]
    result = read.run({"path": "long.txt"})
    lines = result.text.split("\n")
    assert lines[:2000] == [str(number) for number in range(1, 2001)]
    assert lines[2000:] == ["[lines 1 to 2000 of long.txt are shown, as read_file gives at most 2000 lines or "
                            "256 KiB at a time: read on with offset=2001]"]
    assert read.run({"path": "long.txt", "offset": 2001}) == ToolResult(
        "".join(f"{number}\n" for number in range(2001, 2501)))
    # a limit asked for is no cap: no note
    assert read.run({"path": "long.txt", "limit": 2000}).text == "".join(f"{n}\n" for n in range(1, 2001))


def test_read_file_stops_at_256_kib(work, tools):
    line = "x" * 999 + "\n"
    (work / "wide.txt").write_text(line * 300)
    result = tools["read_file"].run({"path": "wide.txt", "offset": 3})
    assert result == ToolResult(line * 262 + "[lines 3 to 264 of wide.txt are shown, as read_file gives at most "
                                             "2000 lines or 256 KiB at a time: read on with offset=265]")


def test_a_line_longer_than_the_cap_is_given_in_part(work, tools):
    # 'é' is two bytes: the cut at 256 KiB falls inside one, which is left out
    (work / "one.txt").write_text("a" + "é" * 200_000 + "\nnext\n")
    result = tools["read_file"].run({"path": "one.txt"})
    assert result == ToolResult("a" + "é" * 131_071 + "\n[line 1 of one.txt is longer than 256 KiB, the most "
                                "read_file gives at a time; only its start is shown: read on with offset=2]")


def test_a_read_past_the_text_of_a_huge_sparse_file_is_refused_as_binary_at_once(work, tools):
    """20 GiB: 10,000 lines of text, then a hole (NUL bytes that take no disk). A read at an
    offset past the text meets the NUL bytes and stops there, not 20 GiB later."""
    big = work / "big.txt"
    big.write_text("".join(f"line {number}\n" for number in range(1, 10_001)))
    os.truncate(big, 20 << 30)
    read = tools["read_file"]
    assert read.refusal({"path": "big.txt"}) is None  # its start is text
    assert within(60, lambda: read.run({"path": "big.txt", "offset": 20_000})) == ToolResult(
        "read_file: big.txt is binary past its start (it holds NUL bytes, as a sparse or binary file does): "
        "read_file reads text files only", is_error=True)
    assert read.run({"path": "big.txt", "offset": 9_999, "limit": 2}) == ToolResult("line 9999\nline 10000\n")
    assert within(60, lambda: read.run({"path": "big.txt", "offset": 9_999})).is_error  # the hole follows


def test_read_file_goes_no_further_into_a_file_than_its_bound(work, tools, monkeypatch):
    monkeypatch.setattr(read_tools, "MAX_PASSED_BYTES", 1 << 20)
    (work / "log.txt").write_text(("x" * 99 + "\n") * 20_000)  # 2,000,000 bytes
    read = tools["read_file"]
    assert read.run({"path": "log.txt", "offset": 15_000}) == ToolResult(
        "read_file: line 15000 of log.txt lies more than 1 MiB into it, further than read_file goes to find a line: "
        "run_command can read there (tail or sed -n, say)", is_error=True)
    assert read.run({"path": "log.txt", "offset": 10_000, "limit": 1}) == ToolResult("x" * 99 + "\n")


def test_the_file_tools_stop_at_the_time_limit_for_a_call(work):
    """A call's time limit is the one a command has (--tool-timeout); none at all here."""
    (work / "a.txt").write_text("one\ntwo\n")
    tools = {tool.spec.name: tool for tool in built_in_tools(Folders(work), 0)}
    stopped = "stopped after 0 s, the time limit for a tool call: ask for less at a time"
    assert tools["read_file"].run({"path": "a.txt", "offset": 2}) == ToolResult(f"read_file: {stopped}", is_error=True)
    assert tools["list_directory"].run({}) == ToolResult(f"list_directory: {stopped}", is_error=True)
    assert tools["search_files"].run({"pattern": "*.txt"}) == ToolResult(
        "[no file in . matches *.txt]\n[the search stopped early, as 0 s passed, the time limit for a tool call: "
        "what it found by then is above; narrow the pattern or the folder]")


# list_directory


def test_list_directory_marks_folders_and_gives_sizes(work, tools):
    (work / "b.txt").write_text("abc")
    (work / "a").mkdir()
    (work / ".hidden").write_text("")
    (work / "link").symlink_to("b.txt")
    listing = tools["list_directory"]
    assert listing.preview({}) is None
    assert listing.run({}) == ToolResult(".hidden  0 bytes\na/\nb.txt  3 bytes\nlink -> b.txt")
    assert listing.run({"path": "a"}) == ToolResult("[a is empty]")
    assert refused_both_ways(listing, {"path": "b.txt"}) == (
        "list_directory: b.txt is a file, not a folder: read_file reads it")
    assert refused_both_ways(listing, {"path": "c"}) == f"list_directory: c does not exist: {FIND}"


def test_list_directory_stops_at_1000_entries(work, tools):
    for number in range(1005):
        (work / f"{number:04}").write_text("")
    lines = tools["list_directory"].run({}).text.split("\n")
    assert lines[:1000] == [f"{number:04}  0 bytes" for number in range(1000)]
    assert lines[1000:] == ["[the first 1000 of 1005 entries are shown: search_files finds the others by a pattern]"]


# search_files


@pytest.fixture
def tree(work) -> Path:
    (work / "src" / "deep").mkdir(parents=True)
    (work / ".venv").mkdir()
    (work / "top.py").write_text("import os\n")
    (work / "src" / "a.py").write_text("x = 1\nprint(x)  # TODO\n")
    (work / "src" / "deep" / "b.py").write_text("# TODO: more\r\n")
    (work / "src" / "notes.md").write_text("TODO\n")
    (work / "src" / "data.py").write_bytes(b"TODO\0")
    (work / ".venv" / "lib.py").write_text("TODO\n")
    return work


def test_search_files_finds_paths_by_a_glob(tree, tools):
    search = tools["search_files"]
    assert search.run({"pattern": "**/*.py"}) == ToolResult("top.py\nsrc/a.py\nsrc/data.py\nsrc/deep/b.py")
    assert search.run({"pattern": "src/*.py"}) == ToolResult("src/a.py\nsrc/data.py")
    assert search.run({"pattern": "*.py", "path": "src"}) == ToolResult("src/a.py\nsrc/data.py")
    assert search.run({"pattern": "src/**"}) == ToolResult("src/a.py\nsrc/data.py\nsrc/notes.md\nsrc/deep/b.py")
    assert search.run({"pattern": "**/[ab].py"}) == ToolResult("src/a.py\nsrc/deep/b.py")
    assert search.run({"pattern": "**/*.rs"}) == ToolResult("[no file in . matches **/*.rs]")
    # a folder whose name starts with a dot is searched where the search starts in it
    assert search.run({"pattern": "**/*.py", "path": ".venv"}) == ToolResult(".venv/lib.py")
    assert search.run({"pattern": ".venv/*.py"}) == ToolResult(".venv/lib.py")


def test_search_files_finds_lines_holding_text(tree, tools):
    search = tools["search_files"]
    assert search.run({"pattern": "**/*.py", "text": "TODO"}) == ToolResult(
        "src/a.py:2: print(x)  # TODO\nsrc/deep/b.py:1: # TODO: more\n[files not searched: 1 binary]")
    assert search.run({"pattern": "**/*.md", "text": "TODO", "path": "src"}) == ToolResult("src/notes.md:1: TODO")
    assert search.run({"pattern": "*.py", "text": "nothing"}) == ToolResult(
        '[no line of the 1 file in . matching *.py holds "nothing"]')
    assert search.run({"pattern": "**/*.py", "text": "nothing"}) == ToolResult(
        '[no line of the 3 files in . matching **/*.py holds "nothing"]\n[files not searched: 1 binary]')


def test_a_long_line_is_shown_around_the_text(work, tools):
    (work / "min.js").write_text("a" * 1000 + "needle" + "b" * 1000 + "\n")
    result = tools["search_files"].run({"pattern": "*.js", "text": "needle"})
    assert result == ToolResult("min.js:1: …" + "a" * 100 + "needle" + "b" * 294 + "…")


def test_search_files_never_follows_a_link_out(work, tools):
    outside = work.parent / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("TODO\n")
    (work / "out").symlink_to(outside)
    (work / "secret.py").symlink_to(outside / "secret.py")
    (work / "mine.py").write_text("TODO\n")
    (work / "also.py").symlink_to("mine.py")
    search = tools["search_files"]
    assert search.run({"pattern": "**/*.py"}) == ToolResult("also.py\nmine.py")
    assert search.run({"pattern": "**/*.py", "text": "TODO"}) == ToolResult("also.py:1: TODO\nmine.py:1: TODO")
    assert search.run({"pattern": "out/*.py"}) == ToolResult("[no file in . matches out/*.py]")


def test_search_files_stops_at_200_matches(work, tools):
    for number in range(205):
        (work / f"{number:03}.txt").write_text("hit\n")
    search = tools["search_files"]
    note = "there are more: narrow the pattern, the text or the folder]"
    assert search.run({"pattern": "*.txt"}).text.split("\n") == [
        *(f"{number:03}.txt" for number in range(200)), f"[the first 200 paths found are shown; {note}"]
    assert search.run({"pattern": "*.txt", "text": "hit"}).text.split("\n") == [
        *(f"{number:03}.txt:1: hit" for number in range(200)), f"[the first 200 lines found are shown; {note}"]


def test_search_files_refuses_a_pattern_out_of_its_folder(work, tools):
    search = tools["search_files"]
    for pattern in ("/etc/*", "../*", "src/../../*"):
        assert refused_both_ways(search, {"pattern": pattern}) == (
            f"search_files: the pattern {pattern} is not a path inside the folder searched: give one like **/*.py, "
            "and the folder as path")
    assert refused_both_ways(search, {"pattern": "*", "text": "a\nb"}) == (
        "search_files: text must be on one line: search for one line of it")


def test_a_costly_pattern_on_a_deep_tree_ends_within_its_bounds(work, tools):
    """Nine ** between eight names, on a tree 100 folders deep where the last name fails to
    match as often as it matches (every way to split a path among the ** tried, that costs
    more than a lifetime): a pattern's cost is its parts times a path's names, and the walk
    goes 32 folders deep at most, saying so."""
    work.joinpath(*["d"] * 100).mkdir(parents=True)
    for depth in range(101):
        work.joinpath(*["d"] * depth, "x.txt").write_text("x\n")
        work.joinpath(*["d"] * depth, "x.md").write_text("x\n")
    pattern = "/".join(["**", "d"] * 8) + "/**/*.txt"
    result = within(60, lambda: tools["search_files"].run({"pattern": pattern}))
    assert result == ToolResult("\n".join("/".join(["d"] * depth + ["x.txt"]) for depth in range(8, 33))
                                + "\n[1 folder more than 32 levels deep not searched: search from a deeper path]")


def test_search_files_bounds_its_pattern_and_the_entries_it_looks_at(work, tools, monkeypatch):
    search = tools["search_files"]
    assert refused_both_ways(search, {"pattern": "/".join(["*"] * 40)}) == (
        "search_files: the pattern has 40 parts (names and **), more than the 32 a pattern may have: give a "
        "shorter one")
    assert refused_both_ways(search, {"pattern": "**/" + "*a" * 200}) == (
        "search_files: a part of the pattern is 400 characters long, longer than a name can be (255): give a "
        "shorter one")
    for number in range(100):
        (work / f"{number:03}.txt").write_text("")
    monkeypatch.setattr(search_tool, "MAX_LOOKED_AT", 50)
    lines = search.run({"pattern": "*.txt"}).text.split("\n")
    assert len(lines) == 51 and all(line.endswith(".txt") for line in lines[:50])
    assert lines[50] == ("[the search stopped early, as it had looked at 50 files and folders: what it found by then "
                         "is above; narrow the pattern or the folder]")


def test_search_files_enters_a_dot_folder_a_pattern_names(work, tools):
    (work / ".github" / "workflows").mkdir(parents=True)
    (work / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    search = tools["search_files"]
    assert search.run({"pattern": "**/*.yml"}) == ToolResult("[no file in . matches **/*.yml]")
    assert search.run({"pattern": ".github/**/*.yml"}) == ToolResult(".github/workflows/ci.yml")
    assert search.run({"pattern": ".*/*/*.yml"}) == ToolResult(".github/workflows/ci.yml")


# write_file


def test_write_file_shows_a_new_file_as_a_diff_and_makes_its_folders(work, tools):
    write = tools["write_file"]
    arguments = {"path": "new/deeper/file.txt", "content": "one\ntwo"}
    assert write.refusal(arguments) is None
    assert write.preview(arguments) == (
        "--- /dev/null\n+++ new/deeper/file.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n\\ No newline at end of file\n")
    assert write.run(arguments) == ToolResult("wrote new/deeper/file.txt (a new file): 2 lines, 7 bytes")
    assert (work / "new" / "deeper" / "file.txt").read_text() == "one\ntwo"
    assert write.preview({"path": "empty.txt", "content": ""}) == "a new, empty file: empty.txt\n"


def test_write_file_shows_a_change_as_a_diff(work, tools):
    (work / "a.txt").write_text("one\ntwo\nthree\n")
    (work / "a.txt").chmod(0o640)
    write = tools["write_file"]
    arguments = {"path": "a.txt", "content": "one\n2\nthree\n"}
    assert write.preview(arguments) == "--- a.txt\n+++ a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
    assert write.run(arguments) == ToolResult("wrote a.txt: 3 lines, 12 bytes")
    assert (work / "a.txt").read_text() == "one\n2\nthree\n"
    assert stat.S_IMODE((work / "a.txt").stat().st_mode) == 0o640
    assert write.preview(arguments) == "no change: a.txt already holds this text\n"
    assert write.run(arguments) == ToolResult("a.txt already holds this text: nothing was written")


def test_write_file_writes_all_at_once(work, tools, monkeypatch):
    """The new text goes to a file of its own beside the old one, which it then replaces
    whole; where that fails, the old file is as it was and nothing is left behind."""
    (work / "a.txt").write_text("old\n")
    replace, seen = os.replace, []

    def read_in(folder: int, name: str) -> str:
        with os.fdopen(os.open(name, os.O_RDONLY, dir_fd=folder)) as file:
            return file.read()

    def watched(source, target, *, src_dir_fd, dst_dir_fd):
        seen.append((os.path.samestat(os.fstat(src_dir_fd), work.stat()), src_dir_fd == dst_dir_fd,
                     read_in(src_dir_fd, source), read_in(dst_dir_fd, target)))
        replace(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(file_changes.os, "replace", watched)
    assert tools["write_file"].run({"path": "a.txt", "content": "new\n"}) == ToolResult("wrote a.txt: 1 lines, 4 bytes")
    assert seen == [(True, True, "new\n", "old\n")]  # made beside it, in the folder it is in
    assert (work / "a.txt").read_text() == "new\n"

    def failing(source, target, **folders):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_changes.os, "replace", failing)
    assert tools["write_file"].run({"path": "a.txt", "content": "newer\n"}) == ToolResult(
        "write_file: cannot write a.txt (No space left on device: the user must make room)", is_error=True)
    assert sorted(path.name for path in work.iterdir()) == ["a.txt"]
    assert (work / "a.txt").read_text() == "new\n"


def test_write_file_refuses_what_it_cannot_write(work, tools):
    (work / "sub").mkdir()
    (work / "file.txt").write_text("")
    (work / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0")
    write = tools["write_file"]
    assert refused_both_ways(write, {"path": "sub", "content": ""}) == (
        "write_file: sub is a folder: give the path of a file")
    assert refused_both_ways(write, {"path": "file.txt/a/b.txt", "content": ""}) == (
        "write_file: file.txt is a file, so file.txt/a/b.txt cannot be made: give another path")
    assert refused_both_ways(write, {"path": "image.png", "content": ""}) == (
        "write_file: image.png is a binary file (not UTF-8 text): write_file changes text files only")
    assert refused_both_ways(write, {"path": "b.txt", "content": "\udcff"}) == (
        "write_file: content has characters that cannot be written as UTF-8 (lone surrogates): give it again "
        "without them")
    assert sorted(path.name for path in work.iterdir()) == ["file.txt", "image.png", "sub"]


# edit_file


def test_edit_file_replaces_the_one_place_old_text_is(work, tools):
    (work / "a.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    edit = tools["edit_file"]
    arguments = {"path": "a.py", "old_text": "    return 2\n", "new_text": "    return 3\n"}
    assert edit.refusal(arguments) is None
    assert edit.preview(arguments) == (
        "--- a.py\n+++ a.py\n@@ -3,4 +3,4 @@\n \n \n def g():\n-    return 2\n+    return 3\n")
    assert edit.run(arguments) == ToolResult("edited a.py at line 6")
    assert (work / "a.py").read_text() == "def f():\n    return 1\n\n\ndef g():\n    return 3\n"


def test_edit_file_refuses_old_text_not_there_once(work, tools):
    (work / "a.py").write_text("return 1\nreturn 1\naaa\n")
    edit = tools["edit_file"]
    assert refused_both_ways(edit, {"path": "a.py", "old_text": "return 2", "new_text": "x"}) == (
        "edit_file: old_text is not in a.py: read the file again and copy the text exactly, spaces and line breaks "
        "included")
    assert refused_both_ways(edit, {"path": "a.py", "old_text": "return 1", "new_text": "x"}) == (
        "edit_file: old_text is in a.py 2 times: give more of the text around it, so that it is there once")
    # two places that overlap are two places
    assert refused_both_ways(edit, {"path": "a.py", "old_text": "aa", "new_text": "b"}) == (
        "edit_file: old_text is in a.py 2 times: give more of the text around it, so that it is there once")
    assert refused_both_ways(edit, {"path": "a.py", "old_text": "aaa", "new_text": "aaa"}) == (
        "edit_file: old_text and new_text are the same, so nothing would change: give the new text")
    assert refused_both_ways(edit, {"path": "b.py", "old_text": "a", "new_text": "b"}) == (
        f"edit_file: b.py does not exist: {FIND}")
    assert (work / "a.py").read_text() == "return 1\nreturn 1\naaa\n"


def test_an_edit_made_impossible_since_it_was_asked_for_is_an_error_result(work, tools):
    (work / "a.py").write_text("x = 1\n")
    edit = tools["edit_file"]
    arguments = {"path": "a.py", "old_text": "x = 1", "new_text": "x = 2"}
    assert edit.refusal(arguments) is None
    (work / "a.py").write_text("x = 1\nx = 1\n")
    assert edit.run(arguments) == ToolResult(
        "edit_file: old_text is in a.py 2 times: give more of the text around it, so that it is there once",
        is_error=True)
    (work / "a.py").unlink()
    assert edit.run(arguments) == ToolResult(f"edit_file: a.py does not exist: {FIND}", is_error=True)


# Changes that could run code later, and files a rewrite must not change hands


GIT = "where git finds commands to run (hooks, and config such as core.fsmonitor)"


@pytest.mark.parametrize("name, arguments, where", [
    ("edit_file", {"path": ".git/config", "old_text": "[core]", "new_text": "[core]\n\tfsmonitor = touch run"},
     f"is in .git, {GIT}"),
    ("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\ntouch run\n"}, f"is in .git, {GIT}"),
    ("write_file", {"path": "sub/.GIT/config", "content": ""}, f"is in .GIT, {GIT}"),
    ("edit_file", {"path": "config-link", "old_text": "[core]", "new_text": "[alias]"}, f"is in .git, {GIT}"),
    ("write_file", {"path": ".envrc", "content": "touch run\n"},
     "is .envrc, a script direnv runs on entering its folder"),
    ("write_file", {"path": ".direnv/bin/git", "content": ""},
     "is in .direnv, where direnv keeps what .envrc puts on the PATH"),
])
def test_a_change_where_code_runs_from_is_refused(work, tools, name, arguments, where):
    (work / ".git" / "hooks").mkdir(parents=True)
    (work / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (work / "config-link").symlink_to(".git/config")
    assert refused_both_ways(tools[name], arguments) == (
        f"{name}: {arguments['path']} {where}, so a change there could run code later: the file tools change such "
        "files only where llama-chat was started with --tool-write-hooks; ask the user to make this change")
    assert (work / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    assert sorted(path.name for path in work.rglob("*")) == [".git", "config", "config-link", "hooks"]


def test_the_user_can_let_the_tools_change_where_code_runs_from(work):
    (work / ".git").mkdir()
    (work / ".git" / "config").write_text("[core]\n")
    tools = {tool.spec.name: tool for tool in built_in_tools(Folders(work), write_hooks=True)}
    assert tools["edit_file"].run({"path": ".git/config", "old_text": "[core]", "new_text": "[core]\n\tx = 1"}) == (
        ToolResult("edited .git/config at line 1"))
    assert (work / ".git" / "config").read_text() == "[core]\n\tx = 1\n"


def test_the_command_line_sets_the_file_tools_time_limit_and_what_they_may_change(work, monkeypatch):
    parser = argparse.ArgumentParser()
    add_tool_arguments(parser)
    monkeypatch.chdir(work)
    for flags, write_hooks in ((["--tools", "--tool-timeout", "7"], False), (["--tools", "--tool-write-hooks"], True)):
        tools = tool_use_from(parser.parse_args(flags)).toolbox.built_in
        assert [tools[name].seconds for name in NAMES] == [7 if "7" in flags else 30] * len(NAMES)
        assert tools["write_file"].write_hooks is tools["edit_file"].write_hooks is write_hooks


def test_a_rewrite_keeps_the_mode_less_setuid_and_setgid(work, tools):
    program = work / "program.sh"
    program.write_text("#!/bin/sh\necho old\n")
    program.chmod(0o6750)
    assert stat.S_IMODE(program.stat().st_mode) == 0o6750
    assert tools["edit_file"].run({"path": "program.sh", "old_text": "old", "new_text": "new"}) == ToolResult(
        "edited program.sh at line 2")
    assert program.read_text() == "#!/bin/sh\necho new\n"
    assert stat.S_IMODE(program.stat().st_mode) == 0o750


def test_read_only_files_and_other_users_are_not_rewritten(work, tools, monkeypatch):
    (work / "locked.txt").write_text("old\n")
    (work / "locked.txt").chmod(0o444)
    (work / "theirs.txt").write_text("old\n")
    assert refused_both_ways(tools["write_file"], {"path": "locked.txt", "content": "new\n"}) == (
        "write_file: locked.txt is read-only (mode 0444): the user can make it writable (chmod u+w) if it should "
        "change")
    assert refused_both_ways(tools["edit_file"], {"path": "locked.txt", "old_text": "old", "new_text": "new"}) == (
        "edit_file: locked.txt is read-only (mode 0444): the user can make it writable (chmod u+w) if it should "
        "change")
    owner = (work / "theirs.txt").stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # the chat runs as someone else
    assert refused_both_ways(tools["write_file"], {"path": "theirs.txt", "content": "new\n"}) == (
        f"write_file: theirs.txt belongs to another user (uid {owner}), and a rewrite would make it the chat user's: "
        "ask the user to change it")
    assert (work / "locked.txt").read_text() == (work / "theirs.txt").read_text() == "old\n"


KILLED_WRITER = """
import os, sys, time
from llama_chat.tools.built_in import built_in_tools
from llama_chat.tools.folders import Folders

def stuck(descriptor):
    print("writing", flush=True)
    time.sleep(600)

os.fsync = stuck  # the new text is in the temporary file: the write waits here to be killed
write = {tool.spec.name: tool for tool in built_in_tools(Folders(sys.argv[1]))}["write_file"]
write.run({"path": "a.txt", "content": "new\\n"})
"""


def test_a_write_killed_midway_leaves_nothing_after_the_next_write(work, tools):
    (work / "a.txt").write_text("old\n")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(work)], stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([writer.stdout], [], [], 60)[0] and writer.stdout.readline() == "writing\n"
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    assert [path.name for path in work.iterdir() if path.name != "a.txt"]  # the kill left its temporary file
    assert tools["write_file"].run({"path": "b.txt", "content": "b\n"}) == ToolResult(
        "wrote b.txt (a new file): 1 lines, 2 bytes")
    assert sorted(path.name for path in work.iterdir()) == ["a.txt", "b.txt"]
    assert (work / "a.txt").read_text() == "old\n"


# run_command


def _gone(pid: int) -> bool:
    """Whether process `pid` ends (a zombie has ended) within a generous 10 s, waited for as an event."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([descriptor], [], [], 10)[0])
    finally:
        os.close(descriptor)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_run_command_gives_the_output_and_exit_status(work, tools):
    run = tools["run_command"]
    assert run.refusal({"command": "echo hi"}) is None
    assert run.preview({"command": "echo hi"}) == f"in {work}, for at most 30 s and 32 KiB of output"
    assert run.run({"command": "echo out; echo err >&2; exit 3"}) == ToolResult("out\nerr\n[exit status 3]")
    assert run.run({"command": "pwd; printf no-newline"}) == ToolResult(f"{work}\nno-newline\n[exit status 0]")
    assert run.run({"command": "cat"}) == ToolResult("[exit status 0, no output]")  # its input is empty
    assert run.run({"command": "kill -9 $$"}) == ToolResult("[exit status 137, no output]")
    assert refused_both_ways(run, {"command": "  "}) == "run_command: the command is empty: give a command line"


def test_a_command_past_its_time_is_ended_with_all_it_started(work, marker):
    run = RunCommand(Folders(work), seconds=2)
    result = run.run({"command": f"export {MARK}={marker}; sleep 300 & exec sleep 301"})
    assert result == ToolResult("[stopped after 2 s, the time limit for a command, with all it started: make it "
                                "quicker, or ask the user to run it]", is_error=True)
    assert wait_until(lambda: not marked(marker))


def test_a_command_past_its_output_cap_is_ended_with_all_it_started(work, marker):
    run = RunCommand(Folders(work), output_bytes=1000)
    result = run.run({"command": f"export {MARK}={marker}; sleep 300 & exec yes"})
    assert result == ToolResult("y\n" * 500 + "[stopped once its output passed 1,000 bytes, the most a command may "
                                "give, with all it started; its first output is above: make it give less (pipe it "
                                "through head or grep, say)]", is_error=True)
    assert wait_until(lambda: not marked(marker))


def test_ctrl_c_ends_the_command_with_all_it_started(work):
    """Ctrl-C while a command runs: the command and its children end before KeyboardInterrupt
    goes on. The command says its pids through a FIFO, which this test's thread reads before
    sending SIGINT to the main thread, where `run` blocks."""
    fifo = work / "pids"
    os.mkfifo(fifo)
    pids = []

    def interrupt() -> None:
        with open(fifo) as stream:
            pids.extend(map(int, stream.readline().split()))
        if pids:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    run = RunCommand(Folders(work), seconds=120)
    try:
        with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
            run.run({"command": "sleep 300 & echo $$ $! > pids; exec sleep 301"})
    finally:
        if thread.is_alive():  # the command never wrote: let the thread go
            with open(fifo, "w"):
                pass
        thread.join(10)
    shell, sleeper = pids
    assert _gone(shell) and _gone(sleeper)
    assert not _running(shell) and not _running(sleeper)


def test_a_command_that_ends_leaves_nothing_running(work, tools, marker):
    """What a command starts in the background ends with it, and the run does not wait for it."""
    result = tools["run_command"].run({"command": f"export {MARK}={marker}; sleep 300 &"})
    assert result == ToolResult("[exit status 0, no output]")
    assert wait_until(lambda: not marked(marker))


SECRETS = {"OPENAI_API_KEY": "sk-not-for-commands", "HF_TOKEN": "hf_not_for_commands"}


def _environment_of_a_command(run: Tool) -> dict[str, str]:
    result = run.run({"command": "env"})
    assert result.text.endswith("[exit status 0]"), result
    return dict(line.split("=", 1) for line in result.text.splitlines()[:-1])


def test_a_command_gets_no_secrets_from_the_chats_environment(work, monkeypatch):
    for name, value in {**SECRETS, "LANG": "C.UTF-8", "LC_TIME": "C", "TZ": "UTC"}.items():
        monkeypatch.setenv(name, value)
    run = RunCommand(Folders(work))
    given = _environment_of_a_command(run)
    assert not set(SECRETS) & set(given)
    assert run.spec.description.endswith("Its environment holds PATH, HOME, the locale and the like, none of the "
                                         "user's keys or tokens.")
    for name in ("PATH", "HOME", "LANG", "LC_TIME", "TZ"):  # where things are, and how to write them
        assert given[name] == os.environ[name]


def test_tool_env_passes_the_variables_it_names(work, monkeypatch, tmp_path):
    from llama_chat.cli.chat import chat_parser
    from llama_chat.cli.tool_options import tool_use_from

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(work)
    no_servers = tmp_path / "mcp.json"
    no_servers.write_text('{"mcpServers": {}}')
    options = chat_parser().parse_args(["--tools", "--tool-env", "HF_TOKEN", "--mcp-config", str(no_servers)])
    run = tool_use_from(options).toolbox.built_in["run_command"]
    given = _environment_of_a_command(run)
    assert given["HF_TOKEN"] == SECRETS["HF_TOKEN"] and "OPENAI_API_KEY" not in given
    assert run.spec.description.endswith("Its environment holds PATH, HOME, the locale and the like, and HF_TOKEN "
                                         "(passed by the user); none of the user's other keys or tokens.")
