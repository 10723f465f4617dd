"""A loopback stand-in for the Hugging Face Hub: the real `huggingface_hub` client downloads from it in tests.

It speaks the part of the Hub's HTTP API that `HfApi.model_info`, `HfApi.list_repo_tree`, `HfApi.list_repo_files`,
`hf_hub_download` and `snapshot_download` use (model repos only), counts what it serves, and can break a transfer
on purpose. It never sends Xet headers, so the client always takes its plain HTTP path.
"""

import base64
import hashlib
import json
import re
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")
LAST_COMMIT_DATE = "2024-01-01T00:00:00.000Z"
RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as `oid` and serves as the ETag of a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(filename: str) -> bool:
    """Whether the Hub would keep the file in LFS: weights are, everything else is a plain git blob here."""
    return filename.endswith(LFS_SUFFIXES)


@dataclass
class HubRepo:
    """A model repo as the server holds it; `revision_sha` is derived from the id and the files.

    `gated` repos answer /resolve only to a bearer token in `tokens_with_access` (their listings stay public, as on
    the Hub). `listing_override` replaces the entries of the tree listing (and the model_info siblings made from
    them) with raw dicts, whatever they hold, while /resolve still serves `files`.
    """

    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    tokens_with_access: set[str] = field(default_factory=set)
    listing_override: list[dict[str, Any]] | None = None
    revision_sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.repo_id.encode())
        for name in sorted(self.files):
            digest.update(b"\0" + name.encode() + b"\0" + git_blob_sha1(self.files[name]).encode())
        self.revision_sha = digest.hexdigest()

    def sha256(self, filename: str) -> str:
        return hashlib.sha256(self.files[filename]).hexdigest()

    def pointer(self, filename: str) -> bytes:
        """The LFS pointer file git holds in place of a large file."""
        size = len(self.files[filename])
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256(filename)}\nsize {size}\n".encode()

    def etag(self, filename: str) -> str:
        """The Hub's ETag: the sha256 for LFS files (the client names the cached blob after it), else the git oid."""
        return self.sha256(filename) if is_lfs(filename) else git_blob_sha1(self.files[filename])

    def tree_entries(self) -> list[dict[str, Any]]:
        """The recursive tree listing, folders included, in the Hub's JSON shape."""
        if self.listing_override is not None:
            return self.listing_override
        folders = {"/".join(parts[:depth]) for parts in (name.split("/") for name in self.files)
                   for depth in range(1, len(parts))}
        entries = [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f}
                   for f in folders]
        for name, data in self.files.items():
            entry: dict[str, Any] = {"type": "file", "path": name, "size": len(data)}
            if is_lfs(name):
                pointer = self.pointer(name)
                entry |= {"oid": git_blob_sha1(pointer),
                          "lfs": {"oid": self.sha256(name), "size": len(data), "pointerSize": len(pointer)}}
            else:
                entry["oid"] = git_blob_sha1(data)
            entries.append(entry)
        return sorted(entries, key=lambda entry: entry["path"])

    def siblings(self, with_blobs: bool) -> list[dict[str, Any]]:
        """model_info's `siblings`: names only, or with size, blob id and LFS data when asked for blobs."""
        result = []
        for entry in self.tree_entries():
            if entry.get("type", "file") != "file":
                continue
            sibling: dict[str, Any] = {"rfilename": entry.get("path")}
            if with_blobs:
                sibling |= {"size": entry.get("size"), "blobId": entry.get("oid")}
                lfs = entry.get("lfs")
                if isinstance(lfs, dict):
                    sibling["lfs"] = {"sha256": lfs.get("oid"), "size": lfs.get("size"),
                                      "pointerSize": lfs.get("pointerSize")}
            result.append(sibling)
        return result


class RecordedRequest(NamedTuple):
    """One request as the server saw it; `repo_id` and `filename` are set on /resolve requests."""

    method: str
    path: str
    query: str
    range: str | None
    authorization: str | None
    repo_id: str | None = None
    filename: str | None = None


