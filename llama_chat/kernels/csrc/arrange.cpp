// llama_chat::arrange_blocks: a run of rows of a GGUF file's blocks put into the layout
// the kernels read (kernels.h), tiles of 16 rows; rows past the last are zeros.
// A model's first load arranges every matrix, so this runs at the pace of memory.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "blocks.h"
#include "kernels.h"

namespace llama_chat_kernels {
namespace {

constexpr int MAX_BLOCK_WEIGHTS = 256;
constexpr int MAX_BLOCK_BYTES = 210;  // Q6_K's
const uint8_t ZERO_BLOCK[MAX_BLOCK_BYTES] = {};  // a padding row's block


// One file block's levels in column order: 0..15, Q5's 0..31, Q6_K's 0..63, Q8_0's int8
// levels plus 128 (0..255).
template <int TYPE>
inline void block_levels(const uint8_t* block, uint8_t* levels) {
    if constexpr (TYPE == Q8_0) {
        for (int i = 0; i < 32; ++i) levels[i] = uint8_t(block[2 + i] ^ 0x80);  // two's complement q + 128
    } else if constexpr (TYPE == Q4_0 || TYPE == Q4_1) {
        const uint8_t* q = block + (TYPE == Q4_0 ? 2 : 4);
        for (int i = 0; i < 16; ++i) {  // byte i holds columns i and i + 16
            levels[i] = q[i] & 15;
            levels[i + 16] = q[i] >> 4;
        }
    } else if constexpr (TYPE == Q5_0 || TYPE == Q5_1) {
        const uint8_t* fifth = block + (TYPE == Q5_0 ? 2 : 4);  // bit c % 8 of byte c / 8: column c's
        const uint8_t* q = fifth + 4;
        for (int i = 0; i < 16; ++i) {  // as Q4_0's
            levels[i] = uint8_t((q[i] & 15) | ((fifth[i / 8] >> (i % 8)) & 1) << 4);
            levels[i + 16] = uint8_t((q[i] >> 4) | ((fifth[2 + i / 8] >> (i % 8)) & 1) << 4);
        }
    } else if constexpr (TYPE == Q4_K || TYPE == Q5_K) {
        // 32 bytes hold 64 columns, low nibbles first; Q5_K's bit 2 run (+1) of byte l of its
        // 32 bytes of fifth bits is column 64 run + l's (+ 32's)
        const uint8_t* fifth = block + 16;
        const uint8_t* q = block + (TYPE == Q5_K ? 48 : 16);
        for (int run = 0; run < 4; ++run)
            for (int l = 0; l < 32; ++l) {
                const int bits = TYPE == Q5_K ? fifth[l] >> (2 * run) : 0;
                levels[64 * run + l] = uint8_t((q[32 * run + l] & 15) | (bits & 1) << 4);
                levels[64 * run + 32 + l] = uint8_t((q[32 * run + l] >> 4) | (bits & 2) << 3);
            }
    } else {  // Q6_K: column 128 h + 32 q + l
        const uint8_t *low = block, *high = block + 128;
        for (int h = 0; h < 2; ++h)
            for (int quarter = 0; quarter < 4; ++quarter)
                for (int l = 0; l < 32; ++l) {
                    const int nibble = (low[64 * h + 32 * (quarter & 1) + l] >> (4 * (quarter >> 1))) & 15;
                    const int crumb = (high[32 * h + l] >> (2 * quarter)) & 3;
                    levels[128 * h + 32 * quarter + l] = uint8_t(nibble | crumb << 4);
                }
    }
}

// One unit (a block of each of the tile's 16 rows), written to `out` as kernels.h lays it out.
template <int TYPE>
void arrange_unit(const uint8_t* const* blocks, uint8_t* out) {
    constexpr int groups = type_info(TYPE).block_weights / X_GROUP;
    uint8_t levels[TILE_ROWS][MAX_BLOCK_WEIGHTS];
    for (int r = 0; r < TILE_ROWS; ++r) block_levels<TYPE>(blocks[r], levels[r]);
    if constexpr (TYPE == Q4_K || TYPE == Q5_K) {  // 6-bit scales, then minimums, a byte each: group j's for the 16 rows
        for (int j = 0; j < 8; ++j)
            for (int r = 0; r < TILE_ROWS; ++r) {
                int scale, minimum;
                k_scale_min(j, blocks[r] + 4, scale, minimum);
                out[16 * j + r] = uint8_t(scale);
                out[128 + 16 * j + r] = uint8_t(minimum);
            }
        out += 256;
    } else if constexpr (TYPE == Q6_K) {  // the int8 scales of the 16 sub-blocks, a byte each
        for (int s = 0; s < 16; ++s)
            for (int r = 0; r < TILE_ROWS; ++r) out[16 * s + r] = blocks[r][192 + s];
        out += 256;
    }
    for (int g = 0; g < groups; ++g) {
        if constexpr (TYPE == Q8_0) {  // level vector v: byte 4 r + j holds row r's column 4 v + j
            for (int v = 0; v < 8; ++v)
                for (int r = 0; r < TILE_ROWS; ++r)
                    for (int j = 0; j < 4; ++j) *out++ = levels[r][4 * v + j];
        } else {  // chunk k: byte 4 r + j holds row r's columns 8 k + j (low nibble) and 8 k + 4 + j
            for (int k = 0; k < 4; ++k)
                for (int r = 0; r < TILE_ROWS; ++r)
                    for (int j = 0; j < 4; ++j) {
                        const uint8_t* column = levels[r] + X_GROUP * g + 8 * k + j;
                        *out++ = uint8_t((column[0] & 15) | (column[4] & 15) << 4);
                    }
        }
        if constexpr (TYPE == Q5_0 || TYPE == Q5_1 || TYPE == Q5_K) {  // fifth bits: byte 4 r + j, bit v, of column 4 v + j
            for (int r = 0; r < TILE_ROWS; ++r)
                for (int j = 0; j < 4; ++j) {
                    const uint8_t* column = levels[r] + X_GROUP * g + j;
                    uint8_t bits = 0;
                    for (int v = 0; v < 8; ++v) bits |= uint8_t((column[4 * v] >> 4) << v);
                    *out++ = bits;
                }
        }
        if constexpr (TYPE == Q6_K) {  // the top 2 bits: chunk c's byte 4 r + j, bits 2 i, of column 16 c + 4 i + j
            for (int c = 0; c < 2; ++c)
                for (int r = 0; r < TILE_ROWS; ++r)
                    for (int j = 0; j < 4; ++j) {
                        const uint8_t* column = levels[r] + X_GROUP * g + 16 * c + j;
                        *out++ = uint8_t((column[0] >> 4) | (column[4] >> 4) << 2 | (column[8] >> 4) << 4 |
                                         (column[12] >> 4) << 6);
                    }
        }
    }
    constexpr Halves halves = halves_of(TYPE);
    for (int field = 0; field < halves.count; ++field)  // the 16 rows' d, then (Q4_1, Q5_1, Q4_K, Q5_K) m or dmin
        for (int r = 0; r < TILE_ROWS; ++r, out += 2) std::memcpy(out, blocks[r] + halves.at + 2 * field, 2);
}

template <int TYPE>
void arrange_tiles(const uint8_t* rows, int64_t count, int64_t row_bytes, uint8_t* tiles, int64_t t0, int64_t t1) {
    constexpr int block_bytes = type_info(TYPE).block_bytes;
    const int64_t units = row_bytes / block_bytes;
    const int64_t tile_size = units * tile_unit_bytes(TYPE);
    const uint8_t* blocks[TILE_ROWS];
    for (int64_t t = t0; t < t1; ++t)
        for (int64_t u = 0; u < units; ++u) {
            for (int r = 0; r < TILE_ROWS; ++r) {
                const int64_t row = t * TILE_ROWS + r;
                blocks[r] = row < count ? rows + row * row_bytes + u * block_bytes : ZERO_BLOCK;
            }
            arrange_unit<TYPE>(blocks, tiles + t * tile_size + u * tile_unit_bytes(TYPE));
        }
}

// blocks: uint8 [rows, bytes a row] as the file holds them; arranged: the kernels' layout
// of those rows, tile_count(rows) tiles, written whole.
void arrange_blocks(const at::Tensor& blocks, int64_t block_type, const at::Tensor& arranged) {
    TORCH_CHECK(block_type >= 0 && block_type <= 255 && known_type(int(block_type)),
                "llama_chat: unsupported block type ", block_type);
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.dim() == 2,
                "llama_chat: blocks must be contiguous uint8 [rows, bytes a row]");
    TORCH_CHECK(arranged.scalar_type() == at::kByte && arranged.is_contiguous(),
                "llama_chat: arranged must be contiguous uint8");
    const int type = int(block_type);
    const TypeInfo info = type_info(type);
    const int64_t count = blocks.size(0), row_bytes = blocks.size(1);
    TORCH_CHECK(row_bytes > 0 && row_bytes % info.block_bytes == 0, "llama_chat: a row of ", row_bytes,
                " bytes is not whole blocks of ", info.block_bytes);
    const int64_t columns = row_bytes / info.block_bytes * info.block_weights;
    const int64_t units = tile_count(count), unit_bytes = tile_bytes(type, columns);
    TORCH_CHECK(arranged.numel() == units * unit_bytes, "llama_chat: arranged holds ", arranged.numel(),
                " bytes, not the ", units * unit_bytes, " of ", count, " rows of ", columns, " in tiles of 16");
    const uint8_t* rows = blocks.const_data_ptr<uint8_t>();
    uint8_t* out = arranged.mutable_data_ptr<uint8_t>();
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / unit_bytes);  // pieces of about 256 KB
    at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
        switch (type) {
            case Q4_0: return arrange_tiles<Q4_0>(rows, count, row_bytes, out, u0, u1);
            case Q4_1: return arrange_tiles<Q4_1>(rows, count, row_bytes, out, u0, u1);
            case Q5_0: return arrange_tiles<Q5_0>(rows, count, row_bytes, out, u0, u1);
            case Q5_1: return arrange_tiles<Q5_1>(rows, count, row_bytes, out, u0, u1);
            case Q8_0: return arrange_tiles<Q8_0>(rows, count, row_bytes, out, u0, u1);
            case Q4_K: return arrange_tiles<Q4_K>(rows, count, row_bytes, out, u0, u1);
            case Q5_K: return arrange_tiles<Q5_K>(rows, count, row_bytes, out, u0, u1);
            default: return arrange_tiles<Q6_K>(rows, count, row_bytes, out, u0, u1);
        }
    });
}

}  // namespace
}  // namespace llama_chat_kernels

TORCH_LIBRARY_FRAGMENT(llama_chat, m) {
    m.def("arrange_blocks(Tensor blocks, int block_type, Tensor(a!) arranged) -> ()");
}

TORCH_LIBRARY_IMPL(llama_chat, CPU, m) { m.impl("arrange_blocks", &llama_chat_kernels::arrange_blocks); }
