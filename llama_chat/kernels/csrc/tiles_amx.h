// A prompt's tokens against tiled matrices on AMX's tile unit, in split bfloat16 (the
// avx512-amx variant; included by tiles_impl.h where AMX_TILES is defined).
//
// Integer products would leave the tile after every group of 32 columns to be scaled by
// its block's scale (a store and a dozen vector operations for each 16 x 16 result), which
// costs more than the product itself. Here the tile unit multiplies numbers that carry their
// scales: each weight, d q + m as the file defines it, is split into two bfloat16, w = w_hi +
// w_lo (16 significant bits, within 2^-17 of a weight of up to 19: float16's 11 times Q8_0's
// 8), and each activation alike; w_hi x_hi + w_lo x_hi + w_hi x_lo (three TDPBF16PS; the
// dropped w_lo x_lo is below 2^-16 of the product) are summed in float32 along the row. Measured on random blocks against float64,
// the largest error is about a fifth of the integer kernels' with 16-bit activations.
//
// The operands (every tile 16 rows of 64 bytes): A, 16 tokens x a group's 32 columns, from a
// call's activations split and packed block by block (pack_split); B, the group's columns in
// pairs for a tile's 16 weight rows (row k of B holds columns 2k and 2k + 1 of each weight row),
// made from the tile's level vectors (kernels.h: 4 columns of the 16 rows each) by
// split_weights; C, float32 [token][weight row], read from and written to y itself.
//
// Blocking: a call's columns are taken SPLIT_GROUPS groups at a time, so that the packed
// activations of those columns (for a 256-token prompt chunk, 256 KB) stay in L2 while every
// tile of the thread's share passes over them; two tiles' weights for those columns are
// split once into panels (16 KB each, in L1) that serve all the token blocks, one block at a
// time (8 tiles: the two tiles' C, the block's A in two planes, each tile's B in two). Two
// tiles a block rather than two blocks a tile halve the tokens' loads from L2: 20% faster
// on a 256-token step here (measured 9.2 against 11.3 ms, 4096 x 2048, one core). More
// groups a pass (16, 32) push the panels out of L1 and measured slower; 4, slower too.
//
// Linux hands tile registers to a process only once it has asked (arch_prctl), which
// ops.cpp does before it counts this variant as runnable; each thread loads the tile
// configuration before its first product and releases the tiles after its last.

namespace amx {

constexpr int TOKENS = SPLIT_BLOCK;     // tokens a block (A's rows, C's rows)
constexpr int PLANE = X_GROUP * 16;     // bfloat16 in one plane of a group's 16 rows (1 KB)
constexpr int64_t SPLIT_GROUPS = 8;     // groups of columns a pass over the tiles takes

struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t bytes_a_row[16] = {};
    uint8_t rows[16] = {};
};

// C (0, 1: a token block's results against two tiles) and A (2, 3: its tokens, high and low
// planes) of `tokens` rows (a call's last block may hold fewer), B (4, 5 and 6, 7: the two
// tiles' weights, high and low planes) of 16.
inline void configure(int tokens) {
    TileConfig config;
    for (int t = 0; t < 4; ++t) config.rows[t] = uint8_t(tokens), config.bytes_a_row[t] = 64;
    for (int t = 4; t < 8; ++t) config.rows[t] = 16, config.bytes_a_row[t] = 64;
    _tile_loadconfig(&config);
}

inline __m512 widened(__m256i halves) {  // bfloat16 to float32: the bits shifted up
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}

// x = hi + lo, each bfloat16: 32 values from two vectors of 16, in order.
inline void split(__m512 first, __m512 second, __m512i& hi, __m512i& lo) {
    hi = __m512i(_mm512_cvtne2ps_pbh(second, first));
    const __m512 hi_first = widened(_mm512_castsi512_si256(hi)), hi_second = widened(_mm512_extracti64x4_epi64(hi, 1));
    lo = __m512i(_mm512_cvtne2ps_pbh(_mm512_sub_ps(second, hi_second), _mm512_sub_ps(first, hi_first)));
}

}  // namespace amx

