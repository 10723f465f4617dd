"""llama-chat's own tools: file tools that touch only the folders they are given, refusing
in one line before anyone is asked, and a shell tool whose command, and all it started,
ends however its run ends."""

import os
import select
import signal
import stat
import threading
from pathlib import Path

import jsonschema
import llguidance
import pytest

from llama_chat.errors import LlamaChatError
from llama_chat.tools import file_changes
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

    def watched(source, target):
        seen.append((Path(source).parent, Path(source).read_text(), Path(target).read_text()))
        replace(source, target)

    monkeypatch.setattr(file_changes.os, "replace", watched)
    assert tools["write_file"].run({"path": "a.txt", "content": "new\n"}) == ToolResult("wrote a.txt: 1 lines, 4 bytes")
    assert seen == [(work, "new\n", "old\n")]
    assert (work / "a.txt").read_text() == "new\n"

    def failing(source, target):
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
