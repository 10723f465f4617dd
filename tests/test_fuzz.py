"""Property tests: hostile files and templates end in the reader's one error, never another
exception (a few seeded examples per reader; benchmarks/fuzz.py runs the same for longer)."""

import pytest
from hypothesis import HealthCheck, given, settings

from llama_chat.text import template_runner

from .fuzz_targets import TARGETS

# Each template example starts a renderer process; a file example reads one tiny file.
EXAMPLES = {"template": 12}


@pytest.mark.parametrize("name", TARGETS)
def test_hostile_inputs_end_in_the_readers_own_error(name, tmp_path, monkeypatch):
    monkeypatch.setattr(template_runner, "RENDER_SECONDS", 0.3)
    target = TARGETS[name](tmp_path)

    @settings(max_examples=EXAMPLES.get(name, 60), derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target.inputs)
    def feed(data: bytes) -> None:
        target.check(data)

    feed()