// Rows of x [rows][columns] in token blocks b0..b1, as A operands: packed[block][group][plane]
// [16 tokens][32] bfloat16; a block's tokens past `rows` are zeros.
void pack_split(const float* x, int64_t rows, int64_t columns, uint16_t* packed, int64_t b0, int64_t b1) {
    const int64_t groups = columns / X_GROUP;
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t g = 0; g < groups; ++g) {
            uint16_t* out = packed + (b * groups + g) * 2 * amx::PLANE;
            for (int m = 0; m < amx::TOKENS; ++m) {
                const int64_t row = b * amx::TOKENS + m;
                __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
                if (row < rows) {
                    const float* v = x + row * columns + X_GROUP * g;
                    amx::split(_mm512_loadu_ps(v), _mm512_loadu_ps(v + 16), hi, lo);
                }
                _mm512_store_si512(out + 32 * m, hi);
                _mm512_store_si512(out + amx::PLANE + 32 * m, lo);
            }
        }
}

// A tile's group g as B operands: panel[plane][16 column pairs][16 weight rows][2] bfloat16,
// each weight d q + m.
template <int TYPE>
void split_weights(const uint8_t* tile, int64_t g, uint16_t* panel) {
    using Group = TileGroup<TYPE>;
    // Each lane's weight row: a vector of 16 levels holds 4 rows x 4 columns (lane 4 n + j).
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 scale[2][4], minimum[2][4];  // [half][rows 4 q .. 4 q + 3]
    for (int half = 0; half < Group::HALVES; ++half) {
        const __m512 s = Group::scales(tile, g, half);
        const __m512 m = Group::OFFSET != 0.0f ? _mm512_mul_ps(s, _mm512_set1_ps(-Group::OFFSET))
                                               : Group::minimums(tile, g);
        for (int q = 0; q < 4; ++q) {
            const __m512i lanes = _mm512_add_epi32(quarter, _mm512_set1_epi32(4 * q));
            scale[half][q] = _mm512_permutexvar_ps(lanes, s);
            minimum[half][q] = _mm512_permutexvar_ps(lanes, m);
        }
    }
    // Even and odd dwords of two vectors: a pair row's columns (4 v, 4 v + 1), then (4 v + 2, 4 v + 3).
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    for (int k = 0; k < GROUP_CHUNKS; ++k) {
        __m512i level[2];  // level vectors 2 k and 2 k + 1: columns 8 k .. 8 k + 7
        unpack_chunk<TYPE>(Group::levels(tile, g), Group::high_bits(tile, g), k, level[0], level[1]);
        for (int half_vector = 0; half_vector < 2; ++half_vector) {
            const int v = 2 * k + half_vector, half = Group::HALVES == 2 && v >= 4;
            __m512 w[4];  // rows 4 q .. 4 q + 3, 4 columns each
            for (int q = 0; q < 4; ++q) {
                const __m512i bytes = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(level[half_vector], q));
                w[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bytes), scale[half][q], minimum[half][q]);
            }
            __m512i hi[2], lo[2];  // rows 0-7 and 8-15: 32 bfloat16, dword 2 n + p = row n's pair p
            amx::split(w[0], w[1], hi[0], lo[0]);
            amx::split(w[2], w[3], hi[1], lo[1]);
            uint16_t* rows = panel + 2 * v * 32;  // pair rows 2 v and 2 v + 1
            _mm512_store_si512(rows, _mm512_permutex2var_epi32(hi[0], evens, hi[1]));
            _mm512_store_si512(rows + 32, _mm512_permutex2var_epi32(hi[0], odds, hi[1]));
            _mm512_store_si512(rows + amx::PLANE, _mm512_permutex2var_epi32(lo[0], evens, lo[1]));
            _mm512_store_si512(rows + amx::PLANE + 32, _mm512_permutex2var_epi32(lo[0], odds, lo[1]));
        }
    }
}

