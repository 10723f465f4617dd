// Attention over the KV cache (attention.h), written once and compiled per instruction
// set: a variant's file includes this after kernels_impl.h (whose float vectors, W lanes
// of VecF, it uses) and names ATTENTION_SET_FUNCTION.
//
// A span is read a block of positions at a time: the block's keys, converted to float32
// once, meet every row's query; then each row's running softmax takes the block (the
// maximum raised if need be, what was summed so far scaled down to it) and its values,
// also converted once, are added in weighted by e^(score - maximum). The softmax is
// float32 throughout, whatever the cache holds.
#include "attention.h"

namespace llama_chat_kernels {
namespace VARIANT_NAMESPACE {
namespace attention {

constexpr int BLOCK = 32;  // positions converted and scored at a time (a multiple of every W)
constexpr float NEGATIVE_INFINITY = -INFINITY;
// Below this, e^x is 0 here: 2^-126, the smallest normal float, is e^-87.3.
constexpr float EXP_LOWEST = -87.0f;

inline float bfloat16_to_float(uint16_t bits) {
    const uint32_t widened = uint32_t(bits) << 16;
    float value;
    std::memcpy(&value, &widened, 4);
    return value;
}

#if VARIANT == 2
inline void store(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF add(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF maximum(VecF a, VecF b) { return _mm512_max_ps(a, b); }
inline float largest(VecF v) { return _mm512_reduce_max_ps(v); }
inline VecF load_float16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline VecF load_bfloat16(const uint16_t* p) {
    const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}
inline VecF round_to_integer(VecF v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VecF power_of_two(VecF whole) {  // 2^whole for whole in -126..0, through the exponent bits
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(whole), _mm512_set1_epi32(127)), 23));
}
// The sums of four vectors, into out[4]: one tree for the four (about a third of the
// instructions of four sums one by one), as every dot product of a key ends in one.
inline void sum4(VecF a0, VecF a1, VecF a2, VecF a3, float* out) {
    const __m512 pairs01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 pairs23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(pairs01, pairs23, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_ps(pairs01, pairs23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(lanes),
                                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1)));
}
inline VecF zero_below(VecF x, VecF value, float lowest) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, broadcast(lowest), _CMP_GE_OQ), value);
}
#elif VARIANT == 1
inline void store(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF add(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF maximum(VecF a, VecF b) { return _mm256_max_ps(a, b); }
inline float largest(VecF v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
inline VecF load_float16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VecF load_bfloat16(const uint16_t* p) {
    const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
}
inline VecF round_to_integer(VecF v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VecF power_of_two(VecF whole) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127)), 23));
}
inline void sum4(VecF a0, VecF a1, VecF a2, VecF a3, float* out) {
    const __m256 lanes = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1)));
}
inline VecF zero_below(VecF x, VecF value, float lowest) {
    return _mm256_and_ps(_mm256_cmp_ps(x, broadcast(lowest), _CMP_GE_OQ), value);
}
#else
inline void store(float* p, VecF v) { *p = v; }
inline VecF add(VecF a, VecF b) { return a + b; }
inline VecF mul(VecF a, VecF b) { return a * b; }
inline VecF maximum(VecF a, VecF b) { return std::max(a, b); }
inline float largest(VecF v) { return v; }
inline VecF load_float16(const uint16_t* p) { return half_to_float(reinterpret_cast<const uint8_t*>(p)); }
inline VecF load_bfloat16(const uint16_t* p) { return bfloat16_to_float(*p); }
inline void sum4(VecF a0, VecF a1, VecF a2, VecF a3, float* out) {
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}
#endif

// e^x for x <= 0 (and -inf), as 2^n e^r with n whole and |r| <= ln(2) / 2: a degree-6
// polynomial for e^r (the one of Cephes' expf, within 2 ulp), the exponent bits for 2^n.
inline VecF exp_nonpositive(VecF x) {
#if VARIANT == 0
    return std::exp(x);
#else
    const VecF clamped = maximum(x, broadcast(EXP_LOWEST));
    const VecF whole = round_to_integer(mul(clamped, broadcast(1.44269504088896341f)));
    // r = x - n ln 2, with ln 2 in two parts so that n ln 2 is exact in its first.
    VecF r = fma(whole, broadcast(-0.693359375f), clamped);
    r = fma(whole, broadcast(2.12194440e-4f), r);
    VecF p = broadcast(1.9875691500e-4f);
    p = fma(p, r, broadcast(1.3981999507e-3f));
    p = fma(p, r, broadcast(8.3334519073e-3f));
    p = fma(p, r, broadcast(4.1665795894e-2f));
    p = fma(p, r, broadcast(1.6666665459e-1f));
    p = fma(p, r, broadcast(5.0000001201e-1f));
    const VecF e_r = add(fma(mul(p, r), r, r), broadcast(1.0f));
    return zero_below(x, mul(e_r, power_of_two(whole)), EXP_LOWEST);
#endif
}

