"""What a model's name resolves to: the local file or folder the checkpoint readers open,
and what the place it came from says of it besides the weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """A model found by name.

    `path` is what `checkpoints.detect.read_checkpoint` opens (a GGUF file, the first part
    of a split one, or a checkpoint folder). `origin` says where it was found ("path",
    "hub", "ollama", "lmstudio", "weights"). A store may carry settings of its own beside
    the weights (ollama's params and system layers): `sampling` in SamplingSettings' names,
    labelled `sampling_source` in /settings, `stop_strings` that end a reply, and a default
    `system` prompt. `notes` are lines the loader shows once (a layer left out, a template
    not used); `template_note` says where the chat template comes from, for /info.
    """

    path: Path
    name: str
    origin: str = "path"
    sampling: dict = field(default_factory=dict)
    sampling_source: str = ""
    stop_strings: tuple[str, ...] = ()
    system: str | None = None
    notes: tuple[str, ...] = ()
    template_note: str | None = None
