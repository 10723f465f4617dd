// Tiled Q4_0 and Q4_1 matrices (layout in kernels.h) times int8 or 16-bit activations,
// for single tokens and several alike; included by kernels_impl.h, once per variant.
//
// Per group of 32 columns and token: the levels (0..15, unsigned) go through byte dot
// products with the token's signed bytes, 16 rows a vector, and the float work is
//   Q4_0 (w = d (q - 8)):  y += d (xscale * sum(q x) - 8 xsum)
//   Q4_1 (w = d q + m):    y += d xscale * sum(q x) + m xsum
// where x ~ xscale * levels and xsum is the sum of the rounded x (see quantize_rows).
// With 16 bits, sum(q x) = 255 * (the high halves' sum) + the low halves' sum.

namespace llama_chat_kernels {
namespace VARIANT_NAMESPACE {

constexpr int GROUP_CHUNKS = 4;  // 64-byte chunks of levels per group of 32 columns

inline int32_t dword(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

#if VARIANT == 2
// vpdpbusd with the 4 signed bytes at x broadcast by the instruction itself ({1to16}):
// compilers emit a separate broadcast for _mm512_set1_epi32, which costs as much as the
// product.
inline __m512i dot_broadcast(__m512i acc, __m512i levels, const uint8_t* x) {
    __asm__("vpdpbusd %[x]%{1to16%}, %[levels], %[acc]"
            : [acc] "+v"(acc)
            : [levels] "v"(levels), [x] "m"(*reinterpret_cast<const int32_t*>(x)));
    return acc;
}
#endif

// R tokens from row m against one tile: out[r][0..16).
template <int R, bool MINIMUMS, bool TWO>
void tile_tokens(const uint8_t* tile, const QuantizedRows& xq, int64_t m, float* out) {
    constexpr int PLANES = TWO ? 2 : 1;
    constexpr int64_t GROUP_BYTES = tile_group_bytes(MINIMUMS ? Q4_1 : Q4_0);
    const int64_t columns = xq.columns, groups = columns / X_GROUP;
    const uint8_t* x[PLANES][R];
    for (int r = 0; r < R; ++r) {
        x[0][r] = xq.high + (m + r) * columns;
        if (TWO) x[PLANES - 1][r] = xq.low + (m + r) * columns;
    }
    const float* xscale = xq.xscale + m * groups;
    const float* xsum = xq.xsum + m * groups;
#if VARIANT == 2
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g, tile += GROUP_BYTES) {
        __m512i level[2 * GROUP_CHUNKS];  // [8 k + 4 half .. + 4): columns 8 k + 4 half + j
        for (int k = 0; k < GROUP_CHUNKS; ++k) {
            const __m512i bytes = _mm512_loadu_si512(tile + 64 * k);
            level[2 * k] = _mm512_and_si512(bytes, nibble);
            level[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
        }
        const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 256)));
        // Products slice by slice across all tokens and planes: R * PLANES independent
        // chains in step (a second chain each where they are fewer than 4, vpdpbusd's
        // latency in cycles), so the products issue back to back.
        constexpr int CHAINS = R * PLANES >= 4 ? 1 : 2;
        __m512i dot[R][PLANES][CHAINS];
        for (int r = 0; r < R; ++r)
            for (int plane = 0; plane < PLANES; ++plane)
                for (int c = 0; c < CHAINS; ++c) dot[r][plane][c] = _mm512_setzero_si512();
        for (int i = 0; i < 2 * GROUP_CHUNKS; ++i)
            for (int r = 0; r < R; ++r)
                for (int plane = 0; plane < PLANES; ++plane)
                    dot[r][plane][i % CHAINS] =
                        dot_broadcast(dot[r][plane][i % CHAINS], level[i], x[plane][r] + 32 * g + 4 * i);
        for (int r = 0; r < R; ++r) {
            __m512i sums[PLANES];
            for (int plane = 0; plane < PLANES; ++plane)
                sums[plane] = CHAINS == 1 ? dot[r][plane][0] : _mm512_add_epi32(dot[r][plane][0], dot[r][plane][CHAINS - 1]);
            const __m512i total =
                TWO ? _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(sums[0], 8), sums[0]), sums[PLANES - 1]) : sums[0];
            const float step = xscale[r * groups + g], summed = xsum[r * groups + g];
            if (MINIMUMS) {
                const __m512 minimum = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 288)));
                acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(summed), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(step)), scale, acc[r]);
            } else {
                const __m512 part =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(step), _mm512_set1_ps(-8.0f * summed));
                acc[r] = _mm512_fmadd_ps(part, scale, acc[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * TILE_ROWS, acc[r]);
#elif VARIANT == 1
    // vpmaddubsw: pairs of unsigned level x signed byte products in 16 bits, at most
    // 2 * 15 * 127 = 3810, so the 8 products of a group's column slices add up in 16 bits
    // (30480) before one vpmaddwd widens them; rows 0-7 and 8-15 in two halves.
    const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g, tile += GROUP_BYTES) {
        for (int h = 0; h < 2; ++h) {
            __m256i level[2 * GROUP_CHUNKS];
            for (int k = 0; k < GROUP_CHUNKS; ++k) {
                const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 64 * k + 32 * h));
                level[2 * k] = _mm256_and_si256(bytes, nibble);
                level[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
            }
            const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 256 + 16 * h)));
            for (int r = 0; r < R; ++r) {
                __m256i dot[PLANES];
                for (int plane = 0; plane < PLANES; ++plane) {
                    const uint8_t* xg = x[plane][r] + 32 * g;
                    __m256i pairs = _mm256_maddubs_epi16(level[0], _mm256_set1_epi32(dword(xg)));
                    for (int i = 1; i < 2 * GROUP_CHUNKS; ++i)
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(level[i], _mm256_set1_epi32(dword(xg + 4 * i))));
                    dot[plane] = _mm256_madd_epi16(pairs, ones);
                }
                const __m256i total = TWO ? _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(dot[0], 8), dot[0]),
                                                             dot[PLANES - 1])
                                          : dot[0];
                const float step = xscale[r * groups + g], summed = xsum[r * groups + g];
                if (MINIMUMS) {
                    const __m256 minimum =
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 288 + 16 * h)));
                    acc[r][h] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(summed), acc[r][h]);
                    acc[r][h] =
                        _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(step)), scale, acc[r][h]);
                } else {
                    const __m256 part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(step),
                                                        _mm256_set1_ps(-8.0f * summed));
                    acc[r][h] = _mm256_fmadd_ps(part, scale, acc[r][h]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + r * TILE_ROWS + 8 * h, acc[r][h]);
