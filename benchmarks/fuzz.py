"""A fuzzing campaign over the readers of files from strangers: the suite's property tests
(tests/fuzz_targets.py), run with fresh random seeds until the time is up.

For each reader it prints how many inputs it tried, the slowest one, and every failure:
an exception other than the reader's own error, shrunk by hypothesis to a small input,
which is written to --failures. Needs the test extras (`scripts/setup test`); run from the
checkout:

    .venv/bin/python benchmarks/fuzz.py --minutes 10 [--target gguf conversation ...]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

from hypothesis import HealthCheck, Verbosity, given, seed, settings
from hypothesis.errors import HypothesisWarning

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package

from llama_chat.cli.options import configure_folders  # noqa: E402
from llama_chat.text import template_runner  # noqa: E402
from llama_chat.text.template_worker import limit_memory  # noqa: E402
from tests.fuzz_targets import TARGETS  # noqa: E402

BATCH = 200  # inputs per hypothesis run; each run has its own seed


def campaign(name: str, seconds: float, failures: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        target = TARGETS[name](Path(scratch))
        tried, slowest, found = 0, 0.0, {}
        last_input: list[bytes] = []

        def feed(data: bytes) -> None:
            nonlocal tried, slowest
            tried += 1
            last_input[:] = [data]
            start = time.monotonic()
            target.check(data)
            slowest = max(slowest, time.monotonic() - start)

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            run = settings(max_examples=BATCH, deadline=None, database=None, report_multiple_bugs=False,
                           verbosity=Verbosity.quiet,
                           suppress_health_check=list(HealthCheck))(given(target.inputs)(feed))
            try:
                seed(random.getrandbits(64))(run)()
            except Exception as error:  # noqa: BLE001 (a failure to report, then go on)
                where = traceback.extract_tb(error.__traceback__)[-1]
                key = (type(error).__name__, where.filename, where.lineno)
                if key not in found:
                    found[key] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
                    failures.mkdir(parents=True, exist_ok=True)
                    (failures / f"{name}-{len(found)}.bin").write_bytes(last_input[0])
    lines = [f"{name}: {tried:,} inputs in {seconds / 60:.1f} min, slowest {slowest:.2f} s, "
             f"{len(found)} distinct failures"]
    lines += [f"  {message}  at {Path(filename).name}:{line}" for (_, filename, line), message in found.items()]
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="per target")
    parser.add_argument("--target", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--failures", type=Path, default=Path("fuzz-failures"),
                        help="where failing inputs are written")
    parser.add_argument("--memory-gb", type=float, default=8.0,
                        help="address space this process may take: an input that floods memory fails "
                             "with MemoryError (and is reported) instead of waking the out-of-memory killer")
    parser.add_argument("--render-seconds", type=float, default=0.5,
                        help="the template time limit during the campaign (the chat's is 5 s)")
    options = parser.parse_args()
    warnings.filterwarnings("ignore", category=HypothesisWarning)  # the repr of a large failing input
    os.environ.setdefault("LLAMA_CHAT_CACHE", tempfile.mkdtemp(prefix="llama-chat-fuzz-"))
    configure_folders()
    template_runner.RENDER_SECONDS = options.render_seconds
    limit_memory(int(options.memory_gb * 2**30))
    for name in options.target:
        campaign(name, options.minutes * 60, options.failures)


if __name__ == "__main__":
    main()
