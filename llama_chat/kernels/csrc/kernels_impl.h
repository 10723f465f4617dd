// What every instruction-set variant's matrix kernels share, written once and compiled once
// per instruction set: a variant's file sets VARIANT (0 portable, 1 AVX2, 2 AVX-512 with
// VNNI) and its target, then includes this. Here: float vectors (attention_impl.h builds on
// them), quantize_rows (activations in groups of 32, to int8 as ggml's Q8_0 or to 16 bits
// carried as two int8 halves, each half one pass of the same byte products), and the loops
// over token runs; tiles_impl.h holds the matrix kernels themselves.
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
inline VecF fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum(VecF v) { return _mm512_reduce_add_ps(v); }
#elif VARIANT == 1
constexpr int W = 8;
using VecF = __m256;
inline VecF zero() { return _mm256_setzero_ps(); }
inline VecF load(const float* p) { return _mm256_loadu_ps(p); }
inline VecF broadcast(float v) { return _mm256_set1_ps(v); }
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
inline VecF fma(VecF a, VecF b, VecF c) { return a * b + c; }
inline float sum(VecF v) { return v; }
#endif

// A constant whose value depends on the variant (how many vectors its registers hold).
constexpr int per_variant(int avx512, int avx2, int portable) {
    return VARIANT == 2 ? avx512 : VARIANT == 1 ? avx2 : portable;
}

void quantize_rows(const float* x, int64_t columns, uint8_t* high, uint8_t* low, float* xscale, float* xsum,
                   float* xsum_half, int64_t m0, int64_t m1) {
    const int64_t groups = columns / X_GROUP;
    // 8 bits: levels -127..127. 16 bits: levels -32385..32385 = 255 h + l with h and l
    // each in -127..127 (base 255 keeps -128 out: vpsignb cannot negate it).
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
            const __m512i limit = _mm512_set1_epi32(int(top));
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
                                     _mm512_cvtepi32_epi8(l));
                }
                _mm_storeu_si128(reinterpret_cast<__m128i*>(high + at + 16 * half),
                                 _mm512_cvtepi32_epi8(h));
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
                    high[at + j] = uint8_t(halves[j]);
                    low[at + j] = uint8_t(q - 255 * halves[j]);
                } else {
                    high[at + j] = uint8_t(q);
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
                    high[at + j] = uint8_t(h);
                    low[at + j] = uint8_t(q - 255 * h);
                } else {
                    high[at + j] = uint8_t(q);
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

}  // namespace VARIANT_NAMESPACE
}  // namespace llama_chat_kernels

#include "tiles_impl.h"

namespace llama_chat_kernels {

const KernelSet& KERNEL_SET_FUNCTION() {
#if defined(AMX_TILES)
    static const KernelSet set{VARIANT_NAMESPACE::quantize_rows, VARIANT_NAMESPACE::tile_rows,
                               VARIANT_NAMESPACE::pack_split, VARIANT_NAMESPACE::split_tile_rows};
#else
    static const KernelSet set{VARIANT_NAMESPACE::quantize_rows, VARIANT_NAMESPACE::tile_rows, nullptr, nullptr};
#endif
    return set;
}

}  // namespace llama_chat_kernels
