// The row-group kernels (Q5_K, the type not tiled; tiles_impl.h has the rest), written once
// and compiled once per instruction set: a variant's file sets VARIANT (0 portable, 1 AVX2,
// 2 AVX-512 with VNNI) and its target, then includes this.
//
// float_rows (single tokens): each weight block is decoded to levels and multiplied
// with float32 activations, so decode keeps float32 numerics and reads each weight once.
//
// int8_panels (several tokens): activations are quantised in groups of 32, to int8 (as
// ggml's Q8_0) or to 16 bits carried as two int8 halves (each half one pass of the same
// byte products), and weights are decoded a panel of 16 rows at a time into a tile,
// [scale group][4 columns][16 rows][4 bytes], so that one 64-byte load feeds 16 rows'
// integer dot products (vpdpbusd: 4 unsigned x signed byte products per 32-bit lane)
// and the float work (one convert, one multiply-add per scale group) is shared by 16
// rows. Activations go in unsigned (x + 128), so each row group starts from
// -128 * sum(levels), which the tile keeps beside the levels.
//
// quantize_rows serves both these and the tiles.
#include "blocks.h"
#include "kernels.h"

namespace llama_chat_kernels {
namespace VARIANT_NAMESPACE {

// ---- float vectors: W lanes ----------------------------------------------------------
#if VARIANT == 2
constexpr int W = 16;
using VecF = __m512;
inline VecF zero() { return _mm512_setzero_ps(); }
inline VecF load(const float* p) { return _mm512_loadu_ps(p); }
inline VecF broadcast(float v) { return _mm512_set1_ps(v); }
inline VecF levels(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline VecF fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum(VecF v) { return _mm512_reduce_add_ps(v); }
#elif VARIANT == 1
constexpr int W = 8;
using VecF = __m256;
inline VecF zero() { return _mm256_setzero_ps(); }
inline VecF load(const float* p) { return _mm256_loadu_ps(p); }
inline VecF broadcast(float v) { return _mm256_set1_ps(v); }
inline VecF levels(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline VecF fma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline float sum(VecF v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
constexpr int W = 1;
using VecF = float;
inline VecF zero() { return 0.0f; }
inline VecF load(const float* p) { return *p; }
inline VecF broadcast(float v) { return v; }
inline VecF levels(const int8_t* p) { return float(*p); }
inline VecF fma(VecF a, VecF b, VecF c) { return a * b + c; }
inline float sum(VecF v) { return v; }
#endif

// A constant whose value depends on the variant (how many vectors its registers hold).
constexpr int per_variant(int avx512, int avx2, int portable) {
    return VARIANT == 2 ? avx512 : VARIANT == 1 ? avx2 : portable;
}

constexpr int MAX_BLOCK = 256;
constexpr int FLOAT_ROWS_AT_ONCE = 8;  // token rows sharing one decoded block

template <int TYPE>
void float_rows_typed(const uint8_t* weight, int64_t columns, const float* x, const float* sums, int64_t rows,
                      float* y, int64_t out_features, int64_t n0, int64_t n1) {
    constexpr TypeInfo info = type_info(TYPE);
    constexpr int S = info.scale_group, BW = info.block_weights;
    const int64_t blocks = columns / BW;
    alignas(64) int8_t level[MAX_BLOCK];
    float scale[MAX_BLOCK / 16], offset[MAX_BLOCK / 32];
    for (int64_t n = n0; n < std::min(n1, out_features); ++n) {
        for (int64_t m0 = 0; m0 < rows; m0 += FLOAT_ROWS_AT_ONCE) {
            const int count = int(std::min<int64_t>(FLOAT_ROWS_AT_ONCE, rows - m0));
            VecF acc[FLOAT_ROWS_AT_ONCE];
            float offset_acc[FLOAT_ROWS_AT_ONCE];
            for (int r = 0; r < count; ++r) {
                acc[r] = zero();
                offset_acc[r] = 0.0f;
            }
            for (int64_t b = 0; b < blocks; ++b) {
                decode_block<TYPE>(block_at(weight, n, b, blocks, info.block_bytes), level, scale, offset);
                for (int r = 0; r < count; ++r) {
                    const float* xb = x + (m0 + r) * columns + b * BW;
                    for (int g = 0; g < BW / S; ++g) {
                        VecF part = zero();
                        for (int j = 0; j < S; j += W) part = fma(levels(level + g * S + j), load(xb + g * S + j), part);
                        acc[r] = fma(part, broadcast(scale[g]), acc[r]);
                    }
                    if (info.has_offsets) {
                        const float* s = sums + (m0 + r) * (columns / X_GROUP) + b * (BW / X_GROUP);
                        for (int g = 0; g < BW / X_GROUP; ++g) offset_acc[r] += offset[g] * s[g];
                    }
                }
            }
            for (int r = 0; r < count; ++r) y[(m0 + r) * out_features + n] = sum(acc[r]) + offset_acc[r];
        }
    }
}

void float_rows(int, const uint8_t* weight, int64_t columns, const float* x, const float* sums, int64_t rows,
                float* y, int64_t out_features, int64_t n0, int64_t n1) {
    float_rows_typed<Q5_K>(weight, columns, x, sums, rows, y, out_features, n0, n1);
}

void quantize_rows(const float* x, int64_t columns, uint8_t* high, uint8_t* low, float* xscale, float* xsum,
                   float* xsum_half, int64_t m0, int64_t m1, int bias) {
    const int64_t groups = columns / X_GROUP;
    // 8 bits: levels -127..127. 16 bits: levels -32385..32385 = 255 h + l with h and l
    // each in -127..127 (base 255 keeps -128 out: vpsignb cannot negate it), stored plus bias.
    const float top = low ? 32385.0f : 127.0f;
    for (int64_t m = m0; m < m1; ++m) {
        for (int64_t g = 0; g < groups; ++g) {
            const float* v = x + m * columns + g * X_GROUP;
            const int64_t at = m * columns + g * X_GROUP;
            int level_sum = 0, first_half = 0;
#if VARIANT == 2
            // The loop below in 16 lanes, with the same rounding (to nearest even, as
            // nearbyint; q / 255 is never a tie, 255 being odd).
            const __m512 part[2] = {_mm512_loadu_ps(v), _mm512_loadu_ps(v + 16)};
            const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(part[0]), _mm512_abs_ps(part[1])));
            const float step = largest / top, inverse = step > 0.0f ? 1.0f / step : 0.0f;
            const __m512i limit = _mm512_set1_epi32(int(top)), shift = _mm512_set1_epi32(bias);
            for (int half = 0; half < 2; ++half) {
                __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(part[half], _mm512_set1_ps(inverse)));
                q = _mm512_max_epi32(_mm512_min_epi32(q, limit), _mm512_sub_epi32(_mm512_setzero_si512(), limit));
                const int sum = _mm512_reduce_add_epi32(q);
                level_sum += sum;
                if (half == 0) first_half = sum;
                __m512i h = q;
                if (low) {
                    h = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(1.0f / 255.0f)));
                    const __m512i l = _mm512_sub_epi32(q, _mm512_sub_epi32(_mm512_slli_epi32(h, 8), h));
                    _mm_storeu_si128(reinterpret_cast<__m128i*>(low + at + 16 * half),
                                     _mm512_cvtepi32_epi8(_mm512_add_epi32(l, shift)));
                }
                _mm_storeu_si128(reinterpret_cast<__m128i*>(high + at + 16 * half),
                                 _mm512_cvtepi32_epi8(_mm512_add_epi32(h, shift)));
            }
#elif VARIANT == 1
            // As above in 8 lanes; the bytes leave through a small buffer (AVX2 has no vpmovdb).
            __m256 part[4], largest_v = _mm256_setzero_ps();
            const __m256 sign = _mm256_set1_ps(-0.0f);
            for (int i = 0; i < 4; ++i) {
                part[i] = _mm256_loadu_ps(v + 8 * i);
                largest_v = _mm256_max_ps(largest_v, _mm256_andnot_ps(sign, part[i]));
            }
            __m128 folded = _mm_max_ps(_mm256_castps256_ps128(largest_v), _mm256_extractf128_ps(largest_v, 1));
            folded = _mm_max_ps(folded, _mm_movehl_ps(folded, folded));
            const float largest = _mm_cvtss_f32(_mm_max_ss(folded, _mm_movehdup_ps(folded)));
            const float step = largest / top, inverse = step > 0.0f ? 1.0f / step : 0.0f;
            const __m256i limit = _mm256_set1_epi32(int(top));
            alignas(32) int32_t levels[X_GROUP], halves[X_GROUP];
            for (int i = 0; i < 4; ++i) {
                __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(part[i], _mm256_set1_ps(inverse)));
                q = _mm256_max_epi32(_mm256_min_epi32(q, limit), _mm256_sub_epi32(_mm256_setzero_si256(), limit));
                _mm256_store_si256(reinterpret_cast<__m256i*>(levels + 8 * i), q);
                if (low) {
                    const __m256i h = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(1.0f / 255.0f)));
                    _mm256_store_si256(reinterpret_cast<__m256i*>(halves + 8 * i), h);
                }
            }
            for (int j = 0; j < X_GROUP; ++j) {
                const int q = levels[j];
                level_sum += q;
                if (j == X_GROUP / 2 - 1) first_half = level_sum;
                if (low) {
                    high[at + j] = uint8_t(halves[j] + bias);
                    low[at + j] = uint8_t(q - 255 * halves[j] + bias);
                } else {
                    high[at + j] = uint8_t(q + bias);
                }
            }
