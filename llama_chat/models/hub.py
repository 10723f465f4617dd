"""Models from the Hugging Face Hub, through its own client (`huggingface_hub`), into the
shared Hugging Face cache that transformers, llama.cpp and mlx-lm read too: one copy serves
every tool.

Only what the chat needs is fetched (hub_files.py chooses). Before the first byte the
listing is checked and the free disk space too; each file arrives with the client's
progress bar and resumes from where a kill or a dropped connection left it; each file
fetched is checked against the size and sha256 the hub states. Offline (`HF_HUB_OFFLINE`)
or with the hub out of reach, the cache alone is used, and one line says so.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llama_chat import environment
from llama_chat.untrusted_files import parse_json
from llama_chat.errors import LlamaChatError, first_line
from llama_chat.models import hub_download
from llama_chat.models.hub_files import Choice, RepoFile, checked_listing, choose
from llama_chat.models.names import HubName
from llama_chat.models.sizes import human_size
from llama_chat.models.source import ModelSource

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_BRANCH = "main"
LISTING_SECONDS = 30  # a hub that does not answer the listing in this time is out of reach
LISTING_BYTES = 64 << 20  # a listing of 20,000 files with their metadata is a few MB
SPARE_BYTES = 256 << 20  # left free on the disk beyond the files themselves
_TRUE = ("1", "on", "yes", "true")


@dataclass(frozen=True)
class HubSettings:
    """Where the hub and its cache are, as the `HF_*` variables say (the client's own names)."""

    endpoint: str
    cache_dir: Path
    token: str | None
    offline: bool

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> HubSettings:
        caches = environment.user_base("XDG_CACHE_HOME", environ) or Path.home() / ".cache"
        home = environ.get("HF_HOME") or str(Path(caches) / "huggingface")
        cache = environ.get("HF_HUB_CACHE") or str(Path(home) / "hub")
        offline = any(environ.get(name, "").lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        return cls((environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
                   Path(os.path.expandvars(cache)).expanduser(), environ.get("HF_TOKEN") or None, offline)

    def repo_folder(self, repo_id: str) -> Path:
        """The repository's folder in the cache, as the client lays it out."""
        return self.cache_dir / ("models--" + repo_id.replace("/", "--"))

    def snapshot(self, repo_id: str, commit: str) -> Path:
        """The folder of the repository's files at `commit` in the cache."""
        return self.repo_folder(repo_id) / "snapshots" / commit


def fetch(name: HubName, settings: HubSettings, notify: Callable[[str], None]) -> ModelSource:
    """The files `name` asks for, downloaded unless the cache has them; the source to load.
    `notify` gets the lines a person should see (what was chosen, offline use)."""
    if settings.offline:
        return _from_cache(name, settings, "HF_HUB_OFFLINE is set", notify)
    try:
        listing, commit = _listing(name, settings)
    except _Unreachable as error:
        return _from_cache(name, settings, f"the hub at {settings.endpoint} cannot be reached ({error})", notify)
    choice = choose(checked_listing(listing, name.repo_id), name)
    if choice.note:
        notify(choice.note)
    _check_free_space(choice, name, settings, commit)
    for file in choice.files:
        _download(name, file, settings, commit)
    return _source(name, settings.snapshot(name.repo_id, commit) / choice.entry, choice)


def _source(name: HubName, entry: Path, choice: Choice) -> ModelSource:
    path = entry.parent if choice.entry == "config.json" else entry
    return ModelSource(path=path, name=str(name), origin="hub")


class _Unreachable(Exception):
    """The hub did not answer (no network, a timeout, a server error): the cache may serve."""


def _network_errors() -> tuple[type[BaseException], ...]:
    import httpx2

    from huggingface_hub.errors import OfflineModeIsEnabled

    return httpx2.TransportError, OfflineModeIsEnabled, ConnectionError, TimeoutError


def _listing(name: HubName, settings: HubSettings) -> tuple[list[RepoFile], str]:
    """The repository's files with their sizes and sha256, and the commit they are at: the
    repository's info as `HfApi.model_info(files_metadata=True)` asks for it, on the client's
    session, headers and errors, but read to a bound (the client would read any length)."""
    from urllib.parse import quote

    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    path = f"/api/models/{name.repo_id}" + (f"/revision/{quote(name.revision, safe='')}" if name.revision else "")
    headers = build_hf_headers(token=settings.token, library_name="llama-chat")
    body = bytearray()
    try:
        with get_session().stream("GET", settings.endpoint + path, params={"blobs": "true"}, headers=headers,
                                  timeout=LISTING_SECONDS) as response:
            hf_raise_for_status(response)
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > LISTING_BYTES:
                    raise LlamaChatError(f"{name.repo_id}: the hub's listing is larger than {LISTING_BYTES >> 20} MB, "
                                         "more than a model repository's; refused (is HF_ENDPOINT a hub you trust?)")
    except LlamaChatError:
        raise
    except Exception as error:  # noqa: BLE001 (the client's errors, each turned into one line)
        raise _hub_error(error, name, settings) from None
    try:
        info = parse_json(bytes(body))
        commit = info["sha"]
        siblings = info.get("siblings") or []
        if not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit) and isinstance(siblings, list)):
            raise ValueError("no commit or file list")
        return [_repo_file(sibling) for sibling in siblings], commit
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise LlamaChatError(f"{name.repo_id}: the hub's listing is not one a hub writes ({first_line(error)[:300]}); "
                             "refused") from None


def _repo_file(sibling: dict) -> RepoFile:
    """A listing's entry: its path, size and (for a large file) sha256, of the types a hub writes."""
    lfs = sibling.get("lfs")
    size = lfs["size"] if isinstance(lfs, dict) else sibling.get("size", -1)
    sha256 = lfs.get("sha256") if isinstance(lfs, dict) else None
    if not isinstance(sibling["rfilename"], str) or type(size) is not int or not isinstance(sha256, str | None):
        raise ValueError(f"an entry of the wrong types: {str(sibling)[:80]}")
    return RepoFile(sibling["rfilename"], size, sha256)


def _hub_error(error: Exception, name: HubName, settings: HubSettings) -> Exception:
    """A client error as what to do, in one line; _Unreachable where the cache may serve instead."""
    from huggingface_hub import errors, get_token

    page = f"{settings.endpoint}/{name.repo_id}"
    if isinstance(error, _network_errors()):
        return _Unreachable(first_line(error)[:300])
    if isinstance(error, errors.GatedRepoError):
        if settings.token is None and get_token() is None:
            return LlamaChatError(f"{name.repo_id} is gated: accept its licence at {page}, then set HF_TOKEN to an "
                                  "access token of that account")
        return LlamaChatError(f"{name.repo_id} is gated and the access token given (HF_TOKEN, or the one `hf auth "
                              f"login` kept) has no access: accept its licence at {page} with that token's account")
    if isinstance(error, errors.RevisionNotFoundError):
        return LlamaChatError(f"{name.repo_id} has no revision {name.revision!r} on the hub")
    if isinstance(error, errors.RepositoryNotFoundError):
        private = "" if settings.token else "; if it is private, set HF_TOKEN to an access token that can read it"
        return LlamaChatError(f"{name.repo_id}: no such file here and no such model repository on the hub{private}")
    if isinstance(error, errors.HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status is not None and status >= 500 or status == 429:
            return _Unreachable(f"it answered {status}")
        return LlamaChatError(f"{name.repo_id}: the hub refused the request ({first_line(error)[:300]})")
    if isinstance(error, LlamaChatError):
        return error
    return LlamaChatError(f"{name.repo_id}: {type(error).__name__}: {first_line(error)[:300]}")


def _cached_path(name: HubName, file: RepoFile, settings: HubSettings, commit: str) -> Path | None:
    """The file in the cache at `commit`, when it is there whole (its size as listed)."""
    path = settings.snapshot(name.repo_id, commit) / file.path
    try:
        return path if path.stat().st_size == file.size else None
    except OSError:
        return None


def _check_free_space(choice: Choice, name: HubName, settings: HubSettings, commit: str) -> None:
    """Refuse before the first byte when the files cannot fit on the cache's disk."""
    blobs = settings.repo_folder(name.repo_id) / "blobs"
    needed = 0
    for file in choice.files:
        if _cached_path(name, file, settings, commit) is None:
            partial = hub_download.partial_of(blobs / file.sha256) if file.sha256 else None
            have = partial.stat().st_size if partial is not None and partial.is_file() else 0
            needed += max(file.size - have, 0)
    if not needed:
        return
    folder = settings.cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < needed + SPARE_BYTES:
        raise LlamaChatError(f"{name}: needs {human_size(needed)} more, but only {human_size(free)} is free in "
                             f"{folder}; free some space or set HF_HUB_CACHE to a folder on a larger disk")


def _download(name: HubName, file: RepoFile, settings: HubSettings, commit: str) -> Path:
    """One file into the cache (nothing fetched when it is there whole), checked against the
    listing, then read back through the client, as every other tool will find it."""
    if _cached_path(name, file, settings, commit) is not None:
        _trusted(name, file, settings, commit)
    else:
        branch = None if name.revision and re.fullmatch(r"[0-9a-f]{40}", name.revision) else (
            name.revision or DEFAULT_BRANCH)
        try:
            hub_download.download(name.repo_id, file.path, commit, size=file.size, sha256=file.sha256,
                                  folder=settings.repo_folder(name.repo_id), endpoint=settings.endpoint,
                                  token=settings.token, branch=branch)
        except KeyboardInterrupt:
            print(f"\nllama-chat: the download of {file.path} stopped; the same command resumes it", file=sys.stderr)
            raise
        except hub_download.BrokenOff as error:
            raise LlamaChatError(f"{name}: the download of {file.path} broke off ({error}); the same command "
                                 "resumes it") from None
        except LlamaChatError:
            raise
        except Exception as error:  # noqa: BLE001 (the client's errors, each turned into one line)
            turned = _hub_error(error, name, settings)
            if isinstance(turned, _Unreachable):
                raise LlamaChatError(f"{name}: the download of {file.path} broke off ({turned}); the same command "
                                     "resumes it") from None
            raise turned from None
    from huggingface_hub import hf_hub_download  # the client loads only where a hub is used

    return Path(hf_hub_download(name.repo_id, file.path, revision=commit, cache_dir=settings.cache_dir,
                                          local_files_only=True))


def _trusted(name: HubName, file: RepoFile, settings: HubSettings, commit: str) -> None:
    """A file found in the cache, held to the listing: its blob named by the sha256 the hub
    states (the cache names large files so), else hashed."""
    path = settings.snapshot(name.repo_id, commit) / file.path
    if file.sha256 is None or path.resolve().name == file.sha256:
        return
    if hub_download.sha256_of(path) != file.sha256:
        _discard(path)
        raise LlamaChatError(f"{name}: the cached {file.path} does not have the sha256 the hub states; it was "
                             "removed, and the same command fetches it again")


def _discard(path: Path) -> None:
    """A snapshot's file and the blob it points to."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


def _from_cache(name: HubName, settings: HubSettings, why: str, notify: Callable[[str], None]) -> ModelSource:
    """What the cache holds of `name` (the revision named, else the default branch's), or one
    line saying it holds nothing to run."""
    folder = settings.repo_folder(name.repo_id)
    revision = name.revision or DEFAULT_BRANCH
    commit = revision if re.fullmatch(r"[0-9a-f]{40}", revision) else branch_commit(folder, revision)
    snapshot = settings.snapshot(name.repo_id, commit) if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise LlamaChatError(f"{why}, and {name.repo_id} is not in the Hugging Face cache ({settings.cache_dir}); "
                             f"with the hub in reach, `llama-chat pull {name}` fetches it")
    try:
        choice = choose(checked_listing(snapshot_files(snapshot), name.repo_id), name)
    except LlamaChatError as error:
        raise LlamaChatError(f"{why}, and the cached copy does not serve: {error}; with the hub in reach, "
                             f"`llama-chat pull {name}` fetches it") from None
    for file in choice.files:
        if not (snapshot / file.path).is_file():
            raise LlamaChatError(f"{why}, and the cache holds {name.repo_id} without {file.path}; with the hub in "
                                 f"reach, `llama-chat pull {name}` completes it")
    notify(f"{why}: using the cached {name.repo_id} at {commit[:7]}")
    if choice.note:
        notify(choice.note)
    return _source(name, snapshot / choice.entry, choice)


def branch_commit(folder: Path, revision: str) -> str | None:
    """The commit a cached repository's branch or tag pointed to when it was last fetched."""
    try:
        text = (folder / "refs" / revision).read_text(encoding="ascii", errors="replace")[:100].strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[0-9a-f]{40}", text) else None


def snapshot_files(snapshot: Path, most: int = 20_000) -> list[RepoFile]:
    """A cached snapshot's files as a listing (sizes from the disk, sha256 from the blobs'
    names), walked without following links out of it."""
    files: list[RepoFile] = []
    for root, folders, names in os.walk(snapshot):
        folders[:] = [folder for folder in folders if not (Path(root) / folder).is_symlink()]
        for file_name in names:
            path = Path(root) / file_name
            try:
                size = path.stat().st_size
            except OSError:
                continue  # a link to a blob that is gone
            blob = path.resolve().name
            files.append(RepoFile(path.relative_to(snapshot).as_posix(), size,
                                  blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None))
            if len(files) > most:
                return files  # checked_listing refuses it
    return files