class HubError(Exception):
    """An error answer with the Hub's `X-Error-Code` / `X-Error-Message` headers, which the client maps to
    RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError or GatedRepoError."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class HubServer:
    """The Hub on 127.0.0.1 at an ephemeral port, in a thread; `endpoint` is what HF_ENDPOINT or `endpoint=` take.

    Counters (all guarded by one lock): `requests` lists every request, `request_counts` counts (method, path), and
    `bytes_served` counts body bytes sent by GET /resolve per (repo_id, filename).
    """

    def __init__(self, repos: Iterable[HubRepo] = (), tree_page_size: int = 1000):
        self.repos: dict[str, HubRepo] = {}
        self.tree_page_size = tree_page_size
        self.requests: list[RecordedRequest] = []
        self.request_counts: Counter[tuple[str, str]] = Counter()
        self.bytes_served: Counter[tuple[str, str]] = Counter()
        self._drops: dict[str, tuple[int, bool]] = {}
        self._lock = threading.Lock()
        self._httpd = _Server(self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        for repo in repos:
            self.add(repo)

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo: HubRepo) -> HubRepo:
        """Serve one more repo (before or after start)."""
        with self._lock:
            self.repos[repo.repo_id] = repo
        return repo

    def drop_after(self, filename: str, nbytes: int, *, reset: bool = False) -> None:
        """Break the next GET of `filename` (in any repo), once: full headers, then only `nbytes` of the body, then
        the connection ends: closed (the client sees an incomplete body) or, with `reset`, reset (RST)."""
        with self._lock:
            self._drops[filename] = (nbytes, reset)

    def file_gets(self, filename: str) -> list[RecordedRequest]:
        """The GET /resolve requests of `filename`, in order: the ones that may carry its bytes."""
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and r.filename == filename]

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, end the open keep-alive connections, and join every thread of the server."""
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # The handler thread calls these.

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)
            self.request_counts[(request.method, request.path)] += 1

    def _find_repo(self, path: str, prefix: str) -> tuple[HubRepo, str] | None:
        """The repo whose id follows `prefix` in the (still quoted) path, longest id first, and the rest."""
        with self._lock:
            repos = sorted(self.repos.values(), key=lambda repo: len(repo.repo_id), reverse=True)
        for repo in repos:
            start = prefix + repo.repo_id
            if path == start or path.startswith(start + "/"):
                return repo, path[len(start):]
        return None

    def _take_drop(self, filename: str) -> tuple[int, bool] | None:
        with self._lock:
            return self._drops.pop(filename, None)

    def _count_bytes(self, repo: HubRepo, filename: str, nbytes: int) -> None:
        with self._lock:
            self.bytes_served[(repo.repo_id, filename)] += nbytes


def _check_revision(repo: HubRepo, revision: str) -> None:
    if revision not in ("main", repo.revision_sha):
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")


def _flag(query: dict[str, list[str]], name: str) -> bool:
    """A boolean query parameter as the client sends it (`true`/`false`)."""
    return query.get(name, ["false"])[-1].lower() == "true"


