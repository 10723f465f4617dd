"""An ollama store laid out as ollama lays it out: blobs/sha256-HEX named by their real
sha256, and manifests/HOST/NAMESPACE/MODEL/TAG, JSON naming each layer's media type, digest
and size (as ollama's manifest package writes them)."""

import hashlib
import json
from pathlib import Path

MEDIA = "application/vnd.ollama.image."
CONFIG = "application/vnd.docker.container.image.v1+json"
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
TEMPLATE = "{{ if .System }}<|system|>{{ .System }}{{ end }}<|user|>{{ .Prompt }}<|assistant|>"


def digest(data: bytes) -> str:
    """The digest ollama names a blob of `data` by: sha256:HEX."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def add_blob(store: Path, data: bytes) -> str:
    """Write `data` as a blob; its digest."""
    path = blob_path(store, digest(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest(data)


def blob_path(store: Path, digest: str) -> Path:
    return store / "blobs" / digest.replace(":", "-")


def layer(store: Path, kind: str, data: bytes) -> dict:
    """A layer of media type application/vnd.ollama.image.KIND holding `data`."""
    return {"mediaType": MEDIA + kind, "digest": add_blob(store, data), "size": len(data)}


def write_manifest(store: Path, parts: tuple[str, str, str, str], layers: list[dict]) -> Path:
    config = add_blob(store, json.dumps({"model_format": "gguf", "model_family": "llama"}).encode())
    manifest = {
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config, "size": 0}, "layers": layers,
    }
    path = store.joinpath("manifests", *parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def add_model(
    store: Path,
    gguf: bytes,
    model: str = "llama3.2",
    tag: str = "latest",
    *,
    namespace: str = "library",
    host: str = "registry.ollama.ai",
    params: dict | None = None,
    system: str | None = None,
    template: str | None = TEMPLATE,
    projector: bytes | None = None,
    adapter: bytes | None = None,
    messages: list | None = None,
) -> Path:
    """A model as `ollama pull` or `ollama create` leaves it (the layers in ollama's order);
    its manifest's path."""
    layers = [layer(store, "model", gguf)]
    if projector is not None:
        layers.append(layer(store, "projector", projector))
    if adapter is not None:
        layers.append(layer(store, "adapter", adapter))
    if template is not None:
        layers.append(layer(store, "template", template.encode()))
    if system is not None:
        layers.append(layer(store, "system", system.encode()))
    if params is not None:
        layers.append(layer(store, "params", json.dumps(params).encode()))
    if messages is not None:
        layers.append(layer(store, "messages", json.dumps(messages).encode()))
    layers.append(layer(store, "license", b"a license text"))
    return write_manifest(store, (host, namespace, model, tag), layers)
