"""ModelArgs: the hyper-parameters of a Llama model, whatever file they came from."""

from __future__ import annotations

from dataclasses import dataclass, field

from llama_chat.errors import LlamaChatError


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for long contexts.

    kind "none" leaves them alone, "linear" divides every frequency by `factor`,
    and "llama3" (Llama 3.1 and later) divides only the low frequencies, blending
    smoothly between `low_freq_factor` and `high_freq_factor` wavelengths. "longrope"
    (Phi-3) divides each frequency by its own factor, `short_factors` within the original
    context and `long_factors` for a longer one, and scales cos and sin by
    `attention_factor`.
    """

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factors: tuple[float, ...] = ()
    long_factors: tuple[float, ...] = ()
    attention_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("none", "linear", "llama3", "longrope"):
            raise LlamaChatError(
                f"unsupported rope scaling type {self.kind!r}: llama-chat supports none, linear, llama3 and longrope"
            )
        if self.factor <= 0:
            raise LlamaChatError(f"rope scaling factor must be positive, got {self.factor}")
        for name in ("short_factors", "long_factors"):
            if not all(0 < value < float("inf") for value in getattr(self, name)):
                raise LlamaChatError(f"rope scaling {name} must all be positive numbers")
        if not 0 < self.attention_factor < float("inf"):
            raise LlamaChatError(
                f"rope scaling attention factor must be a positive number, got {self.attention_factor}"
            )

    def uses_long_factors(self, context: int) -> bool:
        """Whether a context of `context` tokens turns with longrope's long factors (as
        llama.cpp chooses: by the context a model runs with)."""
        return self.kind == "longrope" and context > self.original_max_position_embeddings


# Llama's descendants as switches on its blocks, by the name both GGUF (general.architecture)
# and Hugging Face (model_type) give them; Granite's switches are its multipliers' values,
# Phi-3's are its rotary width and scaling (its fused tensors are the readers' matter),
# Gemma's windows, caps and scales are values its readers take from the file.
_GEMMA = {"gelu_feed_forward": True, "sandwich_norms": True}
ARCHITECTURE_SWITCHES: dict[str, dict[str, bool]] = {
    "llama": {}, "mistral": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True}, "granite": {}, "phi3": {},
    "gemma2": _GEMMA, "gemma3": {**_GEMMA, "qk_norm": True},
}


@dataclass(frozen=True)
class ModelArgs:
    """Architecture of a Llama Transformer.

    `max_seq_len` is the context the model was trained for; a KV cache may be made
    smaller than that to save memory.
    """

    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    hidden_dim: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    architecture: str = "llama"  # the name the file gives it (a key of ARCHITECTURE_SWITCHES)
    rotary_dim: int | None = None  # features of each head that turn (Phi-4-mini: 3/4); None: all
    # Llama's descendants, as switches on its blocks:
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head's q and k before the rotation (Qwen3)
    # Granite's multipliers (1.0 and None: Llama's)
    embedding_scale: float = 1.0  # the token embeddings times this
    residual_scale: float = 1.0  # each block's attention and feed-forward outputs times this
    attention_scale: float | None = None  # the attention scores' scale (None: 1 / sqrt(head_dim))
    logit_scale: float = 1.0  # the logits divided by this
    # Gemma 2 and 3
    gelu_feed_forward: bool = False  # the feed-forward's gate through GELU (tanh approximation), not SiLU
    sandwich_norms: bool = False  # an RMSNorm after attention and after the feed-forward too, before each residual
    attention_softcap: float | None = None  # scores capped to cap * tanh(score / cap) (Gemma 2)
    logit_softcap: float | None = None  # the logits capped alike
    sliding_window: int | None = None  # positions a windowed layer's token sees: itself and window - 1 before it
    windowed_layers: tuple[bool, ...] = ()  # which layers attend within the window (empty: none)
    local_rope_theta: float | None = None  # windowed layers' rotary base, unscaled (None: the global rotation)

    def __post_init__(self) -> None:
        # Frozen dataclass: fill the derived defaults through object.__setattr__.
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "max_seq_len"):
            if getattr(self, name) <= 0:  # before any division by them
                raise LlamaChatError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise LlamaChatError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise LlamaChatError(
                f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise LlamaChatError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise LlamaChatError(
                f"model config: the rotary width must be an even number from 2 to head_dim {self.head_dim}, "
                f"got {self.rotary_dim}"
            )
        scaling = self.rope_scaling
        pairs = self.rotary_dim // 2
        if scaling.kind == "longrope" and not len(scaling.short_factors) == len(scaling.long_factors) == pairs:
            raise LlamaChatError(
                f"model config: longrope needs {pairs} short and long factors (one per turning pair), "
                f"got {len(scaling.short_factors)} and {len(scaling.long_factors)}"
            )
        self._check_windows()
        for name in ("embedding_scale", "residual_scale", "attention_scale", "logit_scale", "attention_softcap",
                     "logit_softcap", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):  # a logit scale of 0 would divide by it
                raise LlamaChatError(f"model config: {name} must be a positive number, got {value}")

    def _check_windows(self) -> None:
        if not self.windowed_layers:
            return
        if len(self.windowed_layers) != self.n_layers:
            raise LlamaChatError(
                f"model config: the pattern of windowed layers has {len(self.windowed_layers)} entries for "
                f"{self.n_layers} layers"
            )
        window = self.sliding_window
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise LlamaChatError(
                f"model config: the sliding window must be a positive number of positions, got {window}"
            )
        if window > self.max_seq_len:
            raise LlamaChatError(
                f"model config: the sliding window of {window} positions is larger than the model's context of "
                f"{self.max_seq_len}"
            )

    def is_windowed(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window only."""
        return bool(self.windowed_layers) and self.windowed_layers[layer]

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head."""
        return self.n_heads // self.n_kv_heads
