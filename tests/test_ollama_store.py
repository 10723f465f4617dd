"""Models in ollama's store, listed and resolved where they lie: names by ollama's rules, what
the params, system, template and projector layers say, and a hostile store's every trick
ending in one line or in the model being left out of the listing."""

import gc
import json
import os
import time

import pytest

from llama_chat import SamplingSettings
from llama_chat.errors import LlamaChatError
from llama_chat.loading import load
from llama_chat.models import ollama
from llama_chat.models.ollama import list_ollama, parse_ollama_name, resolve_ollama, store_roots
from llama_chat.process_memory import memory_now_mb

from .ollama_store import add_model, blob_path, digest, layer, write_manifest
from .test_gguf import tiny_hf_model, write_gguf

NAME = ("registry.ollama.ai", "library", "llama3.2", "3b")


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_hf_model(seed=3)).read_bytes()


@pytest.fixture(scope="module")
def plain_gguf_bytes(tmp_path_factory) -> bytes:
    """A GGUF without a chat template."""
    path = tmp_path_factory.mktemp("gguf") / "plain.gguf"
    return write_gguf(path, tiny_hf_model(seed=3), chat_template="").read_bytes()


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    return root


def refusal(call, *args) -> str:
    """The message of the LlamaChatError `call(*args)` raises, checked to be one line."""
    with pytest.raises(LlamaChatError) as raised:
        call(*args)
    message = str(raised.value)
    assert "\n" not in message and message.strip() == message
    return message


def test_store_roots_follow_ollama_models_else_the_user_and_service_folders(tmp_path):
    home, service = tmp_path / "home", tmp_path / "service"
    (home / ".ollama" / "models").mkdir(parents=True)
    assert store_roots({}, home, service) == [home / ".ollama" / "models"]
    service.mkdir()
    assert store_roots({}, home, service) == [home / ".ollama" / "models", service]
    assert store_roots({}, tmp_path / "elsewhere", service) == [service]
    linked = tmp_path / "linked" / ".ollama" / "models"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(service)
    assert store_roots({}, tmp_path / "linked", service) == [linked]  # one folder by two names counts once
    named = tmp_path / "named"
    assert store_roots({"OLLAMA_MODELS": str(named)}, home, service) == []  # named, so only that one, absent
    named.mkdir()
    assert store_roots({"OLLAMA_MODELS": f' "{named}" '}, home, service) == [named]  # as ollama trims it


@pytest.mark.parametrize(
    "text, parts, display",
    [
        ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest"), "llama3.2:latest"),
        ("llama3.2:3b", ("registry.ollama.ai", "library", "llama3.2", "3b"), "llama3.2:3b"),
        ("user/model:q4_K_M", ("registry.ollama.ai", "user", "model", "q4_K_M"), "user/model:q4_K_M"),
        ("library/qwen3", ("registry.ollama.ai", "library", "qwen3", "latest"), "qwen3:latest"),
        ("hf.co/bartowski/Qwen3-0.6B-GGUF:Q8_0", ("hf.co", "bartowski", "Qwen3-0.6B-GGUF", "Q8_0"),
         "hf.co/bartowski/Qwen3-0.6B-GGUF:Q8_0"),
        ("localhost:5000/ns/m", ("localhost:5000", "ns", "m", "latest"), "localhost:5000/ns/m:latest"),
        ("registry.ollama.ai/library/llama3.2:3b", NAME, "llama3.2:3b"),
    ],
)
def test_names_take_ollamas_defaults_and_show_as_ollama_shows_them(text, parts, display):
    name = parse_ollama_name(text)
    assert name.parts == parts and name.display == display
    assert parse_ollama_name(display) == name