#else
            float largest = 0.0f;
            for (int j = 0; j < X_GROUP; ++j) largest = std::max(largest, std::fabs(v[j]));
            const float step = largest / top, inverse = step > 0.0f ? 1.0f / step : 0.0f;
            for (int j = 0; j < X_GROUP; ++j) {
                const int q = int(std::min(top, std::max(-top, std::nearbyint(v[j] * inverse))));
                level_sum += q;
                if (j == X_GROUP / 2 - 1) first_half = level_sum;
                if (low) {
                    const int h = q >= 0 ? (q + 127) / 255 : -((127 - q) / 255);  // q / 255, rounded
                    high[at + j] = uint8_t(h + bias);
                    low[at + j] = uint8_t(q - 255 * h + bias);
                } else {
                    high[at + j] = uint8_t(q + bias);
                }
            }
#endif
            xscale[m * groups + g] = step;
            // The sum of the rounded values, not of x: a weight d q + m then sees one rounded
            // x in both terms, whose errors cancel as the weight's own are small (m is near
            // -8 d in 4-bit blocks; with the exact sum the error would scale with d q).
            xsum[m * groups + g] = step * float(level_sum);
            xsum_half[m * groups + g] = step * float(first_half);
        }
    }
}

// ---- the interleaved tile of one panel ---------------------------------------------------
struct Panel {
    int8_t* level;    // [groups][S/4][PANEL][4]
    int32_t* start;   // [groups][PANEL]: -128 * the group's level sum (unsigned activations)
    float* scale;     // [groups][PANEL]
    float* offset;    // [columns/32][PANEL]
};

