"""A tiny GGUF model that always says the same thing, for tests of what a front end does
with a known reply (a reasoning model's <think> part).

Its next token depends on the current token alone: attention and feed-forward blocks add
nothing (their output matrices are zero), the embeddings are orthonormal, and the head maps
each token's embedding to its successor in the recited chain; every other token leads to
the chain's first. So after any prompt that does not end inside the chain, greedy decoding
recites the chain, then the end-of-turn token.
"""

import math
from pathlib import Path

import torch

from .test_gguf import VOCAB, tiny_hf_model, write_gguf
from .test_hf_tokenizer import USER_DEFINED, byte_level_metadata

THINKING_TOKENS = ["<think>", "</think>"]
VOCABULARY = VOCAB + THINKING_TOKENS
END_OF_TURN = VOCABULARY.index("<|im_end|>")
WIDTH = 288  # at least the vocabulary's size, for orthonormal embeddings

# The model writes its own opening marker; earlier turns are kept as they were.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# As DeepSeek's R1 distillations: the generation prompt opens the thinking, earlier replies lose theirs.
OPENS_THINKING = (
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def token_ids(tokens: list[str]) -> list[int]:
    return [VOCABULARY.index(token) for token in tokens]


def write_reciting_model(path: Path, chain: list[str], chat_template: str = CHATML) -> Path:
    """A GGUF file whose model answers any message with `chain` (token strings of the
    vocabulary) and then ends its turn."""
    ids = token_ids(chain)
    model = tiny_hf_model(vocab_size=len(VOCABULARY), hidden_size=WIDTH, max_position_embeddings=512)
    generator = torch.Generator().manual_seed(0)
    orthonormal, _ = torch.linalg.qr(torch.randn(WIDTH, WIDTH, generator=generator))
    embeddings = orthonormal[: len(VOCABULARY)] * math.sqrt(WIDTH)  # rms 1: the norms leave them be
    successor = dict(zip(ids, ids[1:] + [END_OF_TURN]))
    head = torch.zeros(len(VOCABULARY), WIDTH)
    for token in range(len(VOCABULARY)):
        head[successor.get(token, ids[0])] += embeddings[token] * (30.0 / WIDTH)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embeddings)
        model.lm_head.weight.copy_(head)
        model.model.norm.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    metadata = byte_level_metadata(pre="smollm")
    metadata["tokenizer.ggml.tokens"] = VOCABULARY
    metadata["tokenizer.ggml.token_type"] = metadata["tokenizer.ggml.token_type"] + [USER_DEFINED] * 2
    return write_gguf(path, model, vocabulary=metadata, chat_template=chat_template)
