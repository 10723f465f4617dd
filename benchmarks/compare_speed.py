"""Compare llama-chat with llama.cpp on one GGUF file: load time, peak memory, prefill, decode.

Runs `llama-chat bench --json` and benchmarks/compare_with_llama_cpp.py, each in its own
process (so each peak memory is its own), with the same prompt ids and thread count, and
prints one table. Run it with the project's Python; --peer-python is an interpreter that
has llama-cpp-python installed.

This process imports neither torch nor llama_chat: a child inherits the resident size of
the process that spawned it as its starting ru_maxrss, so the parent is kept small and
the prompt ids are made in a child process of their own.

    python benchmarks/compare_speed.py --model FILE.gguf --peer-python PYTHON --repeats 3

With --ik-bench, ik_llama.cpp's llama-bench (built from its sources as a peer) runs in the
same run on the same file and threads, rows repacked at load (-rtr 1): its prefill of the
prompt (-p) and its decode after a prompt of that length (-gp); it measures neither load
time nor memory, so those columns stay empty.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LLAMA_CPP_SCRIPT = HERE / "compare_with_llama_cpp.py"
COLUMNS = (
    ("load s", "load_seconds", "{:.2f}"),
    ("peak MB", "peak_memory_mb", "{:.0f}"),
    ("prefill tok/s", "prefill_tokens_per_second", "{:.1f}"),
    ("decode tok/s", "decode_tokens_per_second", "{:.1f}"),
    ("first token ms", "time_to_first_token", "{:.0f}"),
)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def vocab_size(model: Path) -> int:
    """Rows of the embedding, as llama-chat sizes its vocabulary (the metadata key may be absent)."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])  # GGUF lists dimensions innermost first
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def write_prompt_ids(model: str | None, prompt_tokens: int, out: Path) -> int:
    """Child mode: writes llama-chat's bench prompt for the model; prints model path and CPU capability."""
    import torch

    from llama_chat.cli.bench import random_prompt
    from llama_chat.default_model import require_default_model

    path = Path(model) if model else require_default_model()
    out.write_text(json.dumps(random_prompt(vocab_size(path), prompt_tokens)))
    print(json.dumps({"model": str(path), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}))
    return 0