// `count` positions of a cache (position stride `stride` elements) as float32 rows of
// head_dim, one after another in out.
void to_float32(const void* source, int type, int64_t stride, int64_t count, int64_t head_dim, float* out) {
    for (int64_t j = 0; j < count; ++j) {
        const uint16_t* row = static_cast<const uint16_t*>(source) + j * stride;
        float* into = out + j * head_dim;
        int64_t d = 0;
        if (type == CACHE_FLOAT16) {
            for (; d + W <= head_dim; d += W) store(into + d, load_float16(row + d));
            for (; d < head_dim; ++d) into[d] = half_to_float(reinterpret_cast<const uint8_t*>(row + d));
        } else {
            for (; d + W <= head_dim; d += W) store(into + d, load_bfloat16(row + d));
            for (; d < head_dim; ++d) into[d] = bfloat16_to_float(row[d]);
        }
    }
}

// A score capped to softcap * tanh(score / softcap), where softcap is set (Gemma 2).
inline float capped(float score, float softcap) { return softcap > 0.0f ? softcap * std::tanh(score / softcap) : score; }

// scores[j] = q . key j * scale (capped) + bias[j] for j < visible: four keys at a time, each
// a chain of its own, so a load of q serves four.
void score(const float* q, const float* keys, int64_t key_stride, int64_t visible, int64_t head_dim, float scale,
           float softcap, const float* bias, float* scores) {
    int64_t j = 0;
    for (; j + 4 <= visible; j += 4) {
        const float* k = keys + j * key_stride;
        VecF a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
        int64_t d = 0;
        for (; d + W <= head_dim; d += W) {
            const VecF qv = load(q + d);
            a0 = fma(qv, load(k + d), a0);
            a1 = fma(qv, load(k + key_stride + d), a1);
            a2 = fma(qv, load(k + 2 * key_stride + d), a2);
            a3 = fma(qv, load(k + 3 * key_stride + d), a3);
        }
        float s[4];
        sum4(a0, a1, a2, a3, s);
        for (; d < head_dim; ++d)
            for (int i = 0; i < 4; ++i) s[i] += q[d] * k[i * key_stride + d];
        for (int i = 0; i < 4; ++i) scores[j + i] = capped(s[i] * scale, softcap) + (bias ? bias[j + i] : 0.0f);
    }
    for (; j < visible; ++j) {
        const float* k = keys + j * key_stride;
        VecF a = zero();
        int64_t d = 0;
        for (; d + W <= head_dim; d += W) a = fma(load(q + d), load(k + d), a);
        float s = sum(a);
        for (; d < head_dim; ++d) s += q[d] * k[d];
        scores[j] = capped(s * scale, softcap) + (bias ? bias[j] : 0.0f);
    }
}

// One row's running softmax takes a block: scores[BLOCK] (-inf past the block's
// positions and where they are hidden) and their values.
void take_block(float* state, float* scores, const float* values, int64_t value_stride, int64_t count,
                int64_t head_dim) {
    VecF top = broadcast(NEGATIVE_INFINITY);
    for (int j = 0; j < BLOCK; j += W) top = maximum(top, load(scores + j));
    const float block_maximum = largest(top);
    if (block_maximum == NEGATIVE_INFINITY) return;  // nothing visible in this block: the state stands
    const float old_maximum = state[0], new_maximum = std::max(old_maximum, block_maximum);
    VecF total = zero();
    for (int j = 0; j < BLOCK; j += W) {
        const VecF weight = exp_nonpositive(add(load(scores + j), broadcast(-new_maximum)));
        store(scores + j, weight);
        total = add(total, weight);
    }
    const float rescale = std::exp(old_maximum - new_maximum);  // 0 for the first visible block
    state[0] = new_maximum;
    state[1] = state[1] * rescale + sum(total);
    float* accumulated = state + 2;
    int64_t d = 0;
    for (; d + 4 * W <= head_dim; d += 4 * W) {  // four vectors of the row at a time, four chains
        VecF a0 = mul(load(accumulated + d), broadcast(rescale)), a1 = mul(load(accumulated + d + W), broadcast(rescale));
        VecF a2 = mul(load(accumulated + d + 2 * W), broadcast(rescale));
        VecF a3 = mul(load(accumulated + d + 3 * W), broadcast(rescale));
        for (int64_t j = 0; j < count; ++j) {
            const VecF weight = broadcast(scores[j]);
            const float* v = values + j * value_stride + d;
            a0 = fma(weight, load(v), a0);
            a1 = fma(weight, load(v + W), a1);
            a2 = fma(weight, load(v + 2 * W), a2);
            a3 = fma(weight, load(v + 3 * W), a3);
        }
        store(accumulated + d, a0);
        store(accumulated + d + W, a1);
        store(accumulated + d + 2 * W, a2);
        store(accumulated + d + 3 * W, a3);
    }
    for (; d + W <= head_dim; d += W) {
        VecF a = mul(load(accumulated + d), broadcast(rescale));
        for (int64_t j = 0; j < count; ++j) a = fma(broadcast(scores[j]), load(values + j * value_stride + d), a);
        store(accumulated + d, a);
    }
    for (; d < head_dim; ++d) {
        float a = accumulated[d] * rescale;
        for (int64_t j = 0; j < count; ++j) a += scores[j] * values[j * value_stride + d];
        accumulated[d] = a;
    }
}