#else
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < TILE_ROWS; ++n) out[r * TILE_ROWS + n] = 0.0f;
    for (int64_t g = 0; g < groups; ++g, tile += GROUP_BYTES) {
        for (int n = 0; n < TILE_ROWS; ++n) {
            const float scale = half_to_float(tile + 256 + 2 * n);
            const float minimum = MINIMUMS ? half_to_float(tile + 288 + 2 * n) : 0.0f;
            for (int r = 0; r < R; ++r) {
                int32_t dot[PLANES];
                for (int plane = 0; plane < PLANES; ++plane) {
                    const int8_t* xg = reinterpret_cast<const int8_t*>(x[plane][r] + 32 * g);
                    dot[plane] = 0;
                    for (int k = 0; k < GROUP_CHUNKS; ++k) {
                        for (int j = 0; j < 4; ++j) {
                            const uint8_t both = tile[64 * k + 4 * n + j];
                            dot[plane] += (both & 15) * xg[8 * k + j] + (both >> 4) * xg[8 * k + 4 + j];
                        }
                    }
                }
                const int32_t total = TWO ? 255 * dot[0] + dot[PLANES - 1] : dot[0];
                const float step = xscale[r * groups + g], summed = xsum[r * groups + g];
                out[r * TILE_ROWS + n] += MINIMUMS ? scale * (float(total) * step) + minimum * summed
                                                   : scale * (float(total) * step - 8.0f * summed);
            }
        }
    }
#endif
}

