"""What decides a training run: its settings, the presets, and the learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from llama_chat.engine.config import ModelArgs


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the result of a run; saved with it and reused by --resume."""

    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden_dim: int = 352
    context: int = 256
    batch_size: int = 16
    accumulate: int = 1  # micro-batches per optimiser step
    steps: int = 1500
    learning_rate: float = 2e-3
    warmup: int = 100
    min_learning_rate_ratio: float = 0.1  # where the cosine decay ends, relative to the peak
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    tokenizer: str = "bpe"
    vocab_size: int = 1024
    validation_fraction: float = 0.1
    eval_every: int = 100
    eval_batches: int = 8
    save_every: int = 500
    sample_every: int = 250
    sample_tokens: int = 120
    seed: int = 0

    def model_args(self, vocab_size: int) -> ModelArgs:
        return ModelArgs(
            dim=self.dim, n_layers=self.n_layers, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
            vocab_size=vocab_size, hidden_dim=self.hidden_dim, max_seq_len=self.context, tie_embeddings=True,
        )


# Sized for a laptop CPU: tiny reads like text after about 10 minutes on 2 cores; small
# (about six times the compute per step, twice the steps) wants hours there, or a GPU.
PRESETS = {
    "tiny": TrainConfig(),
    "small": TrainConfig(dim=256, n_layers=6, n_heads=8, n_kv_heads=4, hidden_dim=704, context=512,
                         batch_size=8, steps=3000, learning_rate=1e-3, warmup=200, vocab_size=2048),
}
SETTING_FLAGS = tuple(f.name for f in fields(TrainConfig))


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up to the peak, then cosine decay to min_learning_rate_ratio of it."""
    if step < config.warmup:
        return config.learning_rate * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    floor = config.learning_rate * config.min_learning_rate_ratio
    return floor + (config.learning_rate - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
