"""The real huggingface_hub client against tests/hub_server.py: what a downloader built on the client can rely on."""

import hashlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .hub_server import HubRepo, HubServer, git_blob_sha1, hub_server  # noqa: F401

REPO = "owner/tiny"
GGUF = bytes(range(256)) * 16  # 4 KiB
CONFIG = b'{"dim": 8}'


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE is read when huggingface_hub is imported: a user's setting must not switch these tests off."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def repo(hub_server: HubServer) -> HubRepo:
    return hub_server.add(HubRepo(REPO, {"model.gguf": GGUF, "config.json": CONFIG, "sub/w.safetensors": b"w" * 300}))


def download(server: HubServer, cache: Path, filename: str = "model.gguf", **kwargs: Any) -> Path:
    kwargs.setdefault("token", False)
    return Path(hf_hub_download(kwargs.pop("repo_id", REPO), filename, cache_dir=cache, endpoint=server.endpoint,
                                **kwargs))


def test_model_info_lists_sizes_and_sha256(hub_server: HubServer, repo: HubRepo) -> None:
    info = HfApi(endpoint=hub_server.endpoint, token=False).model_info(REPO, revision="main", files_metadata=True)
    assert info.sha == repo.revision_sha and len(info.sha) == 40
    siblings = {s.rfilename: s for s in info.siblings}
    assert siblings["model.gguf"].size == len(GGUF)
    assert siblings["model.gguf"].lfs.sha256 == hashlib.sha256(GGUF).hexdigest()
    assert siblings["config.json"].lfs is None and siblings["config.json"].blob_id == git_blob_sha1(CONFIG)
    assert hub_server.request_counts[("GET", f"/api/models/{REPO}/revision/main")] == 1


def test_list_repo_tree_follows_the_pages(repo: HubRepo) -> None:
    with HubServer([repo], tree_page_size=2) as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        entries = list(api.list_repo_tree(REPO, recursive=True, expand=True, revision=repo.revision_sha))
        files = {e.path: e for e in entries if hasattr(e, "lfs")}
        assert files["model.gguf"].lfs.sha256 == hashlib.sha256(GGUF).hexdigest()
        assert files["model.gguf"].size == len(GGUF) and files["config.json"].blob_id == git_blob_sha1(CONFIG)
        assert files["model.gguf"].last_commit.oid == repo.revision_sha
        assert sorted(e.path for e in entries) == ["config.json", "model.gguf", "sub", "sub/w.safetensors"]
        assert server.request_counts[("GET", f"/api/models/{REPO}/tree/{repo.revision_sha}")] == 2
        assert sorted(api.list_repo_files(REPO)) == ["config.json", "model.gguf", "sub/w.safetensors"]
        assert [e.path for e in api.list_repo_tree(REPO, path_in_repo="sub")] == ["sub/w.safetensors"]


def test_resolve_headers_and_ranges(hub_server: HubServer, repo: HubRepo) -> None:
    """Checked without the client: the headers it relies on, no Xet headers (so no Xet path), and ranges."""
    url = f"{hub_server.endpoint}/{REPO}/resolve/main/model.gguf"
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as response:
        headers = response.headers
    sha256 = hashlib.sha256(GGUF).hexdigest()
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{sha256}"'
    assert headers["X-Linked-Size"] == headers["Content-Length"] == str(len(GGUF))
    assert headers["X-Repo-Commit"] == repo.revision_sha and headers["Accept-Ranges"] == "bytes"
    assert not [name for name in headers if name.lower().startswith("x-xet")]
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=4000-"}), timeout=10) as response:
        assert response.status == 206 and response.read() == GGUF[4000:]
        assert response.headers["Content-Range"] == f"bytes 4000-{len(GGUF) - 1}/{len(GGUF)}"
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Range": f"bytes={len(GGUF)}-"}), timeout=10)
    assert error.value.code == 416
    assert hub_server.bytes_served[(REPO, "model.gguf")] == len(GGUF) - 4000
    assert [r.range for r in hub_server.file_gets("model.gguf")] == ["bytes=4000-", f"bytes={len(GGUF)}-"]


