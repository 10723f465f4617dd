import pytest
import torch

from llama_chat import Llama
from llama_chat.engine.device import resolve_device, resolve_dtype
from llama_chat.errors import DeviceError

from .conftest import tiny_args


def test_unavailable_devices_are_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="no usable CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="MPS backend is not available"):
        resolve_device("mps")
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("gpu0")
    assert resolve_device("auto") == torch.device("cpu")


def test_dtype_names_and_auto():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    with pytest.raises(DeviceError, match="unknown dtype"):
        resolve_dtype("int3", cpu)


def test_bfloat16_model_stays_close_to_float32():
    ids = list(range(30, 60))
    full = Llama.random(tiny_args(), seed=2, dtype="float32").logits(ids)
    half = Llama.random(tiny_args(), seed=2, dtype="bfloat16")
    assert half.logits(ids).dtype == torch.float32
    assert half.new_cache().dtype == torch.bfloat16
    assert (half.logits(ids) - full).abs().max() < 0.1 * full.abs().max()
