"""llama-chat: a from-scratch PyTorch Llama with a terminal chat front end.

The names below are imported on first use, so that `import llama_chat.engine.model` (or
the command line's start-up) does not pull in every checkpoint reader and template engine.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "Generation": "llama_chat.engine.generation",
    "GenerationStats": "llama_chat.engine.generation",
    "Llama": "llama_chat.llama",
    "load": "llama_chat.loading",
    "LoadOptions": "llama_chat.options",
    "LlamaChatError": "llama_chat.errors",
    "ModelArgs": "llama_chat.engine.config",
    "Piece": "llama_chat.engine.generation",
    "RopeScaling": "llama_chat.engine.config",
    "SamplingSettings": "llama_chat.engine.sampling",
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'llama_chat' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # found once, then an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
