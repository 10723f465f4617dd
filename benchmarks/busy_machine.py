"""llama-chat and llama.cpp on a machine that is not theirs alone: prefill and decode measured
idle, beside one other busy process, and beside one at the lowest priority (nice 19), each
program by benchmarks/compare_speed.py, in the same run. The busy process spins on one
core (`while True: pass`), as a build, a browser tab or another model would.

    python benchmarks/busy_machine.py --model FILE.gguf --peer-python PYTHON --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONDITIONS = (("idle", None), ("one busy process", 0), ("one busy process at nice 19", 19))
MEASURES = (("prefill", "prefill_tokens_per_second"), ("decode", "decode_tokens_per_second"))


def measure(options: argparse.Namespace, niceness: int | None) -> dict:
    """compare_speed.py's results, with a busy process of this niceness beside it (None: none)."""
    busy = None
    if niceness is not None:
        busy = subprocess.Popen([sys.executable, "-c", f"import os; os.nice({niceness})\nwhile True: pass"])
    try:
        command = [sys.executable, str(HERE / "compare_speed.py"), "--json", "--repeats", str(options.repeats),
                   "--threads", str(options.threads)]
        if options.model:
            command += ["--model", str(options.model)]
        if options.peer_python:
            command += ["--peer-python", options.peer_python]
        else:
            command += ["--only", "llama-chat"]
        if options.bench_args:
            command += ["--bench-args", options.bench_args]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", "-m", type=Path, help="GGUF file (default: the default model)")
    parser.add_argument("--peer-python", help="Python interpreter with llama_cpp installed")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--bench-args", default="", help="extra arguments for llama-chat bench")
    options = parser.parse_args()
    results = {name: measure(options, niceness) for name, niceness in CONDITIONS}
    idle = results["idle"]
    print(f"CPU: {idle['cpu']} (torch capability {idle['torch_cpu_capability']}); model {Path(idle['model']).name}; "
          f"{options.threads} threads")
    programs = [name for name in ("llama-chat", "llama.cpp") if idle.get(name)]
    print("tok/s (share of the program's idle rate)")
    header = "".ljust(30) + "".join(f"{program} {what}".rjust(24) for program in programs for what, _ in MEASURES)
    print(header)
    for name, _ in CONDITIONS:
        cells = []
        for program in programs:
            for _, key in MEASURES:
                value, base = results[name][program][key], idle[program][key]
                cells.append(f"{value:.1f} ({value / base:.0%})".rjust(24))
        print(name.ljust(30) + "".join(cells))
    for name, _ in CONDITIONS:  # the machine's own limit, as llama-chat bench measured it in each condition
        ours = results[name]["llama-chat"]
        print(f"memory read while {name}: {ours['read_bandwidth_gb_per_second']:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