def _repo_not_found(path: str) -> HubError:
    return HubError(404, "RepoNotFound", f"Repository not found for {path}.")


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive range a `Range: bytes=...` header asks for; None to serve the whole file (no or unusable header,
    as servers that ignore it do). A range past the end raises 416."""
    match = RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        raise HubError(416, None, f"Range not satisfiable: {header}", {"Content-Range": f"bytes */{size}"})
    return start, end


class _Handler(BaseHTTPRequestHandler):
    """Routes /api/models/... and /{repo_id}/resolve/... to the hub; HTTP/1.1 with keep-alive, as the Hub."""

    protocol_version = "HTTP/1.1"
    timeout = 10  # an idle keep-alive connection ends after this many seconds
    server: "_Server"

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read the counters instead."""

    def do_GET(self) -> None:
        self._respond()

    def do_HEAD(self) -> None:
        self._respond()

    @property
    def hub(self) -> HubServer:
        return self.server.hub

    def _respond(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path.startswith("/api/models/"):
                self.hub._record(self._recorded(url.path, url.query))
                self._api(url.path, parse_qs(url.query))
            else:
                self._resolve(url.path, url.query)
        except HubError as error:
            self._send_error(error)

    def _recorded(self, path: str, query: str, repo_id: str | None = None,
                  filename: str | None = None) -> RecordedRequest:
        return RecordedRequest(self.command, path, query, self.headers.get("Range"),
                               self.headers.get("Authorization"), repo_id, filename)

    def _api(self, path: str, query: dict[str, list[str]]) -> None:
        found = self.hub._find_repo(path, "/api/models/")
        if found is None:
            raise _repo_not_found(path)
        repo, rest = found
        if rest in ("", "/") or rest.startswith("/revision/"):
            revision = unquote(rest.removeprefix("/revision/")) if rest.startswith("/revision/") else "main"
            _check_revision(repo, revision)
            self._send_json(self._model_info(repo, _flag(query, "blobs")))
        elif rest.startswith("/tree/"):
            self._tree(repo, rest.removeprefix("/tree/"), query)
        else:
            raise HubError(404, None, f"Not found: {path}")

    def _model_info(self, repo: HubRepo, with_blobs: bool) -> dict[str, Any]:
        author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        return {"_id": repo.revision_sha[:24], "id": repo.repo_id, "modelId": repo.repo_id, "author": author,
                "sha": repo.revision_sha, "lastModified": LAST_COMMIT_DATE, "createdAt": LAST_COMMIT_DATE,
                "private": False, "gated": "manual" if repo.gated else False, "disabled": False, "tags": [],
                "downloads": 0, "likes": 0, "siblings": repo.siblings(with_blobs)}

    def _tree(self, repo: HubRepo, rest: str, query: dict[str, list[str]]) -> None:
        """GET /api/models/{repo}/tree/{rev}[/{folder}]: one page of entries and, when more follow, a Link header
        with rel="next" and a cursor, as the Hub paginates (1000 entries a page, 50 when expanded)."""
        revision, _, folder = rest.partition("/")
        _check_revision(repo, unquote(revision))
        folder = unquote(folder).strip("/")
        recursive, expand = _flag(query, "recursive"), _flag(query, "expand")
        entries = repo.tree_entries()
        if repo.listing_override is None:
            if folder and not any(e["path"] == folder and e["type"] == "directory" for e in entries):
                raise HubError(404, "EntryNotFound", f"{folder} does not exist on \"{revision}\"")
            prefix = folder + "/" if folder else ""
            entries = [e for e in entries if e["path"].startswith(prefix)
                       and (recursive or "/" not in e["path"][len(prefix):])]
        page_size = min(self.hub.tree_page_size, 50) if expand else self.hub.tree_page_size
        try:
            start = int(base64.urlsafe_b64decode(query["cursor"][0]).decode()) if "cursor" in query else 0
        except ValueError:
            raise HubError(400, None, "Invalid cursor") from None
        page = entries[start:start + page_size]
        if expand:
            commit = {"id": repo.revision_sha, "title": "Upload", "date": LAST_COMMIT_DATE}
            page = [entry | {"lastCommit": commit} for entry in page]
        headers = {}
        if start + page_size < len(entries):
            cursor = base64.urlsafe_b64encode(str(start + page_size).encode()).decode()
            next_url = (f"{self.hub.endpoint}/api/models/{repo.repo_id}/tree/{revision}"
                        f"{'/' + quote(folder, safe='') if folder else ''}"
                        f"?recursive={str(recursive).lower()}&expand={str(expand).lower()}&cursor={cursor}")
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._send_json(page, headers)

    def _resolve(self, path: str, query: str) -> None:
        """HEAD and GET /{repo_id}/resolve/{revision}/{filename}: the file itself (no redirect, no Xet headers),
        with the ETag, X-Repo-Commit and, for LFS files, X-Linked-Etag / X-Linked-Size the client relies on."""
        found = self.hub._find_repo(path, "/")
        repo, rest = found if found is not None else (None, "")
        revision, _, filename = rest.removeprefix("/resolve/").partition("/")
        filename = unquote(filename)
        self.hub._record(self._recorded(path, query, repo and repo.repo_id, filename or None))
        if repo is None:
            raise _repo_not_found(path)
        if not rest.startswith("/resolve/") or not filename:
            raise HubError(404, None, f"Not found: {path}")
        _check_revision(repo, unquote(revision))
        commit = {"X-Repo-Commit": repo.revision_sha}
        if repo.gated:
            self._check_access(repo)
        if filename not in repo.files:
            raise HubError(404, "EntryNotFound", f"{filename} does not exist on \"{unquote(revision)}\"", commit)
        data = repo.files[filename]
        headers = commit | {"ETag": f'"{repo.etag(filename)}"', "Accept-Ranges": "bytes",
                            "Content-Type": "application/octet-stream"}
        if is_lfs(filename):
            headers |= {"X-Linked-Etag": f'"{repo.sha256(filename)}"', "X-Linked-Size": str(len(data))}
        byte_range = _byte_range(self.headers.get("Range"), len(data))
        start, end = byte_range if byte_range is not None else (0, len(data) - 1)
        if byte_range is not None:
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        body = data[start:end + 1]
        self.send_response(206 if byte_range is not None else 200)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "GET":
            return
        drop = self.hub._take_drop(filename)
        if drop is not None:
            body = body[:drop[0]]
        self.wfile.write(body)
        self.hub._count_bytes(repo, filename, len(body))
        if drop is not None:
            self._break_connection(reset=drop[1])

    def _check_access(self, repo: HubRepo) -> None:
        """As the Hub: 401 without a token, 403 with a token not on the list; both carry X-Error-Code: GatedRepo."""
        authorization = self.headers.get("Authorization") or ""
        token = authorization.removeprefix("Bearer ") if authorization.startswith("Bearer ") else None
        if token is None:
            raise HubError(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have access "
                                             "to it and be authenticated to access it. Please log in.")
        if token not in repo.tokens_with_access:
            raise HubError(403, "GatedRepo", f"Access to model {repo.repo_id} is restricted and you are not in "
                                             "the authorized list.")

    def _break_connection(self, reset: bool) -> None:
        """End the connection mid-body: a clean close (FIN) or, with `reset`, an RST (SO_LINGER 0, then close)."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # Detached, the handler's own socket object cannot touch the descriptor again once it is closed.
            socket.socket(fileno=self.connection.detach()).close()
        else:
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send_json(self, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self._send_body(body)

    def _send_error(self, error: HubError) -> None:
        body = json.dumps({"error": error.message}).encode()
        self.send_response(error.status)
        if error.code is not None:
            self.send_header("X-Error-Code", error.code)
        # Header values must be latin-1: a message naming a hostile path is escaped.
        self.send_header("X-Error-Message", error.message.encode("ascii", "backslashreplace").decode())
        for name, value in error.headers.items():
            self.send_header(name, value)
        self._send_body(body)

    def _send_body(self, body: bytes) -> None:
        """A JSON body after the headers set so far (not for HEAD, which gets the headers alone)."""
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    """Binds 127.0.0.1 only; joins its handler threads on close, after ending their connections."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, hub: HubServer):
        self.hub = hub
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._closing = False
        super().__init__(("127.0.0.1", 0), _Handler)

    def track(self, connection: socket.socket) -> None:
        with self._connections_lock:
            if self._closing:
                connection.shutdown(socket.SHUT_RDWR)
            self._connections.add(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)

    def close_connections(self) -> None:
        with self._connections_lock:
            self._closing = True
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by its client


@pytest.fixture
def hub_server() -> Iterator[HubServer]:
    """A started HubServer with no repos (tests add theirs), stopped after the test."""
    with HubServer() as server:
        yield server
