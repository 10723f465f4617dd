"""The sampling settings a model's authors recommend, as its files carry them: GGUF's
`general.sampling.*` keys (written by recent llama.cpp converters) and Hugging Face's
generation_config.json. In SamplingSettings' names; a value that is not a valid setting
is left out."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

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
    return valid_settings({ours: _as_written(metadata[key]) for key, ours in GGUF_KEYS.items() if key in metadata})


def _as_written(value: object) -> object:
    """A float32 the file stores (0.15000000596046448) as the shortest decimal that reads
    back to it (0.15): what its author wrote, and what people should see."""
    if isinstance(value, float) and math.isfinite(value) and float(np.float32(value)) == value:
        return float(str(np.float32(value)))
    return value


def from_generation_config(config: Mapping) -> dict:
    values = {ours: config[key] for key, ours in GENERATION_CONFIG_KEYS.items() if key in config}
    if config.get("do_sample") is False:  # greedy, whatever temperature it also names
        values["temperature"] = 0
    return valid_settings(values)


def valid_settings(values: dict) -> dict:
    """The values that make valid settings, whole numbers written as floats made whole."""
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
