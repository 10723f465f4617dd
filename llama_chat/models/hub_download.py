"""One file of a Hub repository into the shared Hugging Face cache, resumable across runs.

The hub's client (`huggingface_hub`) asks for the file's metadata, makes the request and
turns refusals into its errors; it also reads the file back from the cache at the end. Its
own download starts over from the first byte after a kill or Ctrl-C (it keeps no partial
file), so the bytes are written here: into `blobs/ETAG.incomplete`, flushed as they come,
continued with a `Range` request by the next run (or by this one, after a dropped
connection), checked against the size and sha256 the hub states, then moved to
`blobs/ETAG` and linked from `snapshots/COMMIT/PATH`, exactly as the client lays a file
out, so that every tool reading the cache finds it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from llama_chat.errors import LlamaChatError

RETRIES = 3  # dropped connections picked up again within one run
TIMEOUT_SECONDS = 30  # a connection that sends nothing this long has dropped


class BrokenOff(Exception):
    """The transfer ended before the file did; what arrived is kept for the next try."""


def download(repo_id: str, path: str, commit: str, *, size: int, sha256: str | None, folder: Path,
             endpoint: str, token: str | None, branch: str | None) -> Path:
    """`path` at `commit` into the cache folder of `repo_id` (`folder`); its path in the
    snapshot. `branch`, when the name gave one (or the default branch), is pointed at `commit`."""
    import huggingface_hub
    from filelock import FileLock

    url = huggingface_hub.hf_hub_url(repo_id, path, revision=commit, endpoint=endpoint)
    metadata = huggingface_hub.get_hf_file_metadata(url, token=token, library_name="llama-chat", endpoint=endpoint)
    etag = metadata.etag or sha256
    if not etag or "/" in etag or etag.startswith("."):
        raise LlamaChatError(f"{repo_id}: the hub gave {path} no usable ETag; refused")
    if metadata.size is not None and metadata.size != size:
        raise LlamaChatError(f"{repo_id}: the hub lists {path} at {size} bytes but serves {metadata.size}; refused")
    blob = folder / "blobs" / etag
    locks = folder.parent / ".locks" / folder.name
    locks.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"{etag}.lock")):  # the lock the client takes for the same blob
        if not (blob.is_file() and blob.stat().st_size == size):
            _fetch(metadata.location, blob, size, sha256, path, token)
    link = folder / "snapshots" / commit / path
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.unlink(missing_ok=True)  # a link to a blob that is gone
        os.symlink(os.path.relpath(blob, link.parent), link)
    if branch is not None:
        ref = folder / "refs" / branch
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return link


def partial_of(blob: Path) -> Path:
    """Where the bytes of `blob` that arrived so far are kept until it is whole."""
    return blob.with_name(blob.name + ".incomplete")


def _fetch(url: str, blob: Path, size: int, sha256: str | None, path: str, token: str | None) -> None:
    """The blob's bytes, continued from its partial file, with a progress bar."""
    from huggingface_hub.utils import tqdm

    partial = partial_of(blob)
    with open(partial, "ab") as file:
        if file.tell() > size:
            file.truncate(0)
        with tqdm(desc=path, total=size, initial=file.tell(), unit="B", unit_scale=True, unit_divisor=1024,
                  file=sys.stderr) as bar:
            for attempt in range(RETRIES + 1):
                try:
                    _continue(url, file, size, token, bar)
                    break
                except BrokenOff:
                    if attempt == RETRIES:
                        raise
    if sha256 is not None:
        if sha256_of(partial) != sha256:
            partial.unlink()
            raise LlamaChatError(f"{path} does not have the sha256 the hub states; it was removed, and the same "
                                 "command fetches it again")
    os.replace(partial, blob)


def _continue(url: str, file, size: int, token: str | None, bar) -> None:
    """One request for what the partial file lacks, appended as it arrives."""
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    have = file.tell()
    if have == size:
        return
    headers = build_hf_headers(token=token, library_name="llama-chat")
    headers["Range"] = f"bytes={have}-"
    try:
        with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                  timeout=TIMEOUT_SECONDS) as response:
            hf_raise_for_status(response)
            if response.status_code == 200 and have:  # the server ignored the range: start over
                file.truncate(0)
                file.seek(0)
                bar.reset(total=size)
            elif response.status_code == 206 and not response.headers.get("Content-Range", "").startswith(
                    f"bytes {have}-"):
                raise LlamaChatError(f"{url}: the server answered another range than the one asked for; refused")
            for chunk in response.iter_bytes():  # as it arrives: a drop loses nothing written
                if file.tell() + len(chunk) > size:
                    raise LlamaChatError(f"{url}: the server sent more than the {size} bytes the hub states; refused")
                file.write(chunk)
                file.flush()
                bar.update(len(chunk))
    except (httpx2.TransportError, ConnectionError, TimeoutError) as error:
        file.flush()
        raise BrokenOff(f"{file.tell()} of {size} bytes arrived: {error}") from None
    if file.tell() < size:
        raise BrokenOff(f"{file.tell()} of {size} bytes arrived")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
