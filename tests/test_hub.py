"""Models from the Hugging Face Hub: the real `huggingface_hub` client against a loopback hub
(tests/hub_server.py), into a private Hugging Face cache, each path ending in the CLI's reply."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QType

from llama_chat.cli import main
from llama_chat.errors import LlamaChatError
from llama_chat.models import hub, hub_download
from llama_chat.models.names import parse_name

from .hub_server import HubRepo, HubServer, hub_server  # noqa: F401 (a fixture)
from .test_gguf import tiny_hf_model, write_gguf
from .test_gguf_split import write_split
from .test_hf_checkpoint import save_model_directory

GGUF_REPO = "tiny-org/Tiny-GGUF"
TOKEN = "hf_secret_for_the_gated_repo"


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, bytes]:
    """A GGUF repository: three quantisations (each a tiny model of its own seed), a split
    file's parts, a vision projector and a README."""
    folder = tmp_path_factory.mktemp("gguf-repo")
    files = {"README.md": b"# Tiny\n"}
    for seed, (quant, qtype) in enumerate((("Q2_K", QType.F32), ("Q4_K_M", QType.Q8_0), ("Q8_0", QType.Q8_0))):
        path = write_gguf(folder / f"Tiny-{quant}.gguf", tiny_hf_model(seed=seed), qtype=qtype)
        files[path.name] = path.read_bytes()
    files["mmproj-Tiny-F16.gguf"] = b"GGUF not a model"
    for part in write_split(folder / "split", tiny_hf_model(seed=7), qtype=QType.Q8_0):
        files[f"Q5_0/{part.name.replace('model', 'Tiny-Q5_0')}"] = part.read_bytes()
    return files


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory) -> dict[str, bytes]:
    """A safetensors repository in two shards, with the .bin copy the hub often holds beside them."""
    folder = tmp_path_factory.mktemp("st-repo")
    save_model_directory(folder, max_shard_size="20KB")
    files = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    assert sum(name.endswith(".safetensors") for name in files) >= 2
    files["pytorch_model.bin"] = b"pickled weights we must never fetch"
    files["onnx/model.onnx"] = b"onnx copy"
    return files


@pytest.fixture
def hub_env(hub_server, tmp_path, monkeypatch):  # noqa: F811 (the fixture imported above)
    """The hub's variables pointed at the loopback hub and a private cache."""
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf-cache"


