import pytest

from llama_chat import Llama, ModelArgs


def tiny_args(**overrides) -> ModelArgs:
    """A small model with grouped-query attention and a byte-sized vocabulary."""
    settings = dict(
        dim=48, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=258, hidden_dim=80, max_seq_len=128
    )
    settings.update(overrides)
    return ModelArgs(**settings)


@pytest.fixture
def tiny_model() -> Llama:
    return Llama.random(tiny_args(), seed=0)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Measurements made by tests go to a temporary cache, never the user's."""
    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path_factory.mktemp("cache")))
