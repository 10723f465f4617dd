"""Reading JSON strangers wrote (checkpoints/json_file.py): nesting bounded before parsing,
only regular files of a bounded size, one line naming the file for anything else."""

import json
import os
import threading
import time

import pytest

from llama_chat.untrusted_files import MAX_NESTING, check_nesting, parse_json, read_json_object
from llama_chat.errors import LlamaChatError


@pytest.mark.parametrize("opening, closing", [("[", "]"), ('{"a":', "}")])
def test_nesting_up_to_the_bound_parses_and_one_more_is_refused(opening, closing):
    deepest = opening * MAX_NESTING + "1" + closing * MAX_NESTING
    assert json.dumps(parse_json(deepest)).count(opening[0]) == MAX_NESTING
    with pytest.raises(ValueError, match=f"nested more than {MAX_NESTING} levels deep"):
        parse_json(opening + deepest + closing)


def test_brackets_inside_strings_do_not_count():
    text = json.dumps(["[" * 1000, '\\"' + "{" * 1000, "\\", [["\\\\[[[["]]])
    assert parse_json(text)[3] == [["\\\\[[[["]]


def test_200000_levels_are_refused_without_recursion():
    with pytest.raises(ValueError, match="nested more than 64 levels deep"):
        parse_json("[" * 200_000 + "]" * 200_000)


def shortest_seconds(work) -> float:
    """The shortest of three runs of `work()`: its own cost, whatever else the machine does."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def test_an_unterminated_string_of_escaped_quotes_is_scanned_in_linear_time():
    unterminated = '["' + '\\"' * 1_000_000 + "\\"
    with pytest.raises(json.JSONDecodeError, match="Unterminated string"):
        parse_json(unterminated)
    # Timed against json.loads of a document as long, not the clock (the machine may be busy):
    # measured, the scan costs about 5 times that parse; one that backtracked would take hours.
    terminated = '["' + '\\"' * 1_000_000 + '"]'
    assert shortest_seconds(lambda: check_nesting(unterminated)) < 25 * shortest_seconds(lambda: json.loads(terminated))


def test_the_scan_of_a_10_mb_safetensors_header_costs_less_than_parsing_it():
    header = {f"model.layers.{i}.mlp.gate_proj.weight": {"dtype": "BF16", "shape": [8192, 2048],
                                                         "data_offsets": [i * 100, i * 100 + 100]}
              for i in range(90_000)}
    text = json.dumps(header)
    assert len(text) > 10 * 2**20
    assert shortest_seconds(lambda: check_nesting(text)) < 2 * shortest_seconds(lambda: json.loads(text))


def test_a_deep_config_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(LlamaChatError) as refused:
        read_json_object(path)
    assert str(refused.value) == f"{path}: not valid JSON (nested more than 64 levels deep)"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    path = tmp_path / "config.json"
    os.mkfifo(path)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_error_of(read_json_object, path)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert outcome == [f"{path}: cannot read it (not a regular file)"]


def test_a_file_larger_than_any_json_of_its_kind_is_refused_unread(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    with path.open("wb") as file:
        file.truncate(65 * 2**20)  # sparse: nothing is written, nothing is read
    assert _error_of(read_json_object, path) == (
        f"{path}: {65 * 2**20} bytes, more than a file of its kind holds (at most {64 * 2**20})"
    )


@pytest.mark.parametrize("contents, message", [
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b'{"a": 1', "not valid JSON (Expecting ',' delimiter: line 1 column 8 (char 7))"),
    (b"[1, 2]", "expected a JSON object"),
])
def test_other_bad_json_is_one_line_naming_the_file(tmp_path, contents, message):
    path = tmp_path / "generation_config.json"
    path.write_bytes(contents)
    assert _error_of(read_json_object, path) == f"{path}: {message}"


def _error_of(read, path) -> str:
    try:
        read(path)
    except LlamaChatError as error:
        return str(error)
    return "no error"
