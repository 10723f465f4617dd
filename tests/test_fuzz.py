"""Property tests: hostile files and templates end in the reader's one error, never another
exception, and what a reader returns holds what the file holds (the valid file and a few
seeded mutations of it per reader; benchmarks/fuzz.py runs the same for longer)."""

import pytest
from hypothesis import HealthCheck, example, given, settings

from llama_chat.text import template_runner

from .fuzz_targets import TARGETS

# Each template example starts a renderer process; a file example reads one tiny file.
EXAMPLES = {"template": 12}


@pytest.mark.parametrize("name", TARGETS)
def test_hostile_inputs_end_in_the_readers_own_error(name, tmp_path, monkeypatch):
    monkeypatch.setattr(template_runner, "RENDER_SECONDS", 0.3)
    target = TARGETS[name](tmp_path)

    def feed(data: bytes) -> None:
        target.check(data)

    feed = given(target.inputs)(feed)
    if target.seed is not None:  # most mutations are refused: the file unchanged is read, and its reading checked
        feed = example(target.seed)(feed)
    settings(max_examples=EXAMPLES.get(name, 60), derandomize=True, deadline=None, database=None,
             suppress_health_check=list(HealthCheck))(feed)()
