"""The weight files of a Hugging Face directory: one safetensors or .bin file, or shards with an index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from llama_chat.checkpoints.contents import Weight
from llama_chat.checkpoints.safetensors_file import DTYPES as SAFETENSORS_FLOAT_TYPES
from llama_chat.checkpoints.safetensors_file import SafetensorsFile
from llama_chat.checkpoints.stored import TensorMatrix
from llama_chat.checkpoints.tensor_names import checked_float
from llama_chat.checkpoints.torch_file import load_torch_file
from llama_chat.errors import LlamaChatError
from llama_chat.untrusted_files import read_json_object, shown


class WeightFiles(Mapping):
    """The tensors of a directory's weight files by name: vectors read when asked for,
    matrices as TensorMatrix whose rows are read (by plain reads from a safetensors file,
    from the memory map of a .bin one) only when the loader packs or converts them. Every
    shape is checked against config.json.
    """

    def __init__(
        self, directory: Path, locations: Mapping[str, Path], expected_shapes: Mapping[str, tuple[int, ...]],
        opened: Mapping[Path, object] | None = None,
    ) -> None:
        self._directory = directory
        self._locations = dict(locations)
        self._expected = expected_shapes
        self._opened: dict[Path, object] = dict(opened or {})  # files already open, by path

    def __getitem__(self, name: str) -> Weight:
        if name not in self._locations:
            raise LlamaChatError(f"{self._directory}: the weight files have no tensor {name!r}")
        path = self._locations[name]
        source = self._open(path)
        if isinstance(source, dict):  # a PyTorch file, already memory-mapped
            tensor = checked_float(source[name], name, path)
            self._check_shape(name, tuple(tensor.shape), path)
            return TensorMatrix.of(tensor) if tensor.ndim == 2 else tensor
        if name not in source:
            raise LlamaChatError(f"{path}: has no tensor {name!r}, though the weight index says it does")
        shape, dtype = source.shape(name), source.dtype_name(name)
        self._check_shape(name, shape, path)
        if dtype not in SAFETENSORS_FLOAT_TYPES:
            raise LlamaChatError(
                f"{path}: tensor {name!r} is {dtype}; llama-chat loads float32, float16 or bfloat16 weights"
            )
        if len(shape) == 2:
            return TensorMatrix(shape, lambda start, stop: source.rows(name, start, stop), source.nbytes(name))
        return source.rows(name)

    def __contains__(self, name: object) -> bool:
        return name in self._locations  # without reading the tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._locations)

    def __len__(self) -> int:
        return len(self._locations)

    def _check_shape(self, name: str, shape: tuple[int, ...], path: Path) -> None:
        expected = self._expected.get(name)
        if expected is not None and shape != expected:
            raise LlamaChatError(f"{path}: tensor {name!r} has shape {shape} but config.json implies {expected}")

    def _open(self, path: Path):
        if path not in self._opened:
            if not path.is_file():
                raise LlamaChatError(f"{path}: no such file, though the weight index names it")
            self._opened[path] = load_torch_file(path) if path.suffix == ".bin" else SafetensorsFile(path)
        return self._opened[path]


def weight_files(directory: Path, expected: Mapping[str, tuple[int, ...]]) -> WeightFiles:
    """Where each tensor of the directory lives: sharded (an index file) or in one file."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index_path = directory / index_name
        index = read_json_object(index_path)
        if index is None:
            continue
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise LlamaChatError(f"{index_path}: has no weight_map")
        for file in weight_map.values():
            # A shard is a file beside the index: a path elsewhere is no weight of this model.
            if not isinstance(file, str) or Path(file).name != file or file == "..":
                raise LlamaChatError(f"{index_path}: its weight_map names {shown(file)}, not a file in {directory}")
        locations = {name: directory / file for name, file in weight_map.items()}
        return WeightFiles(directory, locations, expected)
    safetensors_path = directory / "model.safetensors"
    if safetensors_path.is_file():
        opened = SafetensorsFile(safetensors_path)
        return WeightFiles(directory, dict.fromkeys(opened.keys(), safetensors_path),
                           expected, {safetensors_path: opened})
    bin_path = directory / "pytorch_model.bin"
    if bin_path.is_file():
        opened = load_torch_file(bin_path)  # memory-mapped where the file allows it
        return WeightFiles(directory, dict.fromkeys(opened, bin_path), expected,
                           {bin_path: opened})
    raise LlamaChatError(
        f"{directory}: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)"
    )