@pytest.mark.parametrize(
    "text, reason",
    [
        ("../llama3.2", "'..'"),
        ("library/..", "'..'"),
        ("a..b:latest", "'..'"),
        ("/usr/share/ollama/.ollama/models", "is a path"),
        ("~/models/x", "is a path"),
        ("llama\x1b[2J", "control character"),
        ("llama\n3", "control character"),
        ("a/b/c/d", "more parts"),
        ("model:", "tag is empty"),
        ("/model", "is a path"),
        ("ns//model", "namespace is empty"),
        ("name space", "model 'name space'"),
        ("ns.x/model", "namespace 'ns.x'"),
        ("-model", "model '-model'"),
        ("model:t:ag", "model 'model:t'"),
        ("model@sha256:" + "0" * 64, "model 'model@sha256'"),
        ("llama3.2:" + "x" * 81, "tag"),
        ("m" * 700, "too long"),
        ("Ollama\\model", "model"),
    ],
)
def test_names_outside_ollamas_rules_are_refused_in_one_line(text, reason):
    message = refusal(parse_ollama_name, text)
    assert reason in message and "is not an ollama model name" in message and "llama3.2:3b" in message


def test_listing_shows_each_model_by_its_short_name_with_its_blob(store, gguf_bytes):
    add_model(store, gguf_bytes, "llama3.2", "3b")
    add_model(store, gguf_bytes, "model", "tag", namespace="user")
    manifest = add_model(store, gguf_bytes, "m", "v1", namespace="ns", host="localhost:5000", projector=b"GGUF...")
    models = list_ollama([store])
    assert [m.name for m in models] == ["ollama:localhost:5000/ns/m:v1", "ollama:llama3.2:3b", "ollama:user/model:tag"]
    blob = blob_path(store, digest(gguf_bytes))
    assert {m.path for m in models} == {blob} and {m.size for m in models} == {len(gguf_bytes)}
    assert models[0].where == manifest.parent
    assert models[0].notes == ("its vision projector is left out: llama-chat reads text only",)
    assert models[1].notes == ()


def test_a_name_in_two_stores_is_listed_and_resolved_from_the_first(tmp_path, gguf_bytes):
    first, second = tmp_path / "first", tmp_path / "second"
    add_model(first, gguf_bytes, "llama3.2", "3b")
    add_model(second, gguf_bytes, "llama3.2", "3b")
    add_model(second, gguf_bytes, "other")
    assert [(m.name, m.path.parent.parent) for m in list_ollama([first, second])] == [
        ("ollama:llama3.2:3b", first), ("ollama:other:latest", second)]
    assert resolve_ollama("llama3.2:3b", [first, second]).path.parent.parent == first


@pytest.mark.parametrize("text", ["llama3.2:3b", "ollama:llama3.2:3b", "registry.ollama.ai/library/llama3.2:3b",
                                  "library/llama3.2:3b"])
def test_short_and_long_names_resolve_to_the_blob(store, gguf_bytes, text):
    add_model(store, gguf_bytes, "llama3.2", "3b")
    source = resolve_ollama(text, [store])
    assert source.path == blob_path(store, digest(gguf_bytes))
    assert (source.name, source.origin, source.sampling_source) == ("ollama:llama3.2:3b", "ollama", "ollama params")


def test_the_latest_tag_and_the_library_namespace_are_the_defaults(store, gguf_bytes):
    add_model(store, gguf_bytes, "qwen3")
    assert resolve_ollama("qwen3", [store]).name == "ollama:qwen3:latest"
    add_model(store, gguf_bytes, "model", "tag", namespace="user")
    assert resolve_ollama("user/model:tag", [store]).name == "ollama:user/model:tag"


def test_params_become_sampling_settings_by_llama_chats_names(store, gguf_bytes):
    params = {
        "temperature": 0.6, "top_k": 20.0, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1,
        "repeat_last_n": 128, "num_predict": 256, "seed": 42, "num_ctx": 8192, "mirostat": 2,
    }
    add_model(store, gguf_bytes, params=params)
    source = resolve_ollama("llama3.2", [store])
    assert source.sampling == {"temperature": 0.6, "top_k": 20, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1,
                               "repeat_last_n": 128, "max_tokens": 256}
    assert SamplingSettings(**source.sampling).max_tokens == 256  # every value one SamplingSettings takes


