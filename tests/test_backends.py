"""The weight back-ends behind one interface (kernels/backend.py): each driven through the
interface only gives the float32 model's logits, and the loader drives whatever back-end
choose_backend hands it through that interface alone."""

import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat import Llama
from llama_chat import loading
from llama_chat.checkpoints.detect import read_checkpoint
from llama_chat.kernels.backend import Source, WeightBackend
from llama_chat.kernels.block_backend import BlockKernels
from llama_chat.kernels.dense_backend import DenseWeights
from llama_chat.kernels.pytorch_backend import PyTorchKernels
from llama_chat.kernels.weights_record import WeightsRecord

from .test_gguf import tiny_hf_model, write_gguf

IDS = list(range(3, 23))


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    """Q8_0 weights, which every back-end holds exactly (the differences are arithmetic)."""
    return write_gguf(tmp_path_factory.mktemp("q8") / "q8.gguf", tiny_hf_model(seed=7), qtype=QType.Q8_0)


def run_through_the_interface(backend: WeightBackend, path) -> Llama:
    checkpoint = read_checkpoint(path)
    modes = backend.plan(checkpoint, "auto")
    transformer, note = backend.build(checkpoint, modes, Source(path), loading.NoProgress("", 0))
    return Llama(transformer, checkpoint.tokenizer, weights=backend.record(modes, note),
                 cache_dtype=backend.kv_cache_dtype())


def prompt_and_single_tokens(model: Llama) -> torch.Tensor:
    cache = model.new_cache(64)
    first = model.runner(cache, IDS[:12])
    return torch.stack([first, *(model.runner(cache, [token]) for token in IDS[12:])])


# (back-end, what the layers' matrices are packed as, the KV cache's dtype, the largest
# difference from the float32 logits as a share of the largest of them)
BACKENDS = [
    pytest.param(DenseWeights(torch.device("cpu"), torch.float32), (), torch.float32, 1e-5, id="dense"),
    pytest.param(PyTorchKernels(torch.float32, torch.float32, 1, "forced"), ("int8",), torch.float32, 0.05,
                 id="pytorch"),
    pytest.param(BlockKernels("portable", 16, "forced"), ("Q8_0",), torch.float16, 0.01, id="ours",
                 marks=pytest.mark.needs_kernels),
]


@pytest.mark.parametrize("backend, block_types, cache_dtype, tolerance", BACKENDS)
def test_each_backend_through_the_interface_gives_the_float32_logits(q8_file, backend, block_types, cache_dtype,
                                                                     tolerance):
    exact = llama_chat.load(q8_file, device="cpu", dtype="float32", quantize="none")
    expected = exact.logits(IDS)[11:]
    model = run_through_the_interface(backend, q8_file)
    assert model.weights.packed == bool(block_types) and model.weights.block_types == block_types
    assert model.cache_dtype == cache_dtype
    got = prompt_and_single_tokens(model)
    assert torch.allclose(got, expected, atol=tolerance * float(expected.abs().max()))


class Recorded(WeightBackend):
    """A back-end the loader has never heard of: dense float32 weights, a bfloat16 cache,
    and a record of its own; it notes what the loader handed it."""

    def __init__(self) -> None:
        self.calls = []

    @staticmethod
    def plan(checkpoint, quantize):
        return {"made up": "F99"}

    def build(self, checkpoint, modes, source, progress):
        self.calls.append((modes, source))
        return DenseWeights(torch.device("cpu"), torch.float32).build(checkpoint, modes, source, progress)[0], "noted"

    def record(self, modes, note):
        return WeightsRecord(packed=True, block_types=tuple(modes.values()), arithmetic="made up", note=note)

    def kv_cache_dtype(self):
        return torch.bfloat16


def test_the_loader_drives_any_backend_through_the_interface(q8_file, monkeypatch):
    backend = Recorded()

    def choose(checkpoint, quantize, device, dtype, kernels):
        return backend, backend.plan(checkpoint, quantize)

    monkeypatch.setattr(loading, "choose_backend", choose)
    model = llama_chat.load(q8_file, device="cpu")
    [(modes, source)] = backend.calls
    assert modes == {"made up": "F99"} and source.path == q8_file and source.shard is None
    assert model.weights == WeightsRecord(packed=True, block_types=("F99",), arithmetic="made up", note="noted")
    assert model.cache_dtype == torch.bfloat16  # asked of the back-end
    assert model.describe_weights() == "F99 weights, noted"
    # --kv-dtype still wins over what the back-end asks for
    assert llama_chat.load(q8_file, device="cpu", kv_dtype="float32").cache_dtype == torch.float32
    exact = llama_chat.load(q8_file, device="cpu", dtype="float32", quantize="none")
    assert torch.equal(model.logits(IDS), exact.logits(IDS))
