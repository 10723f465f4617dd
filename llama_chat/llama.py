"""Llama: a Transformer on a device together with its tokenizer, ready to generate."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from llama_chat.engine.cache import KVCache
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.device import resolve_device, resolve_dtype
from llama_chat.engine.generation import Generation
from llama_chat.engine.model import Transformer
from llama_chat.engine.processors import LogitsProcessor
from llama_chat.engine.runners import model_runner
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.engine.speculation import Speculation
from llama_chat.errors import UsageError
from llama_chat.kernels.weights_record import DENSE, WeightsRecord
from llama_chat.models.source import ModelSource
from llama_chat.options import PROMPT_MATHS
from llama_chat.text.builtin_formats import PlainFormat
from llama_chat.text.chat_format import ChatFormat
from llama_chat.text.tokenizer import ByteTokenizer, Tokenizer

DEFAULT_CONTEXT = 4096


def _kernels_building() -> int:
    """1 while a build of llama-chat's kernels this process started runs, else 0."""
    from llama_chat.kernels import native_build  # the build's tooling loads only where one is asked about

    return int(native_build.build_running())


class Llama:
    """A loaded model: `tokenizer`, `runner` (how the model runs on a cache: `runner(cache, ids)`),
    `logits(ids)`, `new_cache()` and `generate()`."""

    def __init__(
        self,
        transformer: Transformer,
        tokenizer: Tokenizer,
        *,
        name: str = "",
        chat_format: ChatFormat | None = None,
        weights: WeightsRecord = DENSE,
        cache_dtype: torch.dtype | None = None,
        recommended: tuple[tuple[str, dict], ...] = (),
        source: ModelSource | None = None,
    ) -> None:
        self.transformer = transformer.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.weights = weights  # how the weights run: packed or not, as what, and why
        self.chat_format = chat_format or PlainFormat(tokenizer)
        # A reply ends at the model's end ids and at whatever ends a turn in its chat format.
        self.stop_ids = self.chat_format.stop_ids
        first = next(transformer.parameters())
        self.device = first.device
        self.dtype = first.dtype
        self.cache_dtype = cache_dtype or self.dtype  # the KV cache's (--kv-dtype)
        # The sampling settings recommended for the model (SamplingSettings' names), each
        # with where it comes from, the weakest first (loading.recommended_sampling).
        self.recommended = recommended
        # Where the model was found by its name, and what that place says of it.
        self.source = source
        self.stop_strings = source.stop_strings if source is not None else ()
        self.prompt_math = "exact"  # how prompt chunks multiply (set_prompt_math)
        # How the model runs on a cache (eager or compiled; posted to other ranks in a group).
        self.runner = model_runner(self.transformer, self.cache_dtype, background=_kernels_building)

    @classmethod
    def random(
        cls,
        args: ModelArgs,
        tokenizer: Tokenizer | None = None,
        *,
        seed: int = 0,
        device: str | None = "cpu",
        dtype: str | None = "float32",
    ) -> Llama:
        """A model with random weights (for tests and benchmarks), reproducible by seed."""
        resolved_device = resolve_device(device)
        transformer = Transformer(args)
        init_random_weights(transformer, seed)
        transformer.to(device=resolved_device, dtype=resolve_dtype(dtype, resolved_device))
        return cls(transformer, tokenizer or ByteTokenizer(vocab_size=args.vocab_size), name=f"random-{seed}")

    @property
    def default_system(self) -> str | None:
        """The system prompt the model's store gives it (ollama's system layer), if any."""
        return self.source.system if self.source is not None else None

    def set_prompt_math(self, mode: str) -> str | None:
        """Prompt chunks (steps of more tokens than a verify step) in `mode`: exact (16-bit
        activations, float32-grade) or fast (8-bit activation blocks, as ik_llama.cpp runs
        them); decode and verify steps stay exact. A reason where the switch does nothing."""
        from llama_chat.kernels.block_linear import set_prompt_math  # the kernels load only where asked about

        if mode not in PROMPT_MATHS:
            raise UsageError(f"unknown prompt math {mode!r}: use exact or fast")
        if set_prompt_math(self.transformer, mode == "fast") == 0 and mode == "fast":
            return "prompts stay exact: fast prompt math is llama-chat's kernels', which do not run this model"
        self.prompt_math = mode
        return None

    @property
    def args(self) -> ModelArgs:
        return self.transformer.args

    def describe_weights(self) -> str:
        """How the weights run, for people: "float32", or "int4 weights, bfloat16 products ..."."""
        fast = "; prompt chunks with 8-bit activation blocks (--prompt-math fast)" if self.prompt_math == "fast" else ""
        return self.weights.describe(self.dtype) + fast

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty KV cache; by default the smaller of the model's context and 4096. The
        model's rotary tables grow to hold its positions."""
        capacity = capacity or min(self.args.max_seq_len, DEFAULT_CONTEXT)
        cache = KVCache(self.args, capacity, device=self.device, dtype=self.cache_dtype)
        self.transformer.fit_rope(capacity)
        return cache

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(ids), vocab] from one full forward pass, no cache involved."""
        return self.runner.logits(ids)

    def generate(
        self,
        prompt_ids: Sequence[int],
        settings: SamplingSettings | None = None,
        *,
        cache: KVCache | None = None,
        stop_ids: Iterable[int] | None = None,
        stop_strings: Iterable[str] | None = None,
        speculation: Speculation | None = None,
        processor: LogitsProcessor | None = None,
    ) -> Generation:
        """A streaming reply to prompt_ids: iterate it for Pieces; see Generation.

        With a cache from an earlier call, the longest common prefix is reused and only
        the rest of the prompt is fed through the model. A processor holds the reply to a rule,
        such as a format's constraint (see engine/processors and engine/constraint).
        """
        settings = settings or SamplingSettings()
        if cache is None:
            cache = self.new_cache(min(self.args.max_seq_len, len(prompt_ids) + settings.max_tokens + 1))
        stop_ids = self.stop_ids if stop_ids is None else stop_ids
        stop_strings = self.stop_strings if stop_strings is None else stop_strings
        return Generation(
            self.runner, self.tokenizer, prompt_ids, settings, cache, stop_ids, stop_strings, speculation, processor
        )


def init_random_weights(transformer: Transformer, seed: int) -> None:
    """Fill every weight from a seeded generator at a scale that keeps activations near 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in transformer.named_parameters():
            if parameter.ndim == 1:  # norm gains: near 1, but not exactly, so their use is tested
                values = 1.0 + 0.1 * torch.randn(parameter.shape, generator=generator)
            elif name == "tok_embeddings.weight":
                values = torch.randn(parameter.shape, generator=generator)
            else:
                values = torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[1])
            parameter.copy_(values)
