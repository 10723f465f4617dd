// GGUF weight blocks: their sizes, the K types' packed scales, and half floats. Nothing here
// depends on PyTorch, so every instruction-set variant compiles it under its own target;
// so each function is static, a copy per variant, never one shared by the linker.
//
// Layouts as ggml defines them (bytes per block / weights per block):
//   Q4_0  18/32   f16 d, 16 bytes of nibbles                 w = (q - 8) d
//   Q4_1  20/32   f16 d, f16 m, 16 bytes                     w = q d + m
//   Q5_0  22/32   f16 d, 4 bytes qh (bit j: weight j's fifth bit), 16 bytes of nibbles as
//                 Q4_0's                                     w = (q - 16) d
//   Q5_1  24/32   f16 d, f16 m, 4 bytes qh, 16 bytes         w = q d + m
//   Q8_0  34/32   f16 d, 32 int8                             w = q d
//   Q4_K 144/256  f16 d, f16 dmin, 12 bytes of 6-bit scales and minimums for 8 groups of
//                 32, 128 bytes of nibbles                   w = q d sc - dmin mn
//   Q5_K 176/256  as Q4_K plus 32 bytes holding each weight's fifth bit
//   Q6_K 210/256  128 bytes of low nibbles, 64 of high pairs, 16 int8 scales (one per 16
//                 weights), f16 d                            w = (q - 32) d sc
#pragma once

#include <cstdint>
#include <cstring>

namespace llama_chat_kernels {

enum BlockType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

struct TypeInfo {
    int block_weights;  // weights per block
    int block_bytes;
};

// The types the kernels read, in the order the library reports them (ops.cpp's layout).
constexpr int KNOWN_TYPES[] = {Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K};

static inline bool known_type(int type) {
    for (int known : KNOWN_TYPES)
        if (type == known) return true;
    return false;
}

static constexpr TypeInfo type_info(int type) {
    switch (type) {
        case Q4_0: return {32, 18};
        case Q4_1: return {32, 20};
        case Q5_0: return {32, 22};
        case Q5_1: return {32, 24};
        case Q8_0: return {32, 34};
        case Q4_K: return {256, 144};
        case Q5_K: return {256, 176};
        default: return {256, 210};  // Q6_K
    }
}

// IEEE half to float, without relying on F16C (the portable variant has none).
static inline float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000 | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int shift = 0;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            ++shift;
        }
        bits = sign | uint32_t(113 - shift) << 23 | ((mantissa & 0x3ff) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Q4_K and Q5_K: group j's 6-bit scale and minimum from the 12 packed bytes.
static inline void k_scale_min(int j, const uint8_t* q, int& scale, int& minimum) {
    if (j < 4) {
        scale = q[j] & 63;
        minimum = q[j + 4] & 63;
    } else {
        scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        minimum = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

}  // namespace llama_chat_kernels