def test_download_lands_in_the_standard_cache_layout(hub_server: HubServer, repo: HubRepo, tmp_path: Path) -> None:
    path = download(hub_server, tmp_path)
    storage = tmp_path / "models--owner--tiny"
    sha256 = hashlib.sha256(GGUF).hexdigest()
    assert path == storage / "snapshots" / repo.revision_sha / "model.gguf"
    assert path.is_symlink() and path.resolve() == storage / "blobs" / sha256
    assert path.read_bytes() == GGUF
    assert (storage / "refs" / "main").read_text() == repo.revision_sha
    config = download(hub_server, tmp_path, "config.json")
    assert config.resolve() == storage / "blobs" / git_blob_sha1(CONFIG)  # a non-LFS blob is named by its git oid
    sub = download(hub_server, tmp_path, "w.safetensors", subfolder="sub")
    assert sub == storage / "snapshots" / repo.revision_sha / "sub" / "w.safetensors"


def test_second_download_makes_no_get(hub_server: HubServer, repo: HubRepo, tmp_path: Path) -> None:
    download(hub_server, tmp_path)
    before = len(hub_server.requests)
    download(hub_server, tmp_path)  # a branch: one HEAD to learn its commit, no GET
    assert [(r.method, r.filename) for r in hub_server.requests[before:]] == [("HEAD", "model.gguf")]
    download(hub_server, tmp_path, revision=repo.revision_sha)  # a commit already in the cache: no request at all
    download(hub_server, tmp_path, local_files_only=True)
    assert len(hub_server.requests) == before + 1
    assert len(hub_server.file_gets("model.gguf")) == 1
    assert hub_server.bytes_served[(REPO, "model.gguf")] == len(GGUF)


def test_offline_reads_the_cache_and_fails_without_it(hub_server: HubServer, repo: HubRepo, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LocalEntryNotFoundError):
        download(hub_server, tmp_path, local_files_only=True)
    download(hub_server, tmp_path)
    before = len(hub_server.requests)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert download(hub_server, tmp_path).read_bytes() == GGUF
    with pytest.raises(LocalEntryNotFoundError):
        download(hub_server, tmp_path, "config.json")
    assert len(hub_server.requests) == before


