"""Models by name from every source at once, through the command line: the default model
laid out in an ollama store (with params and system layers) and in an LM Studio folder, a
Hub repository in the Hugging Face cache, and llama-chat's weights folder; `llama-chat models`
lists all four, and each answers by its name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_chat.cli import main
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.kernels.packed_cache_writer import finish_writes
from llama_chat.loading import load
from llama_chat.process_memory import memory_now_mb

from .hub_server import HubRepo, hub_server  # noqa: F401 (a fixture)
from .ollama_store import add_model
from .test_gguf import tiny_hf_model, write_gguf

QUESTION = "What is the capital of France?"
SYSTEM = "You answer questions about places."


@pytest.fixture(scope="module")
def default_bytes() -> bytes:
    return download_model(DEFAULT_MODEL).read_bytes()


@pytest.fixture
def machine(tmp_path, monkeypatch, default_bytes):
    """A home folder holding the default model in ollama's store (greedy, stopping at "Paris",
    with a system prompt) and in LM Studio's folder, and a tiny model in the weights folder."""
    home = Path(os.environ["HOME"])
    store = home / ".ollama" / "models"
    add_model(store, default_bytes, model="smollm2", tag="135m", system=SYSTEM,
              params={"temperature": 0, "top_k": 7, "stop": ["Paris"]})
    studio = home / ".lmstudio" / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
    studio.mkdir(parents=True)
    (studio / "smollm2-135m-instruct-q4_1.gguf").write_bytes(default_bytes)
    weights = tmp_path / "weights"
    weights.mkdir()
    write_gguf(weights / "tiny.gguf", tiny_hf_model(seed=2))
    monkeypatch.setenv("LLAMA_CHAT_WEIGHTS", str(weights))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return store