def test_params_llama_chat_cannot_take_are_left_out(store, gguf_bytes):
    params = {"temperature": "hot", "top_k": True, "top_p": 5, "min_p": float(0.5), "repeat_last_n": -1,
              "num_predict": -1, "repeat_penalty": 0}
    add_model(store, gguf_bytes, params=params)
    assert resolve_ollama("llama3.2", [store]).sampling == {"min_p": 0.5}


def test_stop_strings_are_kept_within_bounds(store, gguf_bytes):
    stops = ["<|eot_id|>", "<|eot_id|>", "", 7, "x" * 300, *[f"<stop{i}>" for i in range(100)]]
    add_model(store, gguf_bytes, params={"stop": stops})
    kept = resolve_ollama("llama3.2", [store]).stop_strings
    assert kept[:2] == ("<|eot_id|>", "<stop0>") and len(kept) == ollama.MAX_STOP_STRINGS
    add_model(store, gguf_bytes, "single", params={"stop": "</s>"})
    assert resolve_ollama("single", [store]).stop_strings == ("</s>",)
    add_model(store, gguf_bytes, "none", params={"stop": {"a": 1}})
    assert resolve_ollama("none", [store]).stop_strings == ()


def test_the_system_layer_is_the_default_system_prompt(store, gguf_bytes):
    add_model(store, gguf_bytes, system="You are Mario from Super Mario Bros.")
    assert resolve_ollama("llama3.2", [store]).system == "You are Mario from Super Mario Bros."
    add_model(store, gguf_bytes, "blank", system=" \n")
    add_model(store, gguf_bytes, "none")
    assert resolve_ollama("blank", [store]).system is None and resolve_ollama("none", [store]).system is None


def test_an_oversize_system_or_params_layer_is_refused(store, gguf_bytes):
    add_model(store, gguf_bytes, system="x" * (ollama.MAX_SYSTEM_BYTES + 1))
    assert "more than a file of its kind holds" in refusal(resolve_ollama, "llama3.2", [store])
    add_model(store, gguf_bytes, "p", params={"stop": ["x" * ollama.MAX_PARAMS_BYTES]})
    assert "more than a file of its kind holds" in refusal(resolve_ollama, "p", [store])
    add_model(store, gguf_bytes, "q", params=[1, 2])
    assert "not a JSON object" in refusal(resolve_ollama, "q", [store])


def test_the_go_template_is_never_used(store, gguf_bytes, plain_gguf_bytes):
    add_model(store, gguf_bytes)
    source = resolve_ollama("llama3.2", [store])
    assert source.notes == ()  # /info says it; a line at every load would be noise
    assert source.template_note == "the GGUF's own chat template (ollama's Go template is not used)"
    add_model(store, plain_gguf_bytes, "plain")
    plain = resolve_ollama("plain", [store])
    assert "the GGUF has no chat template: a built-in format is guessed from its tokenizer" in plain.notes[0]
    assert plain.template_note.startswith("a built-in format")
    add_model(store, gguf_bytes, "bare", template=None)
    assert resolve_ollama("bare", [store]).notes == () and resolve_ollama("bare", [store]).template_note is None


def test_projector_and_messages_are_left_out_with_a_note(store, gguf_bytes):
    add_model(store, gguf_bytes, template=None, projector=b"GGUF projector", messages=[{"role": "user"}])
    assert resolve_ollama("llama3.2", [store]).notes == (
        "its vision projector is left out: llama-chat reads text only",
        "the conversation ollama's Modelfile starts with (its messages layer) is left out",
    )


def test_a_lora_adapter_is_refused_and_left_out_of_the_listing(store, gguf_bytes):
    add_model(store, gguf_bytes, adapter=b"GGUF adapter")
    assert "applies a LoRA adapter" in refusal(resolve_ollama, "llama3.2", [store])
    assert list_ollama([store]) == []