def test_gated_repo_needs_a_listed_token(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.add(HubRepo("org/gated", {"model.gguf": GGUF}, gated=True, tokens_with_access={"hf_right"}))
    info = HfApi(endpoint=hub_server.endpoint, token=False).model_info("org/gated")
    assert info.gated == "manual"  # the listing is public, as on the Hub; the bytes are not
    with pytest.raises(GatedRepoError) as missing:
        download(hub_server, tmp_path, repo_id="org/gated")
    assert missing.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as wrong:
        download(hub_server, tmp_path, repo_id="org/gated", token="hf_wrong")
    assert wrong.value.response.status_code == 403
    assert download(hub_server, tmp_path, repo_id="org/gated", token="hf_right").read_bytes() == GGUF
    assert hub_server.file_gets("model.gguf")[-1].authorization == "Bearer hf_right"


def test_missing_repo_revision_and_file(hub_server: HubServer, repo: HubRepo, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub_server.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("owner/absent")
    with pytest.raises(RepositoryNotFoundError):
        download(hub_server, tmp_path, repo_id="owner/absent")
    with pytest.raises(RevisionNotFoundError):
        download(hub_server, tmp_path, revision="v9")
    with pytest.raises(RemoteEntryNotFoundError):
        download(hub_server, tmp_path, "absent.gguf")
    assert hub_server.bytes_served == {}


def test_a_closed_connection_is_retried_from_zero_within_the_call(hub_server: HubServer, repo: HubRepo,
                                                                   tmp_path: Path) -> None:
    """The client retries an incomplete body (httpx2.RemoteProtocolError) in the same call, after a 1 s sleep; it
    resumes from the bytes it wrote, and it writes whole DOWNLOAD_CHUNK_SIZE (10 MiB) chunks: below that, from 0."""
    hub_server.drop_after("model.gguf", 1000)
    assert download(hub_server, tmp_path).read_bytes() == GGUF
    assert [r.range for r in hub_server.file_gets("model.gguf")] == [None, None]
    assert hub_server.bytes_served[(REPO, "model.gguf")] == len(GGUF) + 1000


def test_a_closed_connection_resumes_at_the_last_whole_chunk(hub_server: HubServer, repo: HubRepo, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256)
    hub_server.drop_after("model.gguf", 3000)
    assert download(hub_server, tmp_path).read_bytes() == GGUF
    assert [r.range for r in hub_server.file_gets("model.gguf")] == [None, f"bytes={3000 // 256 * 256}-"]
    assert hub_server.bytes_served[(REPO, "model.gguf")] <= 1.1 * len(GGUF)


def test_a_reset_connection_fails_the_call_and_the_next_starts_over(hub_server: HubServer, repo: HubRepo,
                                                                    tmp_path: Path) -> None:
    """A reset (httpx2.ReadError) is not retried, and the partial file is deleted: no resume across calls."""
    hub_server.drop_after("model.gguf", 3000, reset=True)
    with pytest.raises(httpx2.ReadError):
        download(hub_server, tmp_path)
    assert not list((tmp_path / "models--owner--tiny" / "blobs").iterdir())
    assert download(hub_server, tmp_path).read_bytes() == GGUF
    assert [r.range for r in hub_server.file_gets("model.gguf")] == [None, None]


def test_snapshot_download(hub_server: HubServer, repo: HubRepo, tmp_path: Path) -> None:
    folder = Path(snapshot_download(REPO, cache_dir=tmp_path, endpoint=hub_server.endpoint, token=False))
    assert folder.name == repo.revision_sha
    assert (folder / "model.gguf").read_bytes() == GGUF and (folder / "sub" / "w.safetensors").exists()
    assert hub_server.request_counts[("GET", f"/api/models/{REPO}/revision/main")] == 1
    assert hub_server.request_counts[("GET", f"/api/models/{REPO}/tree/{repo.revision_sha}")] == 1


def test_hostile_listing_reaches_the_client_raw(hub_server: HubServer, tmp_path: Path) -> None:
    hostile = [{"type": "file", "path": name, "size": 1, "oid": "0" * 40}
               for name in ("../evil.gguf", "/etc/x.gguf", "a\x1b[2Jb.gguf")]
    flood = [{"type": "file", "path": f"f{i}.gguf", "size": 1, "oid": "0" * 40} for i in range(100_000)]
    hub_server.add(HubRepo("bad/listing", {"model.gguf": GGUF}, listing_override=hostile + flood))
    api = HfApi(endpoint=hub_server.endpoint, token=False)
    names = api.list_repo_files("bad/listing")
    assert names[:3] == ["../evil.gguf", "/etc/x.gguf", "a\x1b[2Jb.gguf"] and len(names) == 100_003
    assert hub_server.request_counts[("GET", "/api/models/bad/listing/tree/main")] == 101  # 1000 a page
    assert [s.rfilename for s in api.model_info("bad/listing").siblings][:2] == ["../evil.gguf", "/etc/x.gguf"]
    assert download(hub_server, tmp_path, repo_id="bad/listing").read_bytes() == GGUF


def test_hf_endpoint_points_a_fresh_process_at_the_server(hub_server: HubServer, repo: HubRepo,
                                                          tmp_path: Path) -> None:
    """HF_ENDPOINT is read at import, so it is tried in a new interpreter, with no endpoint= anywhere."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("HF_", "HUGGINGFACE"))}
    env |= {"HF_ENDPOINT": hub_server.endpoint, "HF_HOME": str(tmp_path / "home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    script = ("import huggingface_hub as h; print(h.HfApi().model_info('owner/tiny').sha);"
              "print(h.hf_hub_download('owner/tiny', 'model.gguf'))")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    sha, path = done.stdout.split()
    assert sha == repo.revision_sha and Path(path).read_bytes() == GGUF
    assert Path(path).is_relative_to(tmp_path / "home" / "hub")