// Whether the bias hides positions first..first + count from every token of the rows.
bool hidden_from_all(const QueryRows& rows, const KeyValueSpan& span, int64_t first, int64_t count) {
    for (int64_t t = 0; t < rows.tokens; ++t) {
        const float* bias = span.bias + (rows.first_token + t) * span.bias_stride + first;
        for (int64_t j = 0; j < count; ++j)
            if (bias[j] != NEGATIVE_INFINITY) return false;
        if (span.bias_stride == 0) break;  // one row of biases for every token
    }
    return true;
}

void attend_span(const QueryRows& rows, const KeyValueSpan& span, float* state) {
    const int64_t head_dim = rows.head_dim, row_count = rows.tokens * rows.n_rep;
    const int64_t state_size = state_floats(head_dim);
    if (span.count == 0 || row_count == 0) return;
    // float32 caches are read where they lie; others are converted a block at a time.
    const bool converted = span.type != CACHE_FLOAT32;
    std::unique_ptr<float[]> buffer(new float[row_count * BLOCK + (converted ? 2 * BLOCK * head_dim : 0)]);
    float* scores = buffer.get();
    float* key_block = scores + row_count * BLOCK;
    float* value_block = key_block + BLOCK * head_dim;
    const int64_t element_bytes = span.type == CACHE_FLOAT32 ? 4 : 2;
    for (int64_t first = 0; first < span.count; first += BLOCK) {
        const int64_t count = std::min<int64_t>(BLOCK, span.count - first);
        if (span.bias && hidden_from_all(rows, span, first, count)) continue;  // a ring's empty or old slots
        const char* key_source = static_cast<const char*>(span.keys) + first * span.key_stride * element_bytes;
        const char* value_source = static_cast<const char*>(span.values) + first * span.value_stride * element_bytes;
        const float* keys = reinterpret_cast<const float*>(key_source);
        const float* values = reinterpret_cast<const float*>(value_source);
        const int64_t key_stride = converted ? head_dim : span.key_stride;
        const int64_t value_stride = converted ? head_dim : span.value_stride;
        if (converted) {
            to_float32(key_source, span.type, span.key_stride, count, head_dim, key_block);
            keys = key_block;
        }
        for (int64_t t = 0; t < rows.tokens; ++t) {
            // Among the new tokens, token t sees itself and those before it (within the window).
            const int64_t token = rows.first_token + t;
            const int64_t visible = span.causal ? std::clamp<int64_t>(token + 1 - first, 0, count) : count;
            const int64_t hidden = span.causal && span.window ? std::clamp<int64_t>(token + 1 - span.window - first, 0, visible)
                                                              : 0;
            const float* bias = span.bias ? span.bias + token * span.bias_stride + first : nullptr;
            // A token whose bias hides the whole block scores none of it.
            const bool skipped = bias && std::all_of(bias, bias + visible, [](float b) { return b == NEGATIVE_INFINITY; });
            for (int64_t r = 0; r < rows.n_rep; ++r) {
                float* row_scores = scores + (t * rows.n_rep + r) * BLOCK;
                if (!skipped)
                    score(rows.q + t * rows.token_stride + r * head_dim, keys, key_stride, visible, head_dim,
                          rows.scale, rows.softcap, bias, row_scores);
                std::fill(row_scores, row_scores + (skipped ? visible : hidden), NEGATIVE_INFINITY);
                std::fill(row_scores + visible, row_scores + BLOCK, NEGATIVE_INFINITY);
            }
        }
        if (converted) {
            to_float32(value_source, span.type, span.value_stride, count, head_dim, value_block);
            values = value_block;
        }
        for (int64_t row = 0; row < row_count; ++row)
            take_block(state + row * state_size, scores + row * BLOCK, values, value_stride, count, head_dim);
    }
}

}  // namespace attention
}  // namespace VARIANT_NAMESPACE

const AttentionKernels& ATTENTION_SET_FUNCTION() {
    static const AttentionKernels set{VARIANT_NAMESPACE::attention::attend_span};
    return set;
}

}  // namespace llama_chat_kernels