def test_a_model_not_found_names_the_stores_looked_in(tmp_path, store, gguf_bytes):
    add_model(store, gguf_bytes, "llama3.2", "3b")
    message = refusal(resolve_ollama, "llama3.2", [store, tmp_path / "other"])
    assert "no ollama model llama3.2:latest" in message and str(store) in message and str(tmp_path / "other") in message
    assert "`llama-chat models`" in message
    assert "no ollama store found" in refusal(resolve_ollama, "llama3.2", [])


def hostile(store, gguf_bytes, how) -> str:
    """Break a model's store in one way; what resolving it says (and the listing leaves it out)."""
    manifest = add_model(store, gguf_bytes, "llama3.2", "3b")
    how(store, manifest)
    assert list_ollama([store]) == []
    return refusal(resolve_ollama, "llama3.2:3b", [store])


def edit_manifest(change):
    def how(store, manifest):
        contents = json.loads(manifest.read_text())
        change(store, contents)
        manifest.write_text(json.dumps(contents))
    return how


def set_model_digest(digest):
    return edit_manifest(lambda store, contents: contents["layers"][0].update(digest=digest))


def outside_blob(store, manifest):
    digest = json.loads(manifest.read_text())["layers"][0]["digest"]
    blob = blob_path(store, digest)
    outside = store.parent / "outside.gguf"
    outside.write_bytes(blob.read_bytes())
    blob.unlink()
    blob.symlink_to(outside)


def outside_manifest(store, manifest):
    outside = store.parent / "outside.json"
    manifest.rename(outside)
    manifest.symlink_to(outside)


def not_gguf(store, manifest):
    contents = json.loads(manifest.read_text())
    contents["layers"][0] = layer(store, "model", b"ggjt\x00\x00\x00\x03 an old GGML file")
    manifest.write_text(json.dumps(contents))


@pytest.mark.parametrize(
    "how, said",
    [
        (set_model_digest("sha256:" + "A" * 64), "is not sha256:<64 hex digits>"),
        (set_model_digest("sha256:abc"), "is not sha256:<64 hex digits>"),
        (set_model_digest("sha256:../../../../etc/passwd"), "is not sha256:<64 hex digits>"),
        (set_model_digest("sha256:" + "0" * 64 + "\n"), "is not sha256:<64 hex digits>"),
        (set_model_digest(None), "no media type or digest"),
        (set_model_digest("sha256:" + "0" * 64), "the model blob of llama3.2:3b is missing"),
        (edit_manifest(lambda store, contents: contents.update(layers={"a": 1})), "lists no layers"),
        (edit_manifest(lambda store, contents: contents["layers"].append("x")), "no media type or digest"),
        (outside_blob, "points outside ollama's blobs folder"),
        (outside_manifest, "points outside ollama's store"),
        (not_gguf, "not a GGUF file (it starts b'ggjt"),
        (lambda store, manifest: manifest.write_text("{" * 200_000), "not JSON (nested more than"),
        (lambda store, manifest: manifest.write_text("[1, 2"), "not JSON"),
        (lambda store, manifest: manifest.write_bytes(b"\xff\xfe{}"), "not UTF-8"),
        (lambda store, manifest: manifest.write_text(" " * ollama.MAX_MANIFEST_BYTES + "{}"),
         "more than a file of its kind holds"),
        (lambda store, manifest: (manifest.unlink(), os.mkfifo(manifest)), "not a regular file"),
        (lambda store, manifest: (manifest.unlink(), manifest.symlink_to(manifest.parent / "gone")),
         "a link to nothing"),
    ],
)
def test_a_hostile_store_ends_in_one_line_and_is_left_out_of_the_listing(store, gguf_bytes, how, said):
    message = hostile(store, gguf_bytes, how)
    assert said in message, message


def test_a_blob_that_is_a_folder_or_a_fifo_is_refused(store, gguf_bytes):
    manifest = add_model(store, gguf_bytes)
    blob = blob_path(store, json.loads(manifest.read_text())["layers"][0]["digest"])
    blob.unlink()
    os.mkfifo(blob)
    assert "not a regular file" in refusal(resolve_ollama, "llama3.2", [store])
    blob.unlink()
    blob.mkdir()
    assert "not a regular file" in refusal(resolve_ollama, "llama3.2", [store])


