import os

import pytest

from llama_chat import Llama, ModelArgs, paths
from llama_chat.cli.options import configure_folders
from llama_chat.kernels import native, native_build
from llama_chat.kernels.packed_cache_writer import finish_writes
from llama_chat.options import DataFolders

# Set by CI (.ci/run): a machine meant to have a compiler fails the run when it has none.
REQUIRE_KERNELS = "LLAMA_CHAT_REQUIRE_KERNELS"
NO_COMPILER = pytest.StashKey[tuple[str, int]]()


def tiny_args(**overrides) -> ModelArgs:
    """A small model with grouped-query attention and a byte-sized vocabulary."""
    settings = dict(
        dim=48, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=258, hidden_dim=80, max_seq_len=128
    )
    settings.update(overrides)
    return ModelArgs(**settings)


def pytest_configure(config):
    left_out = f"deselected, with the reason printed, where no compiler is found and {REQUIRE_KERNELS} is not 1"
    config.addinivalue_line("markers", f"needs_compiler: compiles C++ (the compiled decode step); {left_out}")
    config.addinivalue_line(
        "markers", f"needs_kernels: runs on llama-chat's kernels (loaded, LLAMA_CHAT_KERNELS=ours); {left_out}"
    )


def needs_compiler(item) -> bool:
    return any(item.get_closest_marker(name) for name in ("needs_compiler", "needs_kernels"))


def pytest_collection_modifyitems(config, items):
    """Without a compiler, the tests that need one cannot say anything: they are left out,
    and the run says how many and why. Any other failure to build stays a failure."""
    reason = native_build.missing_tools()
    if reason is None:
        return
    if os.environ.get(REQUIRE_KERNELS) == "1":
        raise pytest.UsageError(f"{REQUIRE_KERNELS}=1, but {reason}")
    needing = [item for item in items if needs_compiler(item)]
    items[:] = [item for item in items if not needs_compiler(item)]
    config.hook.pytest_deselected(items=needing)
    config.stash[NO_COMPILER] = (reason, len(needing))


def pytest_terminal_summary(terminalreporter, config):
    if NO_COMPILER in config.stash:
        reason, count = config.stash[NO_COMPILER]
        terminalreporter.write_line(
            f"{count} tests that need a C++ compiler were deselected: {reason} "
            f"(PyTorch's kernels ran; {REQUIRE_KERNELS}=1 makes this an error)"
        )


@pytest.fixture
def tiny_model() -> Llama:
    return Llama.random(tiny_args(), seed=0)


@pytest.fixture(scope="session")
def kernels_dir(tmp_path_factory):
    """llama-chat's kernels, built once for the whole run (as `scripts/setup` builds them);
    left empty on a machine without a compiler, so no build kept elsewhere is found."""
    directory = tmp_path_factory.mktemp("kernels")
    if native_build.missing_tools() is not None:
        return directory
    previous = paths.configure(DataFolders(kernels=directory))
    try:
        assert native_build.main([]) == 0, "llama-chat's kernels did not build, though a compiler was found"
    finally:
        paths.configure(previous)
    return directory


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch, kernels_dir):
    """Measurements made by tests go to a temporary cache, kept conversations and history to
    a temporary state folder, and the home folder (where other tools keep their models) is
    an empty one, never the user's; the kernels come from the run's one build. The folders
    are set as the command line sets them, from the variables, which the programs tests
    start read too. The XDG folders are the test's own as well: a program that does not read
    the LLAMA_CHAT_* variables (a library caller) keeps its cache, config and data there."""
    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.setenv("LLAMA_CHAT_KERNELS_DIR", str(kernels_dir))
    # Other tools' stores and the Hugging Face cache: empty and private, never the user's.
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for variable, folder in (("XDG_CACHE_HOME", ".cache"), ("XDG_CONFIG_HOME", ".config"),
                             ("XDG_DATA_HOME", ".local/share")):
        monkeypatch.setenv(variable, str(home / folder))
    monkeypatch.setenv("HF_HOME", str(home / ".cache" / "huggingface"))
    monkeypatch.setenv("OLLAMA_MODELS", str(home / ".ollama" / "models"))
    for name in ("HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    previous = configure_folders()
    yield
    paths.configure(previous)


@pytest.fixture(autouse=True)
def _kernels_when_marked(request, monkeypatch, _private_cache):
    """A test marked needs_kernels runs on the run's build, loaded, and chosen over PyTorch's."""
    if request.node.get_closest_marker("needs_kernels"):
        monkeypatch.setenv("LLAMA_CHAT_KERNELS", "ours")
        assert native.load_built(), "llama-chat's kernels were built for this run but do not load"


@pytest.fixture(autouse=True)
def _packed_cache_writes_finished():
    """A first load's packed-cache entries are written behind it: each test's are finished
    within the test, never in the next one's time or folders."""
    yield
    finish_writes()
