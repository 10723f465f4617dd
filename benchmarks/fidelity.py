"""How closely the packed cpu paths follow float32 on the default model (or --model), as the
field measures it (llama.cpp's `llama-perplexity --kl-divergence`): the share of positions
with the same top token, and the KL divergence of the next-token distribution from
float32's (its mean and 99th percentile), with the largest logit difference.

Teacher-forced over the first --positions tokens of fidelity_text.txt (original text in a
dozen languages, code and numbers), each position is compared with the float32 model's
(the file's weights dequantised to float32) there: `prompt steps` feed the text --step
tokens a call (the chunks a prompt is read in), `verify steps` 9 (a speculative verify
step: a token and 8 drafts) and `single tokens` one (the decode kernels). With
--peer-python (an interpreter with llama-cpp-python), llama.cpp's logits on the same file
and ids are measured the same way, a token at a time and in batches of --step
(benchmarks/llama_cpp_fidelity.py).

Memory stays bounded whatever the vocabulary: the reference's logits go to a temporary
float32 file a block of positions at a time (the float32 model is freed before the packed
one loads), and every path is compared a block at a time as its logits come.

    .venv/bin/python benchmarks/fidelity.py [--model FILE.gguf] [--positions 2048] [--step 64] \
        [--peer-python PY] [--json FILE] [--prompt-math fast]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import tempfile
from pathlib import Path

import torch

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.device import cpu_model_name
from llama_chat.environment import kernel_options
from llama_chat.options import LoadOptions
from llama_chat.process_memory import return_freed_memory

from fidelity_stats import BLOCK, Agreement, Reference, block_for, peak_memory_mb  # noqa: E402 (a sibling module)

TEXT_FILE = Path(__file__).with_name("fidelity_text.txt")
TEXT = TEXT_FILE.read_text(encoding="utf-8")
VERIFY_STEP = 9  # a token and 8 drafts (speculation's most by default)
PEER_SCRIPT = Path(__file__).with_name("llama_cpp_fidelity.py")


def text_ids(model: llama_chat.Llama, positions: int) -> list[int]:
    """The text's first `positions` tokens (after a start token where the model expects one)."""
    ids = model.tokenizer.encode(TEXT, add_bos=model.tokenizer.add_bos_token)
    if len(ids) < positions:
        raise SystemExit(f"{TEXT_FILE.name} gives {len(ids)} tokens on this model's tokenizer, fewer than "
                         f"--positions {positions}")
    if positions > model.args.max_seq_len:
        raise SystemExit(f"the model's context holds {model.args.max_seq_len} positions, fewer than --positions "
                         f"{positions}")
    return ids[:positions]


def write_reference(model: llama_chat.Llama, ids: list[int], path: Path) -> int:
    """The model's logits at every position, fed a block at a time through one cache, to a
    raw float32 file [positions, vocabulary]; returns the vocabulary's size."""
    cache = model.new_cache(len(ids))
    with path.open("wb") as file:
        for start in range(0, len(ids), BLOCK):
            logits = model.runner(cache, ids[start : start + BLOCK], every_logits=True, chunk_size=BLOCK)
            logits.numpy().tofile(file)
    return logits.shape[-1]


def measure(model: llama_chat.Llama, ids: list[int], step: int, reference: Reference) -> dict:
    """Teacher-forced through one cache `step` tokens a call, each block compared as it comes."""
    cache = model.new_cache(len(ids))
    agreement = Agreement()
    block = block_for(step)
    for start in range(0, len(ids), block):
        stop = min(start + block, len(ids))
        logits = model.runner(cache, ids[start:stop], every_logits=True, chunk_size=step)
        agreement.add(reference.rows(start, stop), logits.numpy())
    return agreement.summary()


def measure_llama_cpp(python: str, model: str, ids_file: Path, reference: Path, step: int) -> dict:
    """The same figures for llama.cpp, from a process under `python` (it prints them as JSON)."""
    command = [python, str(PEER_SCRIPT), model, str(ids_file), str(reference), "--step", str(step)]
    return json.loads(subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout)


def table(rows: dict[str, dict]) -> str:
    lines = ["| | same top token | mean KL divergence | 99th percentile KL | largest logit difference |",
             "| --- | --- | --- | --- | --- |"]
    for name, figures in rows.items():
        lines.append(f"| {name} | {figures['same_top_token']:.3f} | {figures['mean_kl_divergence']:.2e} | "
                     f"{figures['kl_divergence_p99']:.2e} | {figures['largest_logit_difference']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--step", type=int, default=64, help="tokens a prompt step (and a llama.cpp batch) holds")
    parser.add_argument("--peer-python", help="an interpreter with llama-cpp-python: llama.cpp's figures too")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--prompt-math", choices=("exact", "fast"), default="exact",
                        help="fast: prompt steps again with --prompt-math fast (8-bit activation blocks), a row of their own")
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = LoadOptions(kernels=kernel_options())
    path = options.model or str(download_model(DEFAULT_MODEL))
    rows: dict[str, dict] = {}
    peak_memory = {}  # MB resident at most, of each process
    with tempfile.TemporaryDirectory() as folder:
        ids_file, reference_file = Path(folder, "ids.json"), Path(folder, "reference.f32")
        exact = llama_chat.load(path, environment, device="cpu", dtype="float32", kv_dtype="float32")
        ids = text_ids(exact, options.positions)
        vocabulary = write_reference(exact, ids, reference_file)
        del exact  # before the packed model loads: never both at once
        gc.collect()
        return_freed_memory()
        ids_file.write_text(json.dumps(ids))
        reference = Reference(reference_file, len(ids), vocabulary)
        fast = llama_chat.load(path, environment, device="cpu")
        for name, step in ((f"llama-chat, prompt steps of {options.step}", options.step),
                           (f"llama-chat, verify steps of {VERIFY_STEP}", VERIFY_STEP),
                           ("llama-chat, single tokens", 1)):
            rows[name] = measure(fast, ids, step, reference)
        if options.prompt_math == "fast":
            fast.set_prompt_math("fast")
            rows[f"llama-chat, prompt steps of {options.step}, --prompt-math fast"] = measure(
                fast, ids, options.step, reference)
        peak_memory["llama-chat"] = peak_memory_mb()
        if options.peer_python:
            for name, step in (("llama.cpp, single tokens", 1),
                               (f"llama.cpp, batches of {options.step}", options.step)):
                rows[name] = measure_llama_cpp(options.peer_python, path, ids_file, reference_file, step)
                peak_memory[name.replace(",", "")] = rows[name].pop("peak_memory_mb")
    report = {
        "model": Path(path).name,
        "cpu": cpu_model_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "quantization": fast.weights.packing,
        "weights_note": fast.weights.note,
        "positions": len(ids),
        "vocabulary": vocabulary,
        "rows": rows,
        "peak_memory_mb": peak_memory,
    }
    print(f"{report['model']}: {fast.describe_weights()}")
    print(f"CPU: {report['cpu']} (torch: {report['cpu_capability']}); {len(ids)} teacher-forced positions of "
          f"{TEXT_FILE.name}, vocabulary {vocabulary}, against float32 (the file's weights dequantised)\n")
    print(table(rows))
    print("\npeak resident memory: " + "; ".join(f"{name} {mb} MB" for name, mb in peak_memory.items()))
    if options.json:
        Path(options.json).write_text(json.dumps(report, indent=2) + "\n")

if __name__ == "__main__":
    main()
