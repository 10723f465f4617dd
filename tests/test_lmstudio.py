"""Models in LM Studio's folders (PUBLISHER/REPO/FILE.gguf), listed and resolved where they
lie: projectors and later parts of split models are no models, names stay inside the folder."""

import json
import os

import pytest

from llama_chat.errors import LlamaChatError
from llama_chat.models import lmstudio, ollama
from llama_chat.models.lmstudio import list_lmstudio, resolve_lmstudio, store_roots

from .test_gguf import tiny_hf_model, write_gguf


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_hf_model(seed=4)).read_bytes()


@pytest.fixture
def root(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    return folder


def put(root, relative: str, data: bytes):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def refusal(call, *args) -> str:
    with pytest.raises(LlamaChatError) as raised:
        call(*args)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_store_roots_are_the_folders_lm_studio_uses(tmp_path):
    home = tmp_path / "home"
    (home / ".cache" / "lm-studio" / "models").mkdir(parents=True)
    assert store_roots(home) == [home / ".cache" / "lm-studio" / "models"]
    (home / ".lmstudio" / "models").mkdir(parents=True)
    assert store_roots(home) == [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    chosen = tmp_path / "disk" / "llms"
    chosen.mkdir(parents=True)
    (home / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(chosen)}))
    assert store_roots(home)[0] == chosen


