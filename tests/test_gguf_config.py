"""A GGUF file's hyper-parameters read from its metadata alone, as llama.cpp reads them."""

import pytest

from llama_chat.checkpoints.gguf_config import args_from_gguf_metadata
from llama_chat.errors import LlamaChatError

METADATA = {
    "general.architecture": "qwen2",
    "qwen2.embedding_length": 64,
    "qwen2.attention.head_count": 4,
    "qwen2.block_count": 2,
    "qwen2.feed_forward_length": 96,
}


def read(metadata):
    return args_from_gguf_metadata(metadata, vocab_size=300, tie_embeddings=True, source="m.gguf")


def test_entries_are_read_under_the_architectures_name_with_llama_cpps_defaults():
    args = read({**METADATA, "qwen2.attention.head_count_kv": 2, "qwen2.rope.freq_base": 1e6})
    assert (args.dim, args.n_heads, args.n_kv_heads, args.n_layers, args.hidden_dim) == (64, 4, 2, 2, 96)
    assert (args.head_dim, args.rotary_dim, args.max_seq_len) == (16, 16, 2048)
    assert (args.rope_theta, args.norm_eps, args.architecture, args.qkv_bias) == (1e6, 1e-5, "qwen2", True)


@pytest.mark.parametrize("changes, message", [
    ({"qwen2.feed_forward_length": None}, "m.gguf has no 'qwen2.feed_forward_length' entry; the file is incomplete"),
    ({"qwen2.feed_forward_length": [96, 128]}, "qwen2.feed_forward_length varies by layer"),
    ({"qwen2.attention.head_count_kv": [4, 2]}, "qwen2.attention.head_count_kv varies by layer"),
    ({"qwen2.expert_count": 8}, "m.gguf is a mixture-of-experts model"),
])
def test_a_missing_or_per_layer_entry_is_refused_by_name(changes, message):
    metadata = {key: value for key, value in {**METADATA, **changes}.items() if value is not None}
    with pytest.raises(LlamaChatError, match=message):
        read(metadata)
