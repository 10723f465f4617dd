"""A tiny model trained in the tests to call tools: it learns, by heart, transcripts in which
the assistant calls a tool, reads its result and answers with it. Greedy, it recites them;
sampled, its calls wander, and the grammar holds them."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from llama_chat.engine.config import ModelArgs
from llama_chat.llama import Llama
from llama_chat.text.format_choice import get_chat_format
from llama_chat.text.tokenizer import ByteTokenizer
from llama_chat.text.tool_calls import ToolCall
from llama_chat.text.tools_format import ToolsFormat
from llama_chat.tools.tool import ToolResult, ToolSpec

from .tool_templates import HERMES, HERMES_SPECIALS

WEATHER = ToolSpec("get_weather", "The weather in a city.", {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                  "required": ["lat", "lon"], "additionalProperties": False},
    },
    "required": ["city", "unit", "days", "where"],
    "additionalProperties": False,
})
PARIS = {"city": "Paris", "unit": "celsius", "days": 1, "where": {"lat": 48.8, "lon": 2.3}}
SUNNY = "Sunny, 21 C."
ANSWER = "It is sunny in Paris: 21 C."
QUESTION = "Weather in Paris?"


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def call_round(number: int, arguments: Mapping[str, Any], result: str) -> list[dict]:
    call = ToolCall(WEATHER.name, arguments, f"call{number:05d}")
    return [{"role": "assistant", "content": "", "tool_calls": [call.as_message_part()]},
            {"role": "tool", "content": result, "name": WEATHER.name, "tool_call_id": call.id}]


# What the model learns: asked the weather, it calls once, then answers from the result;
# asked again, it calls twice in turn (a loop for the call limit to stop).
TRANSCRIPTS = [
    [user(QUESTION), *call_round(1, PARIS, SUNNY), {"role": "assistant", "content": ANSWER}],
    [user("Weather twice?"), *call_round(1, PARIS, SUNNY), *call_round(2, PARIS, SUNNY),
     {"role": "assistant", "content": "Still sunny."}],
]


class Weather:
    """The tool the model calls: it answers SUNNY, and counts its calls."""

    spec = WEATHER

    def __init__(self) -> None:
        self.calls: list[Mapping[str, Any]] = []

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        return None

    def preview(self, arguments: Mapping[str, Any]) -> str | None:
        return None

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        self.calls.append(arguments)
        return ToolResult(SUNNY)


def base_format(tokenizer: ByteTokenizer):
    return get_chat_format("template", tokenizer, HERMES, special_tokens=tokenizer.specials)


@functools.cache
def _trained_weights() -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    tokenizer = ByteTokenizer(["<s>", "</s>", *HERMES_SPECIALS])
    chat_format = ToolsFormat(base_format(tokenizer), [WEATHER])
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=tokenizer.vocab_size, hidden_dim=160,
                     max_seq_len=2048)
    model = Llama.random(args, tokenizer, seed=3)
    sequences = [torch.tensor([chat_format.encode(messages, add_generation_prompt=False)]) for messages in TRANSCRIPTS]
    transformer = model.transformer
    optimizer = torch.optim.Adam(transformer.parameters(), lr=3e-3)
    transformer.train()
    for step in range(400):
        tokens = sequences[step % len(sequences)]
        optimizer.zero_grad()
        logits = transformer(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[0, 1:]).backward()
        optimizer.step()
    transformer.eval()
    return args, {name: tensor.detach().clone() for name, tensor in transformer.state_dict().items()}


def trained_caller() -> Llama:
    """A fresh copy of the trained model (trained once per test run, a few seconds), its chat
    format the family template it learned."""
    args, weights = _trained_weights()
    tokenizer = ByteTokenizer(["<s>", "</s>", *HERMES_SPECIALS])
    model = Llama.random(args, tokenizer, seed=3)
    model.transformer.load_state_dict(weights)
    return Llama(model.transformer, tokenizer, name="caller", chat_format=base_format(tokenizer))