def test_the_home_pointer_names_lm_studios_home(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (elsewhere / "models").mkdir(parents=True)
    home.mkdir()
    (home / ".lmstudio-home-pointer").write_text(f"{elsewhere}\n")
    assert store_roots(home) == [elsewhere / "models"]
    (home / ".lmstudio-home-pointer").write_text("relative/path")
    assert store_roots(home) == []


@pytest.mark.parametrize("settings", ["{", "[1]", '{"downloadsFolder": 3}', '{"downloadsFolder": "relative"}',
                                      "x" * (lmstudio.MAX_SETTINGS_BYTES + 1)])
def test_settings_that_name_no_folder_are_passed_over(tmp_path, settings):
    (tmp_path / ".lmstudio" / "models").mkdir(parents=True)
    (tmp_path / ".lmstudio" / "settings.json").write_text(settings)
    assert store_roots(tmp_path) == [tmp_path / ".lmstudio" / "models"]


def test_listing_shows_models_by_publisher_repo_and_file(root, gguf_bytes):
    put(root, "lmstudio-community/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf", gguf_bytes)
    put(root, "lmstudio-community/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf", gguf_bytes)
    put(root, "lmstudio-community/Qwen3-0.6B-GGUF/README.md", b"# read me")
    put(root, "unsloth/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf", gguf_bytes)
    put(root, "unsloth/gemma-3-4b-it-GGUF/mmproj-F16.gguf", b"GGUF projector")
    put(root, "unsloth/gemma-3-4b-it-GGUF/partial.gguf", b"\0\0\0\0 a download not yet begun")
    models = list_lmstudio([root])
    assert [m.name for m in models] == [
        "lmstudio:lmstudio-community/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf",
        "lmstudio:lmstudio-community/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf",
        "lmstudio:unsloth/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf",
    ]
    assert {m.size for m in models} == {len(gguf_bytes)}
    assert models[2].where == root / "unsloth" / "gemma-3-4b-it-GGUF"
    assert models[2].notes == ("its vision projector (mmproj-F16.gguf) is left out: llama-chat reads text only",)
    assert models[0].notes == ()
    assert isinstance(models[0], ollama.StoreModel)


def test_a_split_model_is_listed_once_by_its_first_part(root, gguf_bytes):
    for number in (1, 2, 3):
        put(root, f"p/big/Big-Q4-{number:05d}-of-00003.gguf", gguf_bytes)
    put(root, "p/broken/Broken-00001-of-00002.gguf", gguf_bytes)  # its second part missing
    put(root, "p/broken/Orphan-00002-of-00002.gguf", gguf_bytes)
    models = list_lmstudio([root])
    assert [(m.name, m.size) for m in models] == [("lmstudio:p/big/Big-Q4-00001-of-00003.gguf", 3 * len(gguf_bytes))]
    assert "part 2 of 2 of the split model is missing" in refusal(resolve_lmstudio, "p/broken", [root])
    assert "a later part of a split model" in refusal(resolve_lmstudio, "p/broken/Orphan-00002-of-00002.gguf", [root])
    assert resolve_lmstudio("p/big", [root]).path.name == "Big-Q4-00001-of-00003.gguf"


def test_names_resolve_to_the_file_in_place(root, gguf_bytes):
    path = put(root, "unsloth/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf", gguf_bytes)
    put(root, "unsloth/gemma-3-4b-it-GGUF/mmproj-F16.gguf", b"GGUF projector")
    put(root, "unsloth/gemma-3-4b-it-GGUF/README.md", b"# read me")
    for name in ("lmstudio:unsloth/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf", "unsloth/gemma-3-4b-it-GGUF",
                 "lmstudio:unsloth/gemma-3-4b-it-GGUF"):
        source = resolve_lmstudio(name, [root])
        assert source.path == path and source.origin == "lmstudio"
        assert source.name == "lmstudio:unsloth/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf"
        assert source.notes == ("its vision projector (mmproj-F16.gguf) is left out: llama-chat reads text only",)


def test_a_repo_of_several_models_must_be_named_by_file(root, gguf_bytes):
    for quant in ("Q4_K_M", "Q8_0"):
        put(root, f"p/r/m-{quant}.gguf", gguf_bytes)
    message = refusal(resolve_lmstudio, "lmstudio:p/r", [root])
    assert "holds 2 GGUF models; name one: lmstudio:p/r/m-Q4_K_M.gguf, lmstudio:p/r/m-Q8_0.gguf" in message
    for number in range(20):
        put(root, f"p/many/m-{number:02d}.gguf", gguf_bytes)
    assert "and 10 more" in refusal(resolve_lmstudio, "p/many", [root])
    (root / "p" / "empty").mkdir()
    assert "no GGUF model in lmstudio:p/empty" in refusal(resolve_lmstudio, "p/empty", [root])


def test_a_model_not_found_names_the_folders_looked_in(tmp_path, root):
    message = refusal(resolve_lmstudio, "p/r/m.gguf", [root])
    assert str(root) in message and "`llama-chat models`" in message
    assert "no LM Studio models folder found" in refusal(resolve_lmstudio, "p/r", [])


@pytest.mark.parametrize(
    "name, reason",
    [
        ("../../etc/passwd.gguf", "it has a part '..'"),
        ("p/../r", "it has a part '..'"),
        ("p/./r", "it has a part '.'"),
        ("p//r", "it has a part ''"),
        ("/etc/x/y.gguf", "is a path"),
        ("~/x/y.gguf", "is a path"),
        ("p\\r", "is a path"),
        ("p/r\x00/m.gguf", "control character"),
        ("p/r/m.txt", "not a .gguf file"),
        ("p", "expected PUBLISHER/REPO"),
        ("p/r/m/x.gguf", "expected PUBLISHER/REPO"),
        ("p/" + "r" * 300, "too long"),
    ],
)
def test_names_that_leave_the_folder_are_refused(root, name, reason):
    message = refusal(resolve_lmstudio, name, [root])
    assert reason in message and "is not an LM Studio model name" in message


def test_files_that_are_not_gguf_or_are_projectors_are_refused(root):
    put(root, "p/r/m.gguf", b"ggjt old")
    assert "not a GGUF file" in refusal(resolve_lmstudio, "p/r/m.gguf", [root])
    put(root, "p/v/mmproj-model-f16.gguf", b"GGUF projector")
    assert "a vision projector, not a model" in refusal(resolve_lmstudio, "p/v/mmproj-model-f16.gguf", [root])
    os.mkfifo(root / "p" / "r" / "fifo.gguf")
    assert "not a regular file" in refusal(resolve_lmstudio, "p/r/fifo.gguf", [root])


def test_links_out_of_the_folder_are_not_followed(tmp_path, root, gguf_bytes):
    outside = put(tmp_path, "outside/r/m.gguf", gguf_bytes)
    put(root, "p/r/real.gguf", gguf_bytes)
    (root / "p" / "r" / "link.gguf").symlink_to(outside)
    (root / "p" / "linked").symlink_to(outside.parent)
    (root / "q").symlink_to(tmp_path / "outside")
    (root / "p" / "r" / "inner.gguf").symlink_to(root / "p" / "r" / "real.gguf")
    assert [m.name for m in list_lmstudio([root])] == ["lmstudio:p/r/inner.gguf", "lmstudio:p/r/real.gguf"]
    assert "points outside" in refusal(resolve_lmstudio, "p/r/link.gguf", [root])
    assert "points outside" in refusal(resolve_lmstudio, "p/linked", [root])
    assert "points outside" in refusal(resolve_lmstudio, "q/r/m.gguf", [root])


def test_the_walk_is_bounded_in_depth_and_count(root, gguf_bytes, monkeypatch):
    put(root, "p/r/deeper/still/m.gguf", gguf_bytes)
    put(root, "top.gguf", gguf_bytes)
    put(root, "p/shallow.gguf", gguf_bytes)
    put(root, ".hidden/r/m.gguf", gguf_bytes)
    assert list_lmstudio([root]) == []
    for number in range(30):
        put(root, f"many/r/m{number:02d}.gguf", gguf_bytes)
    monkeypatch.setattr(lmstudio, "MAX_FILES", 12)
    assert len(list_lmstudio([root])) == 12