// A token block's groups against two tiles' panels into C 0 and 1. Tile registers are not
// renamed, so a load waits for every product that reads the register before it: each
// group's loads for the next one are issued as soon as their register's last product has
// been, in an order where the first products of a group read the registers loaded
// earliest (A high 2, A low 3; B high 4 and 6, B low 5 and 7).
inline void two_tiles(const uint16_t* const panels[2], const uint16_t* tokens, int64_t groups) {
    auto a = [&](int64_t g) { return tokens + g * 2 * amx::PLANE; };
    auto b = [&](int k, int64_t g) { return panels[k] + g * 2 * amx::PLANE; };
    _tile_loadd(2, a(0), 64);
    _tile_loadd(3, a(0) + amx::PLANE, 64);
    _tile_loadd(4, b(0, 0), 64);
    _tile_loadd(5, b(0, 0) + amx::PLANE, 64);
    _tile_loadd(6, b(1, 0), 64);
    _tile_loadd(7, b(1, 0) + amx::PLANE, 64);
    for (int64_t g = 0; g < groups; ++g) {
        const bool more = g + 1 < groups;
        _tile_dpbf16ps(0, 2, 5);  // x_hi w_lo
        _tile_dpbf16ps(1, 2, 7);
        if (more) {
            _tile_loadd(5, b(0, g + 1) + amx::PLANE, 64);
            _tile_loadd(7, b(1, g + 1) + amx::PLANE, 64);
        }
        _tile_dpbf16ps(0, 2, 4);  // x_hi w_hi
        _tile_dpbf16ps(1, 2, 6);
        if (more) _tile_loadd(2, a(g + 1), 64);
        _tile_dpbf16ps(0, 3, 4);  // x_lo w_hi
        if (more) _tile_loadd(4, b(0, g + 1), 64);
        _tile_dpbf16ps(1, 3, 6);
        if (more) {
            _tile_loadd(3, a(g + 1) + amx::PLANE, 64);
            _tile_loadd(6, b(1, g + 1), 64);
        }
    }
}

// One token block against the panels of one or two tiles (`two`); their results added to
// y's columns (or set, where `first_pass`). A block of fewer than 16 tokens is configured so;
// a tile of fewer than 16 rows goes through `scratch`, never past y's bounds.
inline void split_tiles(const uint16_t* const panels[2], bool two, const uint16_t* tokens, int64_t groups, float* y,
                        int64_t y_stride, int tokens_here, const int count[2], bool first_pass, float* scratch) {
    const int tiles = two ? 2 : 1;
    float* target[2];
    int64_t stride[2];
    for (int k = 0; k < tiles; ++k) {
        const bool direct = count[k] == TILE_ROWS;
        target[k] = direct ? y + k * TILE_ROWS : scratch + k * amx::TOKENS * TILE_ROWS;
        stride[k] = direct ? y_stride * 4 : TILE_ROWS * 4;
        if (!direct && !first_pass)
            for (int m = 0; m < tokens_here; ++m)
                std::memcpy(target[k] + m * TILE_ROWS, y + m * y_stride + k * TILE_ROWS, count[k] * 4);
    }
    if (first_pass) {
        _tile_zero(0);
        _tile_zero(1);
    } else {
        _tile_loadd(0, target[0], stride[0]);
        if (two) _tile_loadd(1, target[1], stride[1]);
    }
    if (two) {
        two_tiles(panels, tokens, groups);
    } else {
        for (int64_t g = 0; g < groups; ++g) {
            const uint16_t* block = tokens + g * 2 * amx::PLANE;
            const uint16_t* first = panels[0] + g * 2 * amx::PLANE;
            _tile_loadd(2, block, 64);
            _tile_loadd(3, block + amx::PLANE, 64);
            _tile_loadd(4, first, 64);
            _tile_loadd(5, first + amx::PLANE, 64);
            _tile_dpbf16ps(0, 2, 4);
            _tile_dpbf16ps(0, 2, 5);
            _tile_dpbf16ps(0, 3, 4);
        }
    }
    _tile_stored(0, target[0], stride[0]);
    if (two) _tile_stored(1, target[1], stride[1]);
    for (int k = 0; k < tiles; ++k)
        if (count[k] != TILE_ROWS)
            for (int m = 0; m < tokens_here; ++m)
                std::memcpy(y + m * y_stride + k * TILE_ROWS, target[k] + m * TILE_ROWS, count[k] * 4);
}