inline Panel carve(uint8_t* scratch, int64_t columns, int S) {
    const int64_t groups = columns / S;
    Panel p;
    p.level = reinterpret_cast<int8_t*>(scratch);
    p.start = reinterpret_cast<int32_t*>(scratch + columns * PANEL);
    p.scale = reinterpret_cast<float*>(p.start + groups * PANEL);
    p.offset = p.scale + groups * PANEL;
    return p;
}

#if VARIANT == 2
// A whole panel for AVX-512: the 16 rows' levels of a block are decoded side by side, then
// each 4-column slice of all 16 rows is one gather (and one vpdpbusd adds up the levels).
template <int TYPE>
void unpack_full_panel(const uint8_t* weight, int64_t columns, int64_t first_row, const Panel& p) {
    constexpr TypeInfo info = type_info(TYPE);
    constexpr int S = info.scale_group, BW = info.block_weights;
    const int64_t blocks = columns / BW;
    alignas(64) int8_t level[PANEL][BW];
    float scale[PANEL][BW / 16], offset[PANEL][BW / 32];
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(BW));
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t b = 0; b < blocks; ++b) {
        for (int r = 0; r < PANEL; ++r)
            decode_block<TYPE>(block_at(weight, first_row + r, b, blocks, info.block_bytes), level[r], scale[r], offset[r]);
        for (int gb = 0; gb < BW / S; ++gb) {
            const int64_t g = b * (BW / S) + gb;
            __m512i total = _mm512_setzero_si512();
            for (int k = 0; k < S / 4; ++k) {
                const __m512i slice = _mm512_i32gather_epi32(rows, &level[0][gb * S + 4 * k], 1);
                _mm512_storeu_si512(p.level + (g * (S / 4) + k) * 4 * PANEL, slice);
                total = _mm512_dpbusd_epi32(total, ones, slice);
            }
            _mm512_storeu_si512(p.start + g * PANEL, _mm512_mullo_epi32(total, _mm512_set1_epi32(-128)));
            for (int r = 0; r < PANEL; ++r) p.scale[g * PANEL + r] = scale[r][gb];
        }
        if (info.has_offsets)
            for (int g = 0; g < BW / X_GROUP; ++g)
                for (int r = 0; r < PANEL; ++r) p.offset[(b * (BW / X_GROUP) + g) * PANEL + r] = offset[r][g];
    }
}
#endif

