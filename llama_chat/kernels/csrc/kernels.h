// The kernels each instruction-set variant provides, as plain functions over raw memory
// (the variants are compiled for their own targets and must not include PyTorch headers:
// inline functions of a header compiled for AVX-512 could be linked into code that runs
// on a CPU without it). ops.cpp splits the work over threads and calls one variant.
#pragma once

#include <cstdint>

#include "blocks.h"

namespace llama_chat_kernels {

constexpr int X_GROUP = 32;     // activations sharing one int8 scale

// Activations quantised for the integer kernels, per group of 32 along a row, as signed
// bytes: with 8 bits, x ~ high * xscale; with 16 bits, x ~ (255 high + low) * xscale, the
// two halves going through the same byte products. xsum is each group's sum of those
// values (for types with offsets).
struct QuantizedRows {
    const uint8_t* high;   // [rows][columns]
    const uint8_t* low;    // [rows][columns], or null with 8 bits
    const float* xscale;   // [rows][columns / 32]
    const float* xsum;     // [rows][columns / 32]
    const float* xsum_half;  // [rows][columns / 32]: the sum over each group's first 16
    int64_t rows;
    int64_t columns;
};

// Every type's matrices are laid out at load in tiles of TILE_ROWS rows, one tile after
// another, each a run of units of columns (32 for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, a block
// of 256 for the K types). A unit holds, in the order a kernel reads them:
//   1. the K types' byte factors, a byte a row: Q4_K's and Q5_K's 6-bit scales of group j
//      for the 16 rows as 16 bytes, j = 0..7, then their minimums alike (256 bytes); Q6_K's
//      int8 scales of its 16 sub-blocks of 16 columns alike (256 bytes);
//   2. per group of 32 columns, its levels and then the bits of its levels above the 4:
//      - levels: 8 level vectors, vector v holding in byte 4 r + j row r's level at column
//        4 v + j. With 4-bit levels (Q5's and Q6_K's low 4 bits) 256 bytes, two vectors a
//        64-byte chunk: chunk k holds vector 2 k in its low nibbles and 2 k + 1 in its high
//        ones (row r's columns 8 k + j and 8 k + 4 + j in byte 4 r + j); Q8_0's 8-bit
//        levels are 512 bytes, vector v the 64 bytes from 64 v, the file's int8 levels
//        plus 128 (0..255: unsigned, as vpdpbusd reads its first operand);
//      - Q5_0's, Q5_1's and Q5_K's fifth bits, 64 bytes: bit v of byte 4 r + j is level
//        vector v's, row r's column 4 v + j;
//      - Q6_K's top 2 bits, 128 bytes: bits 2 i, 2 i + 1 of byte 4 r + j of its 64-byte
//        chunk c are level vector 4 c + i's;
//   3. the 16 rows' float16 d, then (Q4_1, Q5_1: m; Q4_K, Q5_K: dmin) the second field alike.
// So a single token reads each unit as one forward stream (the factors first, the float16
// fields last, where the float work of the whole unit uses them), and
//   Q4_0 unit (288 bytes)    w = d (q - 8)          Q4_1 unit (320 bytes)   w = d q + m
//   Q5_0 unit (352 bytes)    w = d (q - 16)         Q5_1 unit (384 bytes)   w = d q + m
//   Q8_0 unit (544 bytes)    w = d (q - 128)        Q4_K unit (2368 bytes)  w = d sc q - dmin mn
//   Q5_K unit (2880 bytes)   w = d sc q - dmin mn   Q6_K unit (3360 bytes)  w = d sc (q - 32)
// keep their file's size but for the K types' 6-bit scales, held a byte each (Q4_K: 148
// bytes a row's block against 144, Q5_K 180 against 176); the K types' units are whole
// cache lines, and so are their groups. One 64-byte load (split into nibbles for 4-bit
// levels) feeds vpdpbusd with 16 rows at once, single tokens and several alike. A Q5 level
// vector's fifth bits come from one more line, all 8 vectors' from the same: one bit test
// (AVX-512) or one shift and one mask (AVX2) away.
constexpr int TILE_ROWS = 16;

constexpr bool k_type(int type) { return type == Q4_K || type == Q5_K || type == Q6_K; }
constexpr int64_t tile_unit_columns(int type) { return k_type(type) ? 256 : 32; }
constexpr int64_t tile_unit_bytes(int type) {
    switch (type) {
        case Q4_0: return 288;
        case Q4_1: return 320;
        case Q5_0: return 352;
        case Q5_1: return 384;
        case Q8_0: return 544;
        case Q4_K: return 2368;
        case Q5_K: return 2880;
        default: return 3360;  // Q6_K
    }
}
constexpr int64_t tile_bytes(int type, int64_t columns) { return columns / tile_unit_columns(type) * tile_unit_bytes(type); }
constexpr int64_t tile_count(int64_t rows) { return (rows + TILE_ROWS - 1) / TILE_ROWS; }

// Where a type's float16 fields (d, then Q4_1's and Q5_1's m or the K types' dmin)
// start in a file block, and how many it has; a unit holds each for its 16 rows after the
// levels.
struct Halves {
    int at;
    int count;
};
constexpr Halves halves_of(int type) {
    return type == Q6_K                                   ? Halves{208, 1}
           : type == Q4_0 || type == Q5_0 || type == Q8_0 ? Halves{0, 1}
                                                          : Halves{0, 2};
}

struct KernelSet {
    // Rows m0..m1 of x into the quantised form (low null: 8 bits), signed bytes.
    void (*quantize_rows)(const float* x, int64_t columns, uint8_t* high, uint8_t* low, float* xscale, float* xsum,
                          float* xsum_half, int64_t m0, int64_t m1);
    // y for the output rows of tiles t0..t1 of a matrix.
    void (*tile_rows)(int type, const uint8_t* tiles, const QuantizedRows& xq, float* y, int64_t out_features,
                      int64_t t0, int64_t t1);
    // Variants with AMX (null elsewhere): rows' float activations packed as split bfloat16
    // for the tile unit (token blocks b0..b1 of 16), and a tiled matrix times them there
    // (tiles_amx.h; packed holds split_bytes(rows, columns)).
    void (*pack_split)(const float* x, int64_t rows, int64_t columns, uint16_t* packed, int64_t b0, int64_t b1);
    void (*split_tile_rows)(int type, const uint8_t* tiles, const uint16_t* packed, int64_t rows, int64_t columns,
                            float* y, int64_t out_features, int64_t t0, int64_t t1);
};

// Steps of more tokens than this (a prompt's chunks: a verify step has at most 32) run on the
// tile unit where the variant has one, their matrices and their attention; shorter ones keep
// the integer kernels and the vector attention, whose results a single token's match.
constexpr int64_t SPLIT_MIN_ROWS = 32;
constexpr int SPLIT_BLOCK = 16;  // tokens a block of split activations holds
inline int64_t split_bytes(int64_t rows, int64_t columns) {
    return (rows + SPLIT_BLOCK - 1) / SPLIT_BLOCK * SPLIT_BLOCK * columns * 2 * 2;  // two planes of bfloat16
}

const KernelSet& kernels_portable();
const KernelSet& kernels_avx2();
const KernelSet& kernels_avx512_vnni();
const KernelSet& kernels_avx512_amx();

}  // namespace llama_chat_kernels