#if VARIANT == 2
// One token against T tiles: the token's bytes are broadcast once a group for all T (for
// a single token the broadcasts would otherwise cost as much as the products).
template <int T, bool MINIMUMS, bool TWO>
void tiles_one_token(const uint8_t* tiles, int64_t tile_bytes, const QuantizedRows& xq, int64_t m, float* out) {
    constexpr int PLANES = TWO ? 2 : 1;
    constexpr int64_t GROUP_BYTES = tile_group_bytes(MINIMUMS ? Q4_1 : Q4_0);
    const int64_t columns = xq.columns, groups = columns / X_GROUP;
    const uint8_t* x[PLANES] = {xq.high + m * columns};
    if (TWO) x[PLANES - 1] = xq.low + m * columns;
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m512i xv[PLANES][2 * GROUP_CHUNKS];
        for (int plane = 0; plane < PLANES; ++plane)
            for (int i = 0; i < 2 * GROUP_CHUNKS; ++i) xv[plane][i] = _mm512_set1_epi32(dword(x[plane] + 32 * g + 4 * i));
        const float step = xq.xscale[m * groups + g], summed = xq.xsum[m * groups + g];
        for (int t = 0; t < T; ++t) {
            const uint8_t* tile = tiles + t * tile_bytes + g * GROUP_BYTES;
            __m512i dot[PLANES][2];
            for (int plane = 0; plane < PLANES; ++plane) dot[plane][0] = dot[plane][1] = _mm512_setzero_si512();
            for (int k = 0; k < GROUP_CHUNKS; ++k) {
                const __m512i bytes = _mm512_loadu_si512(tile + 64 * k);
                const __m512i low = _mm512_and_si512(bytes, nibble);
                const __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
                for (int plane = 0; plane < PLANES; ++plane) {
                    dot[plane][0] = _mm512_dpbusd_epi32(dot[plane][0], low, xv[plane][2 * k]);
                    dot[plane][1] = _mm512_dpbusd_epi32(dot[plane][1], high, xv[plane][2 * k + 1]);
                }
            }
            const __m512i first = _mm512_add_epi32(dot[0][0], dot[0][1]);
            const __m512i total =
                TWO ? _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(first, 8), first),
                                       _mm512_add_epi32(dot[PLANES - 1][0], dot[PLANES - 1][1]))
                    : first;
            const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 256)));
            if (MINIMUMS) {
                const __m512 minimum = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 288)));
                acc[t] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(summed), acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(step)), scale, acc[t]);
            } else {
                const __m512 part =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(step), _mm512_set1_ps(-8.0f * summed));
                acc[t] = _mm512_fmadd_ps(part, scale, acc[t]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * TILE_ROWS, acc[t]);
}
constexpr int TILE_TOKENS = 4;
constexpr int TILES_AT_ONCE = 4;
static_assert(TILES_AT_ONCE <= TILE_TOKENS, "out[] holds TILE_TOKENS tiles' rows");  // tokens sharing one decoding of a group's levels
#elif VARIANT == 1
constexpr int TILE_TOKENS = 2;
#else
constexpr int TILE_TOKENS = 1;
#endif

template <bool MINIMUMS, bool TWO>
void tile_rows_typed(const uint8_t* tiles, const QuantizedRows& xq, float* y, int64_t out_features, int64_t t0,
                     int64_t t1) {
    const int64_t tile_bytes = xq.columns / X_GROUP * tile_group_bytes(MINIMUMS ? Q4_1 : Q4_0);
    alignas(64) float out[TILE_TOKENS * TILE_ROWS];
    int64_t t = t0;
#if VARIANT == 2
    if (xq.rows == 1) {
        for (; t + TILES_AT_ONCE <= t1; t += TILES_AT_ONCE) {
            tiles_one_token<TILES_AT_ONCE, MINIMUMS, TWO>(tiles + t * tile_bytes, tile_bytes, xq, 0, out);
            const int64_t first = t * TILE_ROWS;
            std::memcpy(y + first, out, std::min<int64_t>(TILES_AT_ONCE * TILE_ROWS, out_features - first) * 4);
        }
    }
#endif
    for (; t < t1; ++t) {
        const uint8_t* tile = tiles + t * tile_bytes;
        const int64_t first = t * TILE_ROWS;
        const int64_t count = std::min<int64_t>(TILE_ROWS, out_features - first);
        for (int64_t m = 0; m < xq.rows;) {
            int rows = 1;
            if (xq.rows - m >= TILE_TOKENS) {
                tile_tokens<TILE_TOKENS, MINIMUMS, TWO>(tile, xq, m, out);
                rows = TILE_TOKENS;
            } else {
                tile_tokens<1, MINIMUMS, TWO>(tile, xq, m, out);
            }
            for (int r = 0; r < rows; ++r) std::memcpy(y + (m + r) * out_features + first, out + r * TILE_ROWS, count * 4);
            m += rows;
        }
    }
}

void tile_rows(int type, const uint8_t* tiles, const QuantizedRows& xq, float* y, int64_t out_features, int64_t t0,
               int64_t t1) {
    const bool two = xq.low != nullptr;
    if (type == Q4_1) {
        if (two) return tile_rows_typed<true, true>(tiles, xq, y, out_features, t0, t1);
        return tile_rows_typed<true, false>(tiles, xq, y, out_features, t0, t1);
    }
    if (two) return tile_rows_typed<false, true>(tiles, xq, y, out_features, t0, t1);
    return tile_rows_typed<false, false>(tiles, xq, y, out_features, t0, t1);
}

}  // namespace VARIANT_NAMESPACE
}  // namespace llama_chat_kernels
