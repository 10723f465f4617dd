"""Write a Llama-architecture (or Qwen2) GGUF with random quantised weights and a real vocabulary.

The file loads in llama.cpp (and anything else that reads Llama GGUFs), so load time,
memory and speed can be measured at real model sizes without downloading gigabytes.
Tensors are generated and written one at a time, so memory stays small even for 8b.
`--arch qwen2` writes the same shapes as a Qwen2 file (q, k and v biases, its keys);
the 1.5b preset is Qwen2.5-1.5B's shape (tied embeddings, a vocabulary padded to 151936).

    python benchmarks/make_synthetic_gguf.py --size 1b llama-1b-q4_0.gguf
    python benchmarks/make_synthetic_gguf.py --size 1.5b --arch qwen2 qwen2.5-1.5b-q4_0.gguf
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import (
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
)

BLOCK = 32  # weights per block in Q4_0 and Q8_0


@dataclass(frozen=True)
class Preset:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    context: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    vocab: int | None = None  # the copied vocabulary padded to this many tokens
    tied: bool = False  # no output head: the embedding table serves


PRESETS = {
    "tiny": Preset(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn=768, context=2048),
    "1b": Preset(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn=8192, context=8192),
    "8b": Preset(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn=14336, context=8192),
    "1.5b": Preset(dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, ffn=8960, context=32768, rope_theta=1e6,
                   norm_eps=1e-6, vocab=151936, tied=True),
}
ARCHITECTURES = ("llama", "qwen2")

QUANT_TYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0,
               "f16": GGMLQuantizationType.F16}
FILE_TYPES = {"q4_0": LlamaFileType.MOSTLY_Q4_0, "q8_0": LlamaFileType.MOSTLY_Q8_0, "f16": LlamaFileType.MOSTLY_F16}

# Root mean square of the raw integers, uniform over all byte values: sqrt((n^2 - 1) / 12 + 1/4).
Q4_RMS = math.sqrt((16**2 - 1) / 12 + 0.25)
Q8_RMS = math.sqrt((256**2 - 1) / 12 + 0.25)


def default_vocab_source() -> Path:
    return Path(__file__).resolve().parent.parent / "weights" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, int] | tuple[int]  # numpy order: (rows, in_features)
    kind: GGMLQuantizationType
    std: float


def plan_tensors(preset: Preset, vocab: int, matrix_type: GGMLQuantizationType, arch: str) -> list[TensorPlan]:
    d, head_dim = preset.dim, preset.dim // preset.n_heads
    kv = preset.n_kv_heads * head_dim
    f32 = GGMLQuantizationType.F32
    head_kind = matrix_type if matrix_type == GGMLQuantizationType.F16 else GGMLQuantizationType.Q8_0

    def matrix(name: str, rows: int, cols: int) -> TensorPlan:
        return TensorPlan(name, (rows, cols), matrix_type, 1 / math.sqrt(cols))

    # A tied table is also the output head, kept as the head is.
    plans = [TensorPlan("token_embd.weight", (vocab, d), head_kind if preset.tied else matrix_type, 1.0)]
    for i in range(preset.n_layers):
        p = f"blk.{i}."
        if arch == "qwen2":
            plans += [TensorPlan(p + f"attn_{part}.bias", (rows,), f32, 0.1)
                      for part, rows in (("q", d), ("k", kv), ("v", kv))]
        plans += [
            TensorPlan(p + "attn_norm.weight", (d,), f32, 0.0),
            matrix(p + "attn_q.weight", d, d),
            matrix(p + "attn_k.weight", kv, d),
            matrix(p + "attn_v.weight", kv, d),
            matrix(p + "attn_output.weight", d, d),
            TensorPlan(p + "ffn_norm.weight", (d,), f32, 0.0),
            matrix(p + "ffn_gate.weight", preset.ffn, d),
            matrix(p + "ffn_up.weight", preset.ffn, d),
            matrix(p + "ffn_down.weight", d, preset.ffn),
        ]
    plans.append(TensorPlan("output_norm.weight", (d,), f32, 0.0))
    if not preset.tied:
        # The output head stays in Q8_0 as llama.cpp's own Q4_0 conversions do (F16 in an F16
        # file, which llama.cpp's quantizer will not take from Q8_0).
        plans.append(TensorPlan("output.weight", (vocab, d), head_kind, 1 / math.sqrt(d)))
    return plans


def byte_shape(plan: TensorPlan) -> tuple[int, ...]:
    if plan.kind == GGMLQuantizationType.F32:
        return plan.shape
    if plan.kind == GGMLQuantizationType.F16:  # two bytes a weight
        return (plan.shape[0], plan.shape[1] * 2)
    rows, cols = plan.shape
    per_block = 18 if plan.kind == GGMLQuantizationType.Q4_0 else 34
    return (rows, cols // BLOCK * per_block)


def random_blocks(rng: np.random.Generator, plan: TensorPlan) -> np.ndarray:
    """Raw block bytes: uniform random integers, one f16 scale of random sign per block."""
    rows, cols = plan.shape
    n_blocks = cols // BLOCK
    rms = Q4_RMS if plan.kind == GGMLQuantizationType.Q4_0 else Q8_RMS
    block_bytes = 18 if plan.kind == GGMLQuantizationType.Q4_0 else 34
    data = rng.integers(0, 256, (rows, n_blocks, block_bytes), dtype=np.uint8)
    # A random sign per block cancels the -0.5 offset of the integers, so the mean is near 0.
    magnitude = np.float16(plan.std / rms)
    scales = np.where(rng.integers(0, 2, (rows, n_blocks), dtype=np.uint8) == 1, magnitude, -magnitude)
    data[:, :, :2] = scales.astype("<f2").view(np.uint8).reshape(rows, n_blocks, 2)
    return data.reshape(rows, n_blocks * block_bytes)


def generate(rng: np.random.Generator, plan: TensorPlan) -> np.ndarray:
    if plan.name.endswith(".bias"):
        return (plan.std * rng.standard_normal(plan.shape)).astype(np.float32)
    if plan.kind == GGMLQuantizationType.F32:  # a norm's gains
        return (1.0 + 0.02 * rng.standard_normal(plan.shape)).astype(np.float32)
    if plan.kind == GGMLQuantizationType.F16:  # normal weights, for llama.cpp's quantizer to make K-quant mixes of
        weights = rng.standard_normal(plan.shape, dtype=np.float32) * plan.std
        return weights.astype("<f2").view(np.uint8).reshape(byte_shape(plan))
    return random_blocks(rng, plan)


def copy_tokenizer(writer: GGUFWriter, source: Path, pad_to: int | None = None) -> int:
    """Copies every tokenizer key of `source` as is, the vocabulary padded with control
    tokens to `pad_to` entries; returns the vocabulary size."""
    padding = {"tokenizer.ggml.tokens": lambda count: [f"<|pad_{i}|>".encode() for i in range(count)],
               "tokenizer.ggml.token_type": lambda count: [3] * count,  # control: never made from text
               "tokenizer.ggml.scores": lambda count: [0.0] * count}
    reader = GGUFReader(source)
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = field.types[0]
        if main == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                # Raw bytes: no decode/encode round trip for odd vocabulary entries.
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [x.item() for x in (field.parts[i][0] for i in field.data)]
            if pad_to and key in padding:
                value += padding[key](pad_to - len(value))
            writer.add_key_value(key, value, main, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
        elif main == GGUFValueType.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]]), main)
        else:
            writer.add_key_value(key, field.parts[field.data[0]][0].item(), main)
    if not vocab:
        raise SystemExit(f"{source} has no tokenizer.ggml.tokens")
    return vocab


def write(out: Path, preset: Preset, size: str, matrix_type: str, vocab_source: Path, seed: int,
          arch: str = "llama") -> Iterator[str]:
    """Writes the file; yields a progress line now and then."""
    writer = GGUFWriter(out, arch)
    vocab = copy_tokenizer(writer, vocab_source, preset.vocab)
    writer.add_name(f"synthetic {arch} {size} {matrix_type} (random weights)")
    writer.add_uint32(f"{arch}.vocab_size", vocab)
    writer.add_uint32(f"{arch}.context_length", preset.context)
    writer.add_uint32(f"{arch}.embedding_length", preset.dim)
    writer.add_uint32(f"{arch}.block_count", preset.n_layers)
    writer.add_uint32(f"{arch}.feed_forward_length", preset.ffn)
    writer.add_uint32(f"{arch}.rope.dimension_count", preset.dim // preset.n_heads)
    writer.add_float32(f"{arch}.rope.freq_base", preset.rope_theta)
    writer.add_uint32(f"{arch}.attention.head_count", preset.n_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", preset.n_kv_heads)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", preset.norm_eps)
    writer.add_file_type(FILE_TYPES[matrix_type])
    writer.add_quantization_version(2)

    plans = plan_tensors(preset, vocab, QUANT_TYPES[matrix_type], arch)
    for plan in plans:
        shape = byte_shape(plan)
        if plan.kind == GGMLQuantizationType.F32:
            writer.add_tensor_info(plan.name, shape, np.dtype(np.float32), math.prod(shape) * 4)
        else:
            writer.add_tensor_info(plan.name, shape, np.dtype(np.uint8), math.prod(shape), raw_dtype=plan.kind)
    parameters = sum(math.prod(p.shape) for p in plans)
    yield f"{len(plans)} tensors, {parameters / 1e9:.3f} B parameters, vocabulary {vocab}"

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for plan in plans:
        writer.write_tensor_data(generate(rng, plan))
        if plan.name.endswith("ffn_down.weight"):
            yield f"  {plan.name.split('.')[1]} of {preset.n_layers} layers written"
    writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--size", choices=sorted(PRESETS), default="1b")
    parser.add_argument("--arch", choices=ARCHITECTURES, default="llama",
                        help="qwen2: the same shapes with Qwen2's q, k and v biases and its metadata")
    parser.add_argument("--type", dest="matrix_type", choices=sorted(QUANT_TYPES), default="q4_0",
                        help="format of the 2-D weights (the output head is always q8_0); f16 makes a file for "
                             "llama.cpp's quantizer (benchmarks/README.md)")
    parser.add_argument("--vocab-from", type=Path, default=default_vocab_source(),
                        help="GGUF whose tokenizer is copied (default: the default model)")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    if not options.vocab_from.exists():
        parser.error(f"{options.vocab_from} not found (run `llama-chat download` or pass --vocab-from)")
    options.out.parent.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    for line in write(options.out, PRESETS[options.size], options.size, options.matrix_type,
                      options.vocab_from, options.seed, options.arch):
        print(line, flush=True)
    seconds = time.perf_counter() - started
    size = options.out.stat().st_size
    print(f"wrote {options.out}: {size / 1e9:.2f} GB ({size / 2**30:.2f} GiB) in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