// Every token of the packed activations against tiles t0..t1, on the tile unit.
template <int TYPE>
void split_tile_rows_typed(const uint8_t* tiles, const uint16_t* packed, int64_t rows, int64_t columns, float* y,
                           int64_t out_features, int64_t t0, int64_t t1) {
    const int64_t stride = tile_bytes(TYPE, columns), groups = columns / X_GROUP;
    const int64_t blocks = (rows + amx::TOKENS - 1) / amx::TOKENS, block_stride = groups * 2 * amx::PLANE;
    const int last_tokens = int(rows - (blocks - 1) * amx::TOKENS);
    alignas(64) uint16_t panel[2][amx::SPLIT_GROUPS * 2 * amx::PLANE];  // 16 KB a tile
    alignas(64) float scratch[2 * amx::TOKENS * TILE_ROWS];
    const uint16_t* const panels[2] = {panel[0], panel[1]};
    int configured = 0;
    for (int64_t g0 = 0; g0 < groups; g0 += amx::SPLIT_GROUPS) {
        const int64_t pass = std::min(amx::SPLIT_GROUPS, groups - g0);
        for (int64_t t = t0; t < t1; t += 2) {
            const bool two = t + 1 < t1;
            int count[2] = {0, 0};
            for (int k = 0; k < (two ? 2 : 1); ++k) {
                const uint8_t* tile = tiles + (t + k) * stride;
                for (int64_t g = 0; g < pass; ++g) split_weights<TYPE>(tile, g0 + g, panel[k] + g * 2 * amx::PLANE);
                count[k] = int(std::min<int64_t>(TILE_ROWS, out_features - (t + k) * TILE_ROWS));
            }
            for (int64_t b = 0; b < blocks; ++b) {
                const int tokens_here = b + 1 == blocks ? last_tokens : amx::TOKENS;
                if (tokens_here != configured) {
                    amx::configure(tokens_here);
                    configured = tokens_here;
                }
                split_tiles(panels, two, packed + b * block_stride + g0 * 2 * amx::PLANE, pass,
                            y + b * amx::TOKENS * out_features + t * TILE_ROWS, out_features, tokens_here, count,
                            g0 == 0, scratch);
            }
        }
    }
    if (configured) _tile_release();
}

void split_tile_rows(int type, const uint8_t* tiles, const uint16_t* packed, int64_t rows, int64_t columns, float* y,
                     int64_t out_features, int64_t t0, int64_t t1) {
    switch (type) {
        case Q4_0: return split_tile_rows_typed<Q4_0>(tiles, packed, rows, columns, y, out_features, t0, t1);
        case Q4_1: return split_tile_rows_typed<Q4_1>(tiles, packed, rows, columns, y, out_features, t0, t1);
        case Q5_0: return split_tile_rows_typed<Q5_0>(tiles, packed, rows, columns, y, out_features, t0, t1);
        case Q5_1: return split_tile_rows_typed<Q5_1>(tiles, packed, rows, columns, y, out_features, t0, t1);
        case Q8_0: return split_tile_rows_typed<Q8_0>(tiles, packed, rows, columns, y, out_features, t0, t1);
        case Q4_K: return split_tile_rows_typed<Q4_K>(tiles, packed, rows, columns, y, out_features, t0, t1);
        case Q5_K: return split_tile_rows_typed<Q5_K>(tiles, packed, rows, columns, y, out_features, t0, t1);
        default: return split_tile_rows_typed<Q6_K>(tiles, packed, rows, columns, y, out_features, t0, t1);
    }
}
