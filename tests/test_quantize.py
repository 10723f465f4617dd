import sys

import pytest
import torch

from llama_chat import Llama
from llama_chat.errors import LlamaChatError
from llama_chat.quantize import (
    INT4_GROUP, QuantizedLinear, check_quantization, choose_quantization, quantize_transformer, return_freed_memory,
)

from .conftest import tiny_args


def four_bit_weight(rows: int, columns: int, seed: int = 0) -> torch.Tensor:
    """Weights that are exactly 4-bit in groups of 32, as GGUF's Q4_1 stores them
    (every group reaches both its minimum and its maximum level)."""
    generator = torch.Generator().manual_seed(seed)
    levels = torch.randint(0, 16, (rows, columns // INT4_GROUP, INT4_GROUP), generator=generator)
    levels[..., 0], levels[..., 1] = 0, 15
    scale = torch.rand(rows, columns // INT4_GROUP, 1, generator=generator) * 0.1 + 0.01
    low = torch.randn(rows, columns // INT4_GROUP, 1, generator=generator) * 0.1
    # Scales and minimums exactly representable in bfloat16, as the packed kernel keeps them.
    scale, low = scale.bfloat16().float(), low.bfloat16().float()
    return (levels * scale + low).view(rows, columns)


def decoded(layer: QuantizedLinear) -> torch.Tensor:
    """The weight the packed kernel multiplies by, read back one column at a time."""
    identity = torch.eye(layer.in_features, dtype=torch.bfloat16)
    return torch.stack([layer(row[None]).float()[0] for row in identity], dim=1)


def test_four_bit_weights_repack_without_loss():
    weight = four_bit_weight(64, 96)
    layer = QuantizedLinear(weight, "int4")
    levels_apart = (decoded(layer) - weight).abs() / weight.view(64, -1, 32).std()
    assert levels_apart.max() < 0.02  # only bfloat16 rounding of scale and zero, no level lost


@pytest.mark.parametrize("seed", range(5))
def test_int8_rows_stay_within_half_a_step_and_bfloat16_output_rounding(seed):
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(seed))
    layer = QuantizedLinear(weight, "int8")
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    kept = decoded(layer)
    error = (kept - weight).abs()
    # The row's scale is the next bfloat16 at or above the step, and the kernel rounds
    # its product to bfloat16: half an output ulp at most.
    assert (error <= 0.5 * step * (1 + 2**-7) + kept.abs() * 2**-8).all()
    assert error.mean() < 0.3 * step.mean()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_several_tokens_use_the_bfloat16_copy(mode):
    weight = torch.randn(32, 64)
    layer = QuantizedLinear(weight, mode)
    x = torch.randn(1, 5, 64).bfloat16()
    assert torch.equal(layer(x), torch.nn.functional.linear(x, weight.bfloat16()))


def test_quantized_model_stays_close_to_float32():
    args = tiny_args(dim=64, n_heads=4, n_kv_heads=2, hidden_dim=96)
    exact = Llama.random(args, seed=3)
    packed = Llama.random(args, seed=3, dtype="bfloat16")
    quantize_transformer(packed.transformer, "int8")
    ids = list(range(40, 70))
    cache = packed.new_cache(64)
    packed.feed(cache, ids[:-1])
    last = packed.feed(cache, ids[-1:])  # a decode step: the packed path
    reference = exact.logits(ids)[-1]
    assert (last - reference).abs().max() < 0.05 * reference.abs().max()


def test_auto_choice_and_refusals():
    cpu = torch.device("cpu")
    assert choose_quantization("auto", cpu, "Q4_1") == "int4"
    assert choose_quantization("auto", cpu, "Q4_1", in_features=64) == "int4"
    assert choose_quantization("auto", cpu, "Q4_1", in_features=48) == "int8"  # not whole int4 groups
    assert choose_quantization("auto", cpu, "Q8_0") == "int8"
    assert choose_quantization("auto", cpu, None) == "int8"
    assert choose_quantization("auto", torch.device("cuda"), "Q4_1") == "none"
    assert choose_quantization("int4", cpu, None) == "int4"
    with pytest.raises(LlamaChatError, match="cpu only"):
        check_quantization("int8", torch.device("cuda"), 64)
    with pytest.raises(LlamaChatError, match="divisible by 32"):
        check_quantization("int4", cpu, 48)


def resident_megabytes() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and trims glibc's heap")
def test_freed_packing_temporaries_go_back_to_the_system():
    # After one large block is freed, glibc serves blocks of that size from its heap and
    # keeps them when they are freed; the last one holds the heap's top in place.
    large = torch.ones(16 * 2**20, dtype=torch.uint8)
    del large
    blocks = [torch.ones(8 * 2**20, dtype=torch.uint8) for _ in range(12)]
    del blocks[:-1]
    before = resident_megabytes()
    return_freed_memory()
    assert resident_megabytes() < before - 50
