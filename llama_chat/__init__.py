"""llama-chat: a from-scratch PyTorch Llama with a terminal chat front end."""

from .config import ModelArgs, RopeScaling
from .errors import LlamaChatError
from .generate import Generation, GenerationStats, Piece
from .llama import Llama
from .loading import load
from .sampling import SamplingSettings

__all__ = [
    "Generation",
    "GenerationStats",
    "Llama",
    "load",
    "LlamaChatError",
    "ModelArgs",
    "Piece",
    "RopeScaling",
    "SamplingSettings",
]