template <int TYPE>
void unpack_panel(const uint8_t* weight, int64_t columns, int64_t first_row, int count, const Panel& p) {
    const TypeInfo info = type_info(TYPE);
    const int S = info.scale_group, BW = info.block_weights;
    const int64_t blocks = columns / BW, groups = columns / S;
#if VARIANT == 2
    if (count == PANEL) return unpack_full_panel<TYPE>(weight, columns, first_row, p);
#endif
    alignas(64) int8_t level[MAX_BLOCK];
    float scale[MAX_BLOCK / 16], offset[MAX_BLOCK / 32];
    for (int r = 0; r < PANEL; ++r) {
        if (r >= count) {  // rows past the matrix's end: zero weights
            for (int64_t g = 0; g < groups; ++g) {
                for (int k = 0; k < S / 4; ++k) std::memset(p.level + ((g * (S / 4) + k) * PANEL + r) * 4, 0, 4);
                p.start[g * PANEL + r] = 0;
                p.scale[g * PANEL + r] = 0.0f;
            }
            if (info.has_offsets)
                for (int64_t g = 0; g < columns / X_GROUP; ++g) p.offset[g * PANEL + r] = 0.0f;
            continue;
        }
        for (int64_t b = 0; b < blocks; ++b) {
            decode_block<TYPE>(block_at(weight, first_row + r, b, blocks, info.block_bytes), level, scale, offset);
            for (int gb = 0; gb < BW / S; ++gb) {
                const int64_t g = b * (BW / S) + gb;
                int total = 0;
                for (int k = 0; k < S / 4; ++k) {
                    const int8_t* four = level + gb * S + 4 * k;
                    std::memcpy(p.level + ((g * (S / 4) + k) * PANEL + r) * 4, four, 4);
                    total += four[0] + four[1] + four[2] + four[3];
                }
                p.start[g * PANEL + r] = -128 * total;
                p.scale[g * PANEL + r] = scale[gb];
            }
            if (info.has_offsets)
                for (int g = 0; g < BW / X_GROUP; ++g) p.offset[(b * (BW / X_GROUP) + g) * PANEL + r] = offset[g];
        }
    }
}

