"""Building the same random tiny model in Hugging Face transformers and in llama-chat."""

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llama_chat import Llama
from llama_chat.checkpoints.contents import dense_state_dict
from llama_chat.checkpoints.hf import args_from_hf_config, convert_hf_state_dict
from llama_chat.engine.model import Transformer
from llama_chat.text.tokenizer import ByteTokenizer


def random_hf_model(seed: int = 0, **config) -> LlamaForCausalLM:
    """A LlamaForCausalLM with weights at a scale that gives lively, non-uniform logits."""
    settings = dict(
        vocab_size=258, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5,
    )
    settings.update(config)
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.ndim == 1:
                parameter.copy_(1.0 + 0.1 * noise)
            else:
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))
    return model


def llama_from_hf(model: LlamaForCausalLM) -> Llama:
    args = args_from_hf_config(model.config.to_dict())
    transformer = Transformer(args)
    transformer.load_state_dict(dense_state_dict(convert_hf_state_dict(model.state_dict(), args)))
    return Llama(transformer, ByteTokenizer())


def llama_from_checkpoint(checkpoint) -> Llama:
    """A float32 Llama built straight from a loader's Checkpoint."""
    transformer = Transformer(checkpoint.args)
    transformer.load_state_dict(checkpoint.state_dict(), strict=True)
    return Llama(transformer, checkpoint.tokenizer)


class NotATensor:
    """Pickled by reference: loading it would need this module's code."""


def hf_logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()