def run_json(name: str, command: list[str]) -> dict | None:
    """Runs one measurement; on failure shows its stderr and returns None."""
    print(f"running {name}: {shlex.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE.parent)
    if done.returncode != 0:
        print(f"{name} failed (exit {done.returncode}):\n{done.stderr.strip()}", file=sys.stderr)
        return None
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        print(f"{name} printed no JSON:\n{done.stdout}\n{done.stderr}", file=sys.stderr)
        return None


def table(results: dict[str, dict | None]) -> str:
    width = max(len(name) for name in results) + len("ratio to ") + 2
    lines = ["".ljust(width) + "".join(title.rjust(16) for title, _, _ in COLUMNS)]
    for name, result in results.items():
        cells = []
        for _, key, fmt in COLUMNS:
            value = result.get(key) if result else None
            if value is not None and key == "time_to_first_token":
                value *= 1000
            shown = fmt.format(value) if value is not None else "-" if result else "failed"
            cells.append(shown.rjust(16))
        lines.append(name.ljust(width) + "".join(cells))
    ours = results.get("llama-chat")
    for peer in ("llama.cpp", "ik_llama.cpp"):
        theirs = results.get(peer)
        if ours and theirs:
            ratios = [(f"{ours[key] / theirs[key]:.2f}x" if theirs.get(key) else "-").rjust(16) for _, key, _ in COLUMNS]
            lines.append(f"ratio to {peer}".ljust(width) + "".join(ratios))
    if ours and len(results) > 1:
        lines.append("(ratio = llama-chat / the peer: above 1 is better for llama-chat in the tok/s columns, "
                     "worse in the others)")
    return "\n".join(lines)


def ik_llama_bench(options: argparse.Namespace, model: Path) -> dict | None:
    """ik_llama.cpp's prefill and decode tok/s on the model, from its llama-bench's JSON."""
    prompt, new = options.prompt_tokens, options.new_tokens
    command = [options.ik_bench, "-m", str(model), "-t", str(options.threads), "-p", str(prompt), "-n", "0",
               "-gp", f"{prompt},{new}", "-r", str(options.repeats), "-rtr", "1", "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True)
    try:
        tests = json.loads(done.stdout)
        rate = {(test["n_prompt"], test["n_gen"]): test["avg_ts"] for test in tests}
        return {"prefill_tokens_per_second": rate[(prompt, 0)], "decode_tokens_per_second": rate[(prompt, new)]}
    except (json.JSONDecodeError, KeyError, TypeError):
        print(f"ik_llama.cpp failed (exit {done.returncode}):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", "-m", type=Path, help="GGUF file (default: the default model)")
    parser.add_argument("--peer-python", help="Python interpreter with llama_cpp installed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-math", choices=("exact", "fast"), default="exact",
                        help="llama-chat's prompt chunks: 16-bit activations, or 8-bit blocks as ik_llama.cpp's")
    parser.add_argument("--bench-args", default="", help="extra arguments for llama-chat bench, e.g. '--quantize int8'")
    parser.add_argument("--llama-cpp-args", default="", help="extra arguments for the llama.cpp script, e.g. '--no-mmap'")
    parser.add_argument("--ik-bench", help="ik_llama.cpp's llama-bench binary: measured in the same run too")
    parser.add_argument("--only", choices=("llama-chat", "llama.cpp"), help="measure one program only")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--write-prompt-ids", type=Path, help=argparse.SUPPRESS)  # the child mode
    options = parser.parse_args(argv)
    if options.write_prompt_ids:
        return write_prompt_ids(options.model, options.prompt_tokens, options.write_prompt_ids)
    if not options.peer_python and options.only != "llama-chat":
        parser.error("--peer-python is required to measure llama.cpp")

    ids_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    ids_file.close()
    try:
        return compare(options, Path(ids_file.name))
    finally:
        Path(ids_file.name).unlink(missing_ok=True)


def compare(options: argparse.Namespace, ids_path: Path) -> int:
    setup = [sys.executable, str(Path(__file__).resolve()), "--write-prompt-ids", str(ids_path),
             "--prompt-tokens", str(options.prompt_tokens)]
    if options.model:
        setup += ["--model", str(options.model)]
    info = run_json("prompt ids", setup)
    if info is None:
        return 1
    model = Path(info["model"])

    common = ["--threads", str(options.threads), "--repeats", str(options.repeats),
              "--prompt-tokens", str(options.prompt_tokens), "--new-tokens", str(options.new_tokens), "--json"]
    results: dict[str, dict | None] = {}
    if options.only != "llama.cpp":
        command = [sys.executable, "-m", "llama_chat", "bench", "--model", str(model), *common,
                   "--prompt-math", options.prompt_math, *shlex.split(options.bench_args)]
        results["llama-chat"] = run_json("llama-chat", command)
    if options.only != "llama-chat":
        # torch's generator made the ids (in the child above), so llama.cpp reads them from the file.
        command = [options.peer_python, str(LLAMA_CPP_SCRIPT), str(model), "--prompt-ids", str(ids_path), *common,
                   *shlex.split(options.llama_cpp_args)]
        results["llama.cpp"] = run_json("llama.cpp", command)
    if options.ik_bench:
        results["ik_llama.cpp"] = ik_llama_bench(options, model)

    cpu = cpu_name()
    capability = info["torch_cpu_capability"]
    if options.json:
        print(json.dumps({"cpu": cpu, "torch_cpu_capability": capability, "model": str(model), **results}))
    else:
        print(f"CPU: {cpu} (torch capability {capability}); model {model.name}")
        print(f"{options.threads} threads, {options.prompt_tokens}-token prompt, {options.new_tokens} new tokens, "
              f"median of {options.repeats}, llama-chat's prompt math {options.prompt_math}")
        print(table(results))
        ours = results.get("llama-chat")
        if ours and "read_bandwidth_gb_per_second" in ours:
            print(f"this machine in the same run: memory read {ours['read_bandwidth_gb_per_second']:.1f} GB/s, "
                  f"int8 products {ours['int8_gops']:.0f} GOPS, bfloat16 {ours['bfloat16_gflops']:.0f} GFLOPS "
                  f"(PyTorch's), the model's largest matrix on a prompt chunk {ours['matrix_step_gflops']:.0f}; "
                  f"llama-chat decode at {ours['decode_share_of_bandwidth']:.0%} of that bandwidth, prefill at "
                  f"{ours['prefill_share_of_int8_rate']:.0%}, {ours['prefill_share_of_bfloat16_rate']:.0%} and "
                  f"{ours['prefill_share_of_matrix_rate']:.0%} of those rates")
            if ours.get("exact_prompt_peak_gops"):
                print(f"the exact prompt kernels' peak ({ours['kernel_variant']}: its dot product alone, two byte "
                      f"products a weight) {ours['exact_prompt_peak_gops']:.0f} GOPS; prefill at "
                      f"{ours['prefill_share_of_exact_peak']:.0%} of it")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