def answer(capsys, *flags: str) -> tuple[int, str, str]:
    code = main(["-p", QUESTION, "--max-tokens", "24", "--compile", "off", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_ollama_model_answers_from_its_blob_with_its_params_and_system(machine, capsys, tmp_path):
    saved = tmp_path / "chat.json"
    code, out, err = answer(capsys, "-m", "ollama:smollm2:135m", "--save", str(saved))
    assert code == 0 and "Traceback" not in err
    assert out.strip() == "The capital of France is"  # greedy, and cut at the params' stop string
    assert json.loads(saved.read_text())["messages"][0] == {"role": "system", "content": SYSTEM}

    code, out, err = answer(capsys, "-m", "ollama:smollm2:135m", "--system", "Answer briefly.", "--top-k", "3")
    assert code == 0 and "Paris" not in out


def test_the_stores_settings_are_shown_with_their_source(machine, monkeypatch):
    from .test_cli import typed_chats

    sessions, shown = typed_chats(monkeypatch, ["/settings", "/info", "/quit"])
    assert main(["-m", "ollama:smollm2:135m", "--compile", "off", "--top-k", "3"]) == 0
    text = shown.getvalue()
    assert "temperature = 0 (ollama params)" in text and "top_k = 3 (command line)" in text
    assert "top_p = 0.9 (model card)" in text
    assert "ollama's Go template is not used" in text and "found as:" in text and "ollama:smollm2:135m" in text


def test_the_default_models_card_sets_its_first_answers(monkeypatch, default_bytes):
    from .test_cli import typed_chats

    sessions, shown = typed_chats(monkeypatch, ["/settings", "/quit"], ["/settings", "/quit"])
    assert main(["--compile", "off"]) == 0
    assert "temperature = 0.2 (model card)" in shown.getvalue() and "top_p = 0.9 (model card)" in shown.getvalue()
    assert main(["--compile", "off", "--temperature", "0.5"]) == 0
    assert "temperature = 0.5 (command line)" in shown.getvalue()
    assert (sessions[0].settings.temperature, sessions[1].settings.temperature) == (0.2, 0.5)


def test_the_blob_is_mapped_where_it_lies_not_copied(machine, default_bytes):
    before = memory_now_mb()
    files_before = sorted(path for path in machine.rglob("*"))
    model = load("ollama:smollm2:135m")
    assert finish_writes() == []  # the packed cache written behind the load, then mapped over its image
    after = memory_now_mb()
    assert model.source.path.parent == machine / "blobs" and model.source.origin == "ollama"
    assert sorted(path for path in machine.rglob("*")) == files_before
    if before is not None:
        own_growth = after[1] - before[1]
        assert own_growth < 0.5 * len(default_bytes) / 2**20, (before, after)


def test_models_lists_every_source_and_each_name_loads(machine, hub_server, tmp_path, default_bytes):  # noqa: F811
    from .test_hub import GGUF_REPO

    gguf = write_gguf(tmp_path / "hub.gguf", tiny_hf_model(seed=5)).read_bytes()
    hub_server.add(HubRepo(GGUF_REPO, {"Tiny-Q4_K_M.gguf": gguf}))
    environment = dict(os.environ, HF_ENDPOINT=hub_server.endpoint)
    run = [sys.executable, "-m", "llama_chat"]
    pulled = subprocess.run([*run, "pull", GGUF_REPO], env=environment, capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    listed = subprocess.run([*run, "models", "--json"], env=environment, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {f"{GGUF_REPO}:Q4_K_M", "ollama:smollm2:135m",
                         "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q4_1.gguf",
                         "tiny.gguf"}
    assert {row["source"] for row in rows.values()} == {"hf", "ollama", "lmstudio", "weights"}
    ollama_row = rows["ollama:smollm2:135m"]
    assert (ollama_row["architecture"], ollama_row["quantisation"], ollama_row["size"]) == (
        "llama", "Q4_1", len(default_bytes))
    table = subprocess.run([*run, "models"], env=environment, capture_output=True, text=True, timeout=300)
    assert "ollama:smollm2:135m" in table.stdout and "135 M" in table.stdout
    for name in rows:
        done = subprocess.run([*run, "-m", name, "-p", "Hi", "--max-tokens", "2"], env=environment,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (name, done.stderr)


def test_load_completes_the_names_of_the_models_on_this_machine():
    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document

    from llama_chat.repl.app import ChatCompleter

    completer = ChatCompleter(model_names=lambda: ["ollama:smollm2:135m", "ollama:qwen3:8b", "owner/Repo:Q4_K_M"])
    offered = [c.text for c in completer.get_completions(Document("/load ollama:s"), CompleteEvent())]
    assert offered == ["ollama:smollm2:135m"]
    offered = [c.text for c in completer.get_completions(Document("/draft own"), CompleteEvent())]
    assert "owner/Repo:Q4_K_M" in offered


def test_models_in_the_chat_lists_them(machine, monkeypatch):
    from .test_cli import typed_chats

    sessions, shown = typed_chats(monkeypatch, ["/models", "/top_k 5", "/load ollama:smollm2:135m", "/settings",
                                                "/load tiny", "/settings", "/quit"])
    assert main(["-m", str(Path(os.environ["LLAMA_CHAT_WEIGHTS"]) / "tiny.gguf"), "--compile", "off"]) == 0
    text = shown.getvalue()
    assert "ollama:smollm2:135m" in text and "tiny.gguf" in text and "chat template" in text
    assert "loaded ollama:smollm2:135m" in text
    first, second = text.split("loaded tiny.gguf")
    # The loaded model's recommendations take the place of the last one's; the user's own choice stays.
    assert "temperature = 0 (ollama params)" in first and "top_p = 0.9 (model card)" in first
    assert "top_k = 5 (set in the chat)" in first and "top_k = 5 (set in the chat)" in second
    assert "temperature = 0.7\n" in second and "top_p = 0.95\n" in second
    assert f"system = {SYSTEM!r}" in first and "system = None" in second  # the store's, then none again
    assert sessions[0].model.name == "tiny.gguf"


def test_a_short_name_finds_the_one_model_it_names_or_lists_them_all(machine, tmp_path):
    from llama_chat.cli.options import configure_folders
    from llama_chat.errors import LlamaChatError
    from llama_chat.models.resolve import resolve

    configure_folders()  # the weights folder the fixture named (the suite's fixture restores the folders)
    assert resolve("smollm2:135m").origin == "ollama"
    assert resolve("tiny").path == Path(os.environ["LLAMA_CHAT_WEIGHTS"]) / "tiny.gguf"
    write_gguf(Path(os.environ["LLAMA_CHAT_WEIGHTS"]) / "smollm2:135m.gguf", tiny_hf_model(seed=3))
    with pytest.raises(LlamaChatError, match=r"'smollm2:135m' names 2 models: .*smollm2:135m.gguf, ollama:smollm2:135m"):
        resolve("smollm2:135m")
    with pytest.raises(LlamaChatError, match="nothing-here: no such file or directory, nor a model of that name"):
        resolve("nothing-here")