// R token rows against one panel: out[r][0..16) for rows m..m+R. TWO: 16-bit activations
// (each group's dot product is 255 * the high halves' + the low halves').
template <int R, int S, bool OFFSETS, bool TWO>
void panel_rows(const Panel& p, const QuantizedRows& xq, int64_t m, float* out) {
    const int64_t columns = xq.columns, groups = columns / S, x_groups = columns / X_GROUP;
    constexpr int PLANES = TWO ? 2 : 1;
    const uint8_t* xu[PLANES][R];
    const float* xscale[R];
    for (int r = 0; r < R; ++r) {
        xu[0][r] = xq.high + (m + r) * columns;
        if (TWO) xu[PLANES - 1][r] = xq.low + (m + r) * columns;
        xscale[r] = xq.xscale + (m + r) * x_groups;
    }
    auto four_bytes = [](const uint8_t* p) {
        int32_t four;
        std::memcpy(&four, p, 4);
        return four;
    };
#if VARIANT == 2
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        const __m512i start = _mm512_loadu_si512(p.start + g * PANEL);
        __m512i dot[PLANES][R];
        for (int plane = 0; plane < PLANES; ++plane)
            for (int r = 0; r < R; ++r) dot[plane][r] = start;
        const int8_t* w = p.level + g * S * PANEL;
        for (int k = 0; k < S / 4; ++k) {
            const __m512i weights = _mm512_loadu_si512(w + k * 4 * PANEL);
            for (int plane = 0; plane < PLANES; ++plane)
                for (int r = 0; r < R; ++r)
                    dot[plane][r] = _mm512_dpbusd_epi32(
                        dot[plane][r], _mm512_set1_epi32(four_bytes(xu[plane][r] + g * S + 4 * k)), weights);
        }
        const __m512 scale = _mm512_loadu_ps(p.scale + g * PANEL);
        for (int r = 0; r < R; ++r) {
            const __m512i total =
                TWO ? _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(dot[0][r], 8), dot[0][r]), dot[PLANES - 1][r])
                    : dot[0][r];
            const __m512 both = _mm512_mul_ps(scale, _mm512_set1_ps(xscale[r][g * S / X_GROUP]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), both, acc[r]);
        }
    }
    if (OFFSETS) {
        for (int64_t g = 0; g < x_groups; ++g) {
            const __m512 offset = _mm512_loadu_ps(p.offset + g * PANEL);
            for (int r = 0; r < R; ++r)
                acc[r] = _mm512_fmadd_ps(offset, _mm512_set1_ps(xq.xsum[(m + r) * x_groups + g]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * PANEL, acc[r]);
#elif VARIANT == 1
    // vpmaddubsw adds pairs of unsigned x signed byte products into saturating 16 bits:
    // safe for Q5_K's levels (up to 31) with x + 128 (255 * 31 * 2 < 32768).
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m256i dot[PLANES][R][2];
        for (int h = 0; h < 2; ++h) {
            const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.start + g * PANEL + 8 * h));
            for (int plane = 0; plane < PLANES; ++plane)
                for (int r = 0; r < R; ++r) dot[plane][r][h] = start;
        }
        const int8_t* w = p.level + g * S * PANEL;
        for (int k = 0; k < S / 4; ++k) {
            for (int h = 0; h < 2; ++h) {
                const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * 4 * PANEL + 32 * h));
                for (int plane = 0; plane < PLANES; ++plane) {
                    for (int r = 0; r < R; ++r) {
                        const __m256i xv = _mm256_set1_epi32(four_bytes(xu[plane][r] + g * S + 4 * k));
                        const __m256i pairs = _mm256_maddubs_epi16(xv, weights);
                        dot[plane][r][h] = _mm256_add_epi32(dot[plane][r][h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
        }
        for (int h = 0; h < 2; ++h) {
            const __m256 scale = _mm256_loadu_ps(p.scale + g * PANEL + 8 * h);
            for (int r = 0; r < R; ++r) {
                const __m256i total = TWO ? _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(dot[0][r][h], 8), dot[0][r][h]),
                                                             dot[PLANES - 1][r][h])
                                          : dot[0][r][h];
                const __m256 both = _mm256_mul_ps(scale, _mm256_set1_ps(xscale[r][g * S / X_GROUP]));
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), both, acc[r][h]);
            }
        }
    }
    if (OFFSETS) {
        for (int64_t g = 0; g < x_groups; ++g) {
            for (int h = 0; h < 2; ++h) {
                const __m256 offset = _mm256_loadu_ps(p.offset + g * PANEL + 8 * h);
                for (int r = 0; r < R; ++r)
                    acc[r][h] = _mm256_fmadd_ps(offset, _mm256_set1_ps(xq.xsum[(m + r) * x_groups + g]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + r * PANEL + 8 * h, acc[r][h]);
#else
    (void)four_bytes;
    for (int r = 0; r < R; ++r) {
        for (int n = 0; n < PANEL; ++n) {
            float total = 0.0f;
            for (int64_t g = 0; g < groups; ++g) {
                int32_t dot[PLANES];
                for (int plane = 0; plane < PLANES; ++plane) {
                    dot[plane] = p.start[g * PANEL + n];
                    for (int k = 0; k < S / 4; ++k)
                        for (int b = 0; b < 4; ++b)
                            dot[plane] += int32_t(xu[plane][r][g * S + 4 * k + b]) *
                                          p.level[((g * (S / 4) + k) * PANEL + n) * 4 + b];
                }
                const int32_t combined = TWO ? dot[0] * 255 + dot[PLANES - 1] : dot[0];
                total += float(combined) * (p.scale[g * PANEL + n] * xscale[r][g * S / X_GROUP]);
            }
            if (OFFSETS)
                for (int64_t g = 0; g < x_groups; ++g)
                    total += p.offset[g * PANEL + n] * xq.xsum[(m + r) * x_groups + g];
            out[r * PANEL + n] = total;
        }
    }
#endif
}

// Token rows 0..rows in runs of R, the rest one at a time: body(m, run) with run an
// std::integral_constant holding the run's length.
template <int R, typename Body>
void token_runs(int64_t rows, Body body) {
    int64_t m = 0;
    for (; m + R <= rows; m += R) body(m, std::integral_constant<int, R>{});
    for (; m < rows; ++m) body(m, std::integral_constant<int, 1>{});
}

// Calls f(std::true_type) for 16-bit activations (two planes), f(std::false_type) for 8.
template <typename F>
void by_planes(const QuantizedRows& xq, F f) {
    if (xq.low)
        f(std::true_type{});
    else
        f(std::false_type{});
}

constexpr int ROWS_AT_ONCE = per_variant(6, 2, 1);  // token rows a panel's products run at once

template <int TYPE, bool TWO>
void int8_panels_typed(const uint8_t* weight, int64_t columns, const QuantizedRows& xq, float* y,
                       int64_t out_features, int64_t p0, int64_t p1, uint8_t* scratch) {
    constexpr TypeInfo info = type_info(TYPE);
    constexpr int S = info.scale_group;
    const Panel p = carve(scratch, columns, S);
    alignas(64) float out[ROWS_AT_ONCE * PANEL];
    for (int64_t panel = p0; panel < p1; ++panel) {
        const int64_t first = panel * PANEL;
        const int count = int(std::min<int64_t>(PANEL, out_features - first));
        unpack_panel<TYPE>(weight, columns, first, count, p);
        token_runs<ROWS_AT_ONCE>(xq.rows, [&](int64_t m, auto run) {
            panel_rows<decltype(run)::value, S, info.has_offsets, TWO>(p, xq, m, out);
            for (int r = 0; r < decltype(run)::value; ++r)
                std::memcpy(y + (m + r) * out_features + first, out + r * PANEL, count * sizeof(float));
        });
    }
}

template <int TYPE>
void int8_panels_typed(const uint8_t* weight, int64_t columns, const QuantizedRows& xq, float* y,
                       int64_t out_features, int64_t p0, int64_t p1, uint8_t* scratch) {
    by_planes(xq, [&](auto two) {
        int8_panels_typed<TYPE, decltype(two)::value>(weight, columns, xq, y, out_features, p0, p1, scratch);
    });
}

void int8_panels(int, const uint8_t* weight, int64_t columns, const QuantizedRows& xq, float* y,
                 int64_t out_features, int64_t p0, int64_t p1, uint8_t* scratch) {
    int8_panels_typed<Q5_K>(weight, columns, xq, y, out_features, p0, p1, scratch);
}

}  // namespace VARIANT_NAMESPACE
}  // namespace llama_chat_kernels

#include "tiles_impl.h"

namespace llama_chat_kernels {

const KernelSet& KERNEL_SET_FUNCTION() {
#if defined(AMX_TILES)
    static const KernelSet set{VARIANT_NAMESPACE::float_rows, VARIANT_NAMESPACE::quantize_rows,
                               VARIANT_NAMESPACE::int8_panels, VARIANT_NAMESPACE::tile_rows,
                               VARIANT_NAMESPACE::pack_split, VARIANT_NAMESPACE::split_tile_rows};
#else
    static const KernelSet set{VARIANT_NAMESPACE::float_rows, VARIANT_NAMESPACE::quantize_rows,
                               VARIANT_NAMESPACE::int8_panels, VARIANT_NAMESPACE::tile_rows, nullptr, nullptr};
#endif
    return set;
}

}  // namespace llama_chat_kernels