def reply(capsys, *flags: str) -> tuple[int, str, str]:
    code = main(["-p", "Hello", "--max-tokens", "3", "--temperature", "0", "--compile", "off", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> bool:
    """What the run said is one line of llama-chat's (beside the progress bars), with no traceback."""
    return len([line for line in err.splitlines() if line.startswith("llama-chat: ")]) == 1 and "Traceback" not in err


def byte_gets(server: HubServer, name: str) -> list[str]:
    return [request.path for request in server.file_gets(name)]


def test_a_quantisation_by_name_is_fetched_once_and_answers(hub_server, hub_env, gguf_files, capsys):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    code, out, err = reply(capsys, "-m", f"{GGUF_REPO}:Q4_K_M")
    assert code == 0 and out.strip() and "Traceback" not in err
    assert hub_server.bytes_served[(GGUF_REPO, "Tiny-Q4_K_M.gguf")] == len(gguf_files["Tiny-Q4_K_M.gguf"])
    fetched = {name for (_, name), count in hub_server.bytes_served.items() if count}
    assert fetched == {"Tiny-Q4_K_M.gguf"}  # one quantisation only
    snapshot = next(hub_env.glob("models--tiny-org--Tiny-GGUF/snapshots/*"))
    assert (snapshot / "Tiny-Q4_K_M.gguf").read_bytes() == gguf_files["Tiny-Q4_K_M.gguf"]

    hub_server.requests.clear()
    code, out, err = reply(capsys, "-m", f"{GGUF_REPO}:q4_k_m")
    assert code == 0 and out.strip()
    assert byte_gets(hub_server, "Tiny-Q4_K_M.gguf") == []  # the second start reads the cache


def test_no_quantisation_named_takes_q4_k_m(hub_server, hub_env, gguf_files, capsys):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    assert main(["pull", GGUF_REPO]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.name == "Tiny-Q4_K_M.gguf" and path.is_relative_to(hub_env)


def test_a_split_file_arrives_whole_and_loads_from_the_cache(hub_server, hub_env, gguf_files, capsys):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    code, out, err = reply(capsys, "-m", f"{GGUF_REPO}:Q5_0")
    assert code == 0 and out.strip(), err
    parts = [name for name in gguf_files if name.startswith("Q5_0/")]
    assert len(parts) == 3 and all(hub_server.bytes_served[(GGUF_REPO, name)] == len(gguf_files[name])
                                   for name in parts)


def test_a_safetensors_repo_fetches_its_shards_and_never_the_bin(hub_server, hub_env, checkpoint_files, capsys):
    hub_server.add(HubRepo("tiny-org/Tiny", checkpoint_files))
    code, out, err = reply(capsys, "-m", "hf:tiny-org/Tiny", "--quantize", "none", "--stats")
    assert code == 0 and "tok/s" in err, err  # a random model may end its reply at once
    fetched = {name for (_, name), count in hub_server.bytes_served.items() if count}
    assert {name for name in fetched if name.endswith(".safetensors")} == {
        name for name in checkpoint_files if name.endswith(".safetensors")}
    assert not fetched & {"pytorch_model.bin", "onnx/model.onnx"}
    assert {"config.json", "tokenizer.json"} <= {request.filename for request in hub_server.requests}


def test_a_gated_repo_says_where_to_accept_its_licence_and_what_to_set(hub_server, hub_env, gguf_files, capsys,
                                                                        monkeypatch):
    hub_server.add(HubRepo("gate/Keeper-GGUF", gguf_files, gated=True, tokens_with_access={TOKEN}))
    code, out, err = reply(capsys, "-m", "gate/Keeper-GGUF")
    assert code == 1 and one_line(err) and "Traceback" not in err
    assert f"{hub_server.endpoint}/gate/Keeper-GGUF" in err and "HF_TOKEN" in err and "gated" in err

    monkeypatch.setenv("HF_TOKEN", "hf_a_token_without_access")
    code, out, err = reply(capsys, "-m", "gate/Keeper-GGUF")
    assert code == 1 and "has no access" in err and one_line(err)

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, out, err = reply(capsys, "-m", "gate/Keeper-GGUF")
    assert code == 0 and out.strip(), err


def test_an_unknown_repo_is_one_line(hub_server, hub_env, capsys):
    code, out, err = reply(capsys, "-m", "nobody/Nothing-GGUF")
    assert code == 1 and one_line(err) and "no such model repository on the hub" in err


def test_a_dropped_connection_is_picked_up_where_it_stopped(hub_server, hub_env, gguf_files, capsys):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    name = "Tiny-Q4_K_M.gguf"
    size = len(gguf_files[name])
    hub_server.drop_after(name, size // 2, reset=True)
    code, out, err = reply(capsys, "-m", GGUF_REPO)
    assert code == 0 and out.strip(), err
    gets = hub_server.file_gets(name)
    assert len(gets) == 2 and gets[0].range == "bytes=0-"
    resumed_at = int(gets[1].range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= size // 2  # what arrived before the reset (the kernel may lose the rest)
    assert hub_server.bytes_served[(GGUF_REPO, name)] <= 1.1 * size


def test_a_run_that_gives_up_leaves_what_arrived_for_the_next(hub_server, hub_env, gguf_files, capsys,
                                                               monkeypatch):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    name = "Tiny-Q4_K_M.gguf"
    size = len(gguf_files[name])
    monkeypatch.setattr(hub_download, "RETRIES", 0)  # the first run gives up at the first drop
    hub_server.drop_after(name, 4000)
    code, out, err = reply(capsys, "-m", GGUF_REPO)
    assert code == 1 and "broke off" in err and "the same command resumes it" in err and one_line(err), err
    code, out, err = reply(capsys, "-m", GGUF_REPO)
    assert code == 0 and out.strip(), err
    assert hub_server.file_gets(name)[-1].range == f"bytes={4000}-"
    assert hub_server.bytes_served[(GGUF_REPO, name)] == size


def test_a_killed_download_resumes_from_its_partial_file(hub_server, hub_env, gguf_files, capsys):
    """What a kill (or Ctrl-C) leaves: the part that arrived, beside the blob it will become."""
    repo = hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    name = "Tiny-Q4_K_M.gguf"
    data = gguf_files[name]
    blobs = hub_env / "models--tiny-org--Tiny-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{repo.sha256(name)}.incomplete").write_bytes(data[: len(data) // 3])
    code, out, err = reply(capsys, "-m", GGUF_REPO)
    assert code == 0 and out.strip(), err
    assert hub_server.bytes_served[(GGUF_REPO, name)] == len(data) - len(data) // 3 <= 1.1 * len(data)
    assert hub_server.file_gets(name)[0].range == f"bytes={len(data) // 3}-"


def test_offline_the_cache_serves_and_says_so(hub_server, hub_env, gguf_files, capsys, monkeypatch):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    assert main(["pull", f"{GGUF_REPO}:Q8_0"]) == 0
    capsys.readouterr()
    hub_server.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = reply(capsys, "-m", f"{GGUF_REPO}:Q8_0")
    assert code == 0 and out.strip()
    assert "HF_HUB_OFFLINE is set: using the cached tiny-org/Tiny-GGUF" in err
    assert hub_server.requests == []

    code, out, err = reply(capsys, "-m", f"{GGUF_REPO}:Q2_K")  # not in the cache
    assert code == 1 and one_line(err) and "llama-chat pull tiny-org/Tiny-GGUF:Q2_K" in err


def test_an_unreachable_hub_falls_back_to_the_cache(hub_server, hub_env, gguf_files, capsys, monkeypatch):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    assert main(["pull", GGUF_REPO]) == 0
    capsys.readouterr()
    hub_server.stop()
    code, out, err = reply(capsys, "-m", GGUF_REPO)
    assert code == 0 and out.strip(), err
    assert "cannot be reached" in err and "using the cached tiny-org/Tiny-GGUF" in err
    code, out, err = reply(capsys, "-m", "tiny-org/Other-GGUF")
    assert code == 1 and one_line(err) and "not in the Hugging Face cache" in err


@pytest.mark.parametrize("entries", [
    [{"type": "file", "path": "../escape.gguf", "size": 10, "oid": "0" * 40}],
    [{"type": "file", "path": "/etc/escape.gguf", "size": 10, "oid": "0" * 40}],
    [{"type": "file", "path": "a\x1b]0;pwned\x07.gguf", "size": 10, "oid": "0" * 40}],
    [{"type": "file", "path": f"f{n}.gguf", "size": 10, "oid": "0" * 40} for n in range(30_000)],
])
def test_a_hostile_listing_is_refused_and_nothing_is_written(hub_server, hub_env, gguf_files, capsys, entries,
                                                             tmp_path):
    hub_server.add(HubRepo("evil/Repo-GGUF", gguf_files, listing_override=entries))
    code, out, err = reply(capsys, "-m", "evil/Repo-GGUF")
    assert code == 1 and one_line(err) and "refused" in err and "\x1b" not in err
    assert not any(hub_env.rglob("*.gguf")) and not (tmp_path / "escape.gguf").exists()
    assert all(count == 0 for count in hub_server.bytes_served.values())


def test_a_file_that_does_not_match_its_sha256_is_removed(hub_server, hub_env, gguf_files, capsys):
    name = "Tiny-Q4_K_M.gguf"
    repo = HubRepo(GGUF_REPO, gguf_files)
    entries = repo.tree_entries()
    for entry in entries:
        if entry["path"] == name:
            entry["lfs"] = dict(entry["lfs"], oid="f" * 64)
    hub_server.add(HubRepo(GGUF_REPO, gguf_files, listing_override=entries))
    code, out, err = reply(capsys, "-m", GGUF_REPO)
    assert code == 1 and "does not have the sha256 the hub states" in err and one_line(err)
    assert not any(path.name == name for path in hub_env.rglob("*.gguf"))


def test_too_little_disk_space_is_refused_before_the_first_byte(hub_server, hub_env, gguf_files, monkeypatch):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 1000, 1000))
    with pytest.raises(LlamaChatError, match="only 1.0 kB is free .*HF_HUB_CACHE"):
        hub.fetch(parse_name(GGUF_REPO), hub.HubSettings.from_environment(), print)
    assert all(count == 0 for count in hub_server.bytes_served.values())


def test_models_lists_what_the_hub_cache_holds(hub_server, hub_env, gguf_files, checkpoint_files, capsys):
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    hub_server.add(HubRepo("tiny-org/Tiny", checkpoint_files))
    for name in (GGUF_REPO, f"{GGUF_REPO}:Q5_0", "tiny-org/Tiny"):
        assert main(["pull", name]) == 0
    capsys.readouterr()
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert {f"{GGUF_REPO}:Q4_K_M", f"{GGUF_REPO}:Q5_0", "tiny-org/Tiny"} <= set(rows)
    assert rows[f"{GGUF_REPO}:Q4_K_M"]["architecture"] == "llama"
    assert rows[f"{GGUF_REPO}:Q5_0"]["size"] == sum(len(data) for name, data in gguf_files.items()
                                                    if name.startswith("Q5_0/"))


def test_the_real_cli_downloads_and_answers_then_starts_without_the_bytes(hub_server, gguf_files, tmp_path):
    """The target as a person runs it: `llama-chat -m OWNER/REPO:Q4_K_M -p ...`, twice."""
    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    environment = dict(os.environ, HF_ENDPOINT=hub_server.endpoint, HF_HOME=str(tmp_path / "home"),
                       HF_HUB_CACHE=str(tmp_path / "cache"))
    environment.pop("HF_TOKEN", None)
    command = [sys.executable, "-m", "llama_chat", "-m", f"{GGUF_REPO}:Q4_K_M", "-p", "Hi", "--max-tokens", "4",
               "--temperature", "0"]
    for run in range(2):
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.strip() and "Traceback" not in done.stderr, done.stderr
    gets = byte_gets(hub_server, "Tiny-Q4_K_M.gguf")
    assert len(gets) == 1  # the first run's only


def test_a_hub_that_never_answers_is_out_of_reach_not_a_hang(hub_env, capsys, monkeypatch):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections are taken into the backlog and never answered
    monkeypatch.setattr(hub, "LISTING_SECONDS", 1)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    try:
        started = time.monotonic()
        code, out, err = reply(capsys, "-m", GGUF_REPO)
        assert time.monotonic() - started < 30
    finally:
        silent.close()
    assert code == 1 and one_line(err) and "cannot be reached" in err and "not in the Hugging Face cache" in err


def test_the_python_api_loads_a_hub_id(hub_server, hub_env, gguf_files):
    import llama_chat

    hub_server.add(HubRepo(GGUF_REPO, gguf_files))
    model = llama_chat.load(f"{GGUF_REPO}:Q8_0", device="cpu")
    assert model.name == f"{GGUF_REPO}:Q8_0" and model.source.origin == "hub"
    assert model.source.path.read_bytes() == gguf_files["Tiny-Q8_0.gguf"]


def test_a_listing_longer_than_its_bound_is_refused_before_it_is_read_whole(hub_server, hub_env, gguf_files, capsys,
                                                                           monkeypatch):
    monkeypatch.setattr(hub, "LISTING_BYTES", 50_000)
    entries = [{"type": "file", "path": f"f{n}.gguf", "size": 10, "oid": "0" * 40} for n in range(5_000)]
    hub_server.add(HubRepo("evil/Long-GGUF", gguf_files, listing_override=entries))
    code, out, err = reply(capsys, "-m", "evil/Long-GGUF")
    assert code == 1 and one_line(err) and "listing is larger than" in err


@pytest.mark.parametrize("siblings", ['{"sha": "nope"}', '{"sha": "' + "a" * 40 + '", "siblings": [{"rfilename": 7}]}',
                                      '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['])
def test_a_listing_no_hub_writes_is_one_line(hub_server, hub_env, capsys, monkeypatch, siblings):
    from .hub_server import _Handler

    real = _Handler._respond

    def answer(handler):
        if handler.path.startswith("/api/models/evil/Odd"):
            body = siblings.encode()
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        real(handler)

    monkeypatch.setattr(_Handler, "_respond", answer)
    code, out, err = reply(capsys, "-m", "evil/Odd")
    assert code == 1 and one_line(err) and "not one a hub writes" in err
