"""Quantise a GGUF file with llama.cpp's own quantizer (through llama-cpp-python), to get
the K-quant mixes people download: Q4_K_M (Q4_K with Q6_K for some tensors), Q5_K_M, Q6_K,
and the _S mixes that hold (almost) one type alone.
Run it with a Python that has llama-cpp-python; the input is an F16 file, for example
`make_synthetic_gguf.py --type f16`.

    PYTHON-WITH-LLAMA-CPP benchmarks/quantize_with_llama_cpp.py IN-F16.gguf OUT.gguf --type Q4_K_M
"""

from __future__ import annotations

import argparse
import sys

import llama_cpp

FILE_TYPES = {  # llama.cpp's llama_ftype numbers
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q5_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S,
    "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--type", choices=sorted(FILE_TYPES), default="Q4_K_M")
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[options.type]
    params.nthread = options.threads
    failed = llama_cpp.llama_model_quantize(options.source.encode(), options.out.encode(), params)
    if failed:
        print(f"llama.cpp's quantizer failed on {options.source} (code {failed})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
