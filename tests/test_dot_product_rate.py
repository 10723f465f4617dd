"""The dot-product peak the exact prompt kernels are measured against (csrc/peak.cpp and
machine_limits.exact_prompt_peak_gops)."""

from pathlib import Path

import pytest
import torch

from llama_chat.kernels import native
from llama_chat.kernels.machine_limits import PROMPT_INSTRUCTIONS, exact_prompt_peak_gops

# Each instruction the library times, and the CPU flags (as Linux names them) it needs.
NEEDS = {"vpdpbusd": {"avx512bw", "avx512_vnni"}, "vdpbf16ps": {"avx512bw", "avx512_bf16"},
         "vpdpbusd+vdpbf16ps": {"avx512bw", "avx512_vnni", "avx512_bf16"}, "vpmaddubsw": {"avx2"}}
FEATURES = {"vpdpbusd": "AVX-512 VNNI", "vdpbf16ps": "AVX-512 BF16", "vpdpbusd+vdpbf16ps": "AVX-512 VNNI and BF16",
            "vpmaddubsw": "AVX2"}


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.needs_kernels
@pytest.mark.parametrize("instruction", list(NEEDS))
def test_each_instruction_is_timed_where_the_cpu_has_it_and_refused_by_name_where_not(instruction):
    """A rate no CPU of today leaves (one instruction a cycle at most a core... here 0.05 to
    8 billion a second a thread), or one line naming the features it lacks."""
    if NEEDS[instruction] <= cpu_flags():
        rate = torch.ops.llama_chat.dot_product_rate(instruction, 200_000) / torch.get_num_threads()
        assert 5e7 < rate < 8e9
    else:
        with pytest.raises(RuntimeError, match=f"this CPU has no {FEATURES[instruction]} for {instruction}"):
            torch.ops.llama_chat.dot_product_rate(instruction, 200_000)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("name, rounds, message", [
    ("vpdpbusd ", 10, "no dot-product instruction named vpdpbusd "),
    ("tdpbf16ps", 10, "no dot-product instruction named tdpbf16ps"),
    ("vpdpbusd", 0, "rounds must be positive, not 0"),
])
def test_what_cannot_be_timed_is_one_line(name, rounds, message):
    with pytest.raises(RuntimeError, match=f"^llama_chat: {message}"):
        torch.ops.llama_chat.dot_product_rate(name, rounds)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("variant", ["portable", "avx512-amx", "avx2", "avx512-vnni"])
def test_the_exact_peak_is_the_variants_instruction_with_two_byte_products_a_weight(variant):
    """Variants whose prompts do not run on an integer dot product have no such peak; the
    others' is the instruction's rate times its byte products, halved (two a weight), times
    2 (multiply-adds counted as two operations), measured again within a factor of 4."""
    if variant not in PROMPT_INSTRUCTIONS:
        assert exact_prompt_peak_gops(variant) is None
        return
    instruction, products = PROMPT_INSTRUCTIONS[variant]
    if variant not in native.runnable_variants():
        with pytest.raises(RuntimeError, match="this CPU has no"):
            exact_prompt_peak_gops(variant)
        return
    again = max(torch.ops.llama_chat.dot_product_rate(instruction, 1_000_000) for _ in range(3)) * products / 1e9
    assert again / 4 < exact_prompt_peak_gops(variant) < again * 4
