import os

import pytest

from llama_chat import Llama, ModelArgs
from llama_chat.kernels import native


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


@pytest.fixture(scope="session")
def kernels_dir(tmp_path_factory):
    """llama-chat's kernels, built once for the whole run (as `scripts/setup` builds them)."""
    directory = tmp_path_factory.mktemp("kernels")
    previous = os.environ.get("LLAMA_CHAT_KERNELS_DIR")
    os.environ["LLAMA_CHAT_KERNELS_DIR"] = str(directory)
    try:
        assert native.main([]) == 0, "llama-chat's kernels did not build"
    finally:
        if previous is None:
            del os.environ["LLAMA_CHAT_KERNELS_DIR"]
        else:
            os.environ["LLAMA_CHAT_KERNELS_DIR"] = previous
    return directory


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch, kernels_dir):
    """Measurements made by tests go to a temporary cache, and kept conversations and
    history to a temporary state folder, never the user's; the kernels come from the
    run's one build."""
    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.setenv("LLAMA_CHAT_KERNELS_DIR", str(kernels_dir))
