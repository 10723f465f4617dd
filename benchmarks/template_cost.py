"""What real chat templates cost to render, against the limits a template runs under.

Renders a conversation of `--turns` exchanges through (1) the default model's template,
as the chat does every turn (TemplateFormat.encode: the render in the template's process
and the tokenisation), and (2) a long template with tools: the one transformers ships for
Llama 4, which keeps the layout of Llama 3.1's tool-calling template, given eight tool
definitions. Reports the median time per render, the characters written and the worker
process's peak memory, beside the limits in llama_chat/text/template_runner.py.

    .venv/bin/python benchmarks/template_cost.py [--turns 20] [--repeats 50]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import statistics
import time
from pathlib import Path

from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.engine.device import cpu_model_name
from llama_chat.text import template_runner
from llama_chat.text.format_choice import get_chat_format
from llama_chat.text.template_runner import TemplateRunner
from llama_chat.text.template_sandbox import sandboxed_environment
from llama_chat.text.template_worker import MEMORY_LIMIT_BYTES


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant. " * 8}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: how do tides work near estuaries? " * 4})
        messages.append({"role": "assistant", "content": f"Answer {turn}: the moon's pull and the shape of " * 12})
    return messages + [{"role": "user", "content": "And in lakes?"}]


def tool(index: int) -> dict:
    return {"type": "function", "function": {
        "name": f"lookup_{index}", "description": "Look a value up in a table of measurements by station.",
        "parameters": {"type": "object", "required": ["station"], "properties": {
            "station": {"type": "string", "description": "The station's code"},
            "day": {"type": "string", "description": "ISO date"},
            "unit": {"type": "string", "enum": ["m", "ft"]}}}}}


def llama4_template() -> str:
    """The template in transformers' Llama 4 processor (read from the installed package)."""
    from transformers.models.llama4 import processing_llama4

    for node in ast.parse(inspect.getsource(processing_llama4)).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "chat_template":
            return ast.literal_eval(node.value)
    raise SystemExit("transformers has no Llama 4 chat template here")


def worker_peak_mb(runner: TemplateRunner) -> float:
    status = Path(f"/proc/{runner._worker.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) / 1024


def median_ms(render, repeats: int) -> float:
    render()  # the process starts and the template compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        render()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def report_render(name: str, source: str, variables: dict, runner: TemplateRunner, repeats: int) -> None:
    """The render in the template's process, beside the same render in this process."""
    text = runner.render(variables)
    milliseconds = median_ms(lambda: runner.render(variables), repeats)
    in_process = sandboxed_environment().from_string(source)
    direct = median_ms(lambda: in_process.render(**variables), repeats)
    print(f"{name} ({len(source):,} characters): render {milliseconds:.2f} ms median ({direct:.2f} ms in this "
          f"process), {len(text):,} characters written, worker peak {worker_peak_mb(runner):.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=50)
    options = parser.parse_args()
    messages = conversation(options.turns)
    print(f"CPU: {cpu_model_name()}; a conversation of {len(messages)} messages, "
          f"{sum(len(m['content']) for m in messages):,} characters of text")

    path = download_model(DEFAULT_MODEL)
    checkpoint = load_gguf(path)
    chat = get_chat_format(None, checkpoint.tokenizer, checkpoint.chat_template, checkpoint.bos_token,
                           checkpoint.eos_token, origin=path.name, context_length=checkpoint.args.max_seq_len)
    ids = chat.encode(messages)
    milliseconds = median_ms(lambda: chat.encode(messages), options.repeats)
    print(f"default model's template ({len(checkpoint.chat_template):,} characters): encode {milliseconds:.2f} ms "
          f"median, {len(ids):,} tokens, worker peak {worker_peak_mb(chat.runner):.0f} MB")
    report_render("default model's template alone", checkpoint.chat_template, {"messages": messages},
                  TemplateRunner(checkpoint.chat_template, path.name, checkpoint.args.max_seq_len), options.repeats)

    source = llama4_template()
    runner = TemplateRunner(source, "llama4", context_length=131072)
    variables = {"messages": messages, "tools": [tool(i) for i in range(8)], "add_generation_prompt": True,
                 "bos_token": "<|begin_of_text|>"}
    report_render("long template with 8 tools", source, variables, runner, options.repeats)
    print(f"limits: {template_runner.RENDER_SECONDS:g} s a render, {runner.max_chars:,} characters at that "
          f"context ({template_runner.MIN_OUTPUT_CHARS:,} at least), {MEMORY_LIMIT_BYTES >> 20} MB of address space")


if __name__ == "__main__":
    main()
