"""The sampling settings a model's authors recommend, as its files carry them: GGUF's
`general.sampling.*` keys (written by recent llama.cpp converters) and Hugging Face's
generation_config.json. In SamplingSettings' names; a value that is not a valid setting
is left out."""

from __future__ import annotations

import math
from collections.abc import Mapping

from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import SettingError

GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repeat_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
}
GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
}


def from_gguf(metadata: Mapping) -> dict:
    return _valid({ours: metadata[key] for key, ours in GGUF_KEYS.items() if key in metadata})


def from_generation_config(config: Mapping) -> dict:
    values = {ours: config[key] for key, ours in GENERATION_CONFIG_KEYS.items() if key in config}
    if config.get("do_sample") is False:  # greedy, whatever temperature it also names
        values["temperature"] = 0
    return _valid(values)


def _valid(values: dict) -> dict:
    kept = {}
    for name, value in values.items():
        whole = isinstance(getattr(SamplingSettings(), name), int)
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if whole and isinstance(value, float) and value.is_integer():
            value = int(value)
        try:
            SamplingSettings(**{name: value})
        except (SettingError, TypeError):
            continue
        kept[name] = value
    return kept