def test_the_listing_reads_at_most_max_manifests(store, gguf_bytes):
    model = add_model(store, gguf_bytes, "many", "t00000")
    for number in range(1, ollama.MAX_MANIFESTS + 50):
        (model.parent / f"t{number:05d}").write_bytes(model.read_bytes())
    started = time.monotonic()
    models = list_ollama([store])
    assert len(models) == ollama.MAX_MANIFESTS and models[-1].name == f"ollama:many:t{ollama.MAX_MANIFESTS - 1:05d}"
    assert time.monotonic() - started < 60


def test_the_walk_looks_at_a_bounded_number_of_entries(store, gguf_bytes, monkeypatch):
    add_model(store, gguf_bytes, "zzz")
    for number in range(50):
        (store / "manifests" / "registry.ollama.ai" / f"ns{number}").mkdir()
    monkeypatch.setattr(ollama, "MAX_ENTRIES", 40)
    assert list_ollama([store]) == []  # the walk stopped in the first folder, before any manifest


def test_folders_deeper_or_shallower_than_a_name_and_odd_names_are_passed_over(store, gguf_bytes):
    good = add_model(store, gguf_bytes, "good")
    deep = store.joinpath("manifests", "registry.ollama.ai", "library", "deep", "tag", *["d"] * 200)
    deep.mkdir(parents=True)
    (deep / "manifest").write_bytes(good.read_bytes())
    (store / "manifests" / "registry.ollama.ai" / "stray").write_bytes(good.read_bytes())
    (good.parent / ".hidden").write_bytes(good.read_bytes())
    (good.parent / "bad name").write_bytes(good.read_bytes())
    (good.parent / "loop").symlink_to(good.parent)
    (store / "manifests" / "registry.ollama.ai" / "library" / "escape").symlink_to(store.parent)
    assert [m.name for m in list_ollama([store])] == ["ollama:good:latest"]


def test_a_model_runs_from_its_blob_without_a_copy(store, tmp_path):
    """The loader reads the blob where it lies: no file appears in the store or beside it,
    and resolving the name does not take the blob into the process's own memory."""
    gguf = write_gguf(tmp_path / "build.gguf", tiny_hf_model(seed=5, hidden_size=256, intermediate_size=512))
    data = gguf.read_bytes()
    gguf.unlink()
    add_model(store, data, "tiny", params={"temperature": 0, "num_predict": 2}, system="Be brief.")
    files_before = snapshot(tmp_path)
    gc.collect()
    own_before = memory_now_mb()
    source = resolve_ollama("tiny", [store])
    own_after = memory_now_mb()
    if own_before is not None:  # Linux: the blob (over 3 MB) was not read into memory
        assert own_after[1] - own_before[1] < len(data) / 2**20 / 2
    model = load(source.path, device="cpu")
    generation = model.generate(model.tokenizer.encode("hello"), SamplingSettings(**source.sampling), stop_ids=())
    list(generation)
    assert len(generation.tokens) == 2 and generation.stats.stop_reason == "max_tokens"
    assert snapshot(tmp_path) == files_before
    assert source.path.samefile(blob_path(store, digest(data)))


def snapshot(folder):
    """Every file under `folder`: its inode, size and modification time."""
    return {path: (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()}


def test_layers_of_unknown_types_are_passed_over(store, gguf_bytes):
    layers = json.loads(add_model(store, gguf_bytes).read_text())["layers"]
    layers.append({"mediaType": "application/vnd.ollama.image.future", "digest": "sha256:" + "1" * 64})
    write_manifest(store, ("registry.ollama.ai", "library", "llama3.2", "latest"), layers)
    assert resolve_ollama("llama3.2", [store]).path.is_file()  # a blob it never reads may be missing
