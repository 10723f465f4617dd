// Attention over the KV cache (attention.h), written once and compiled per instruction
// set: a variant's file includes this after kernels_impl.h (whose float vectors, W lanes
// of VecF, it uses) and names ATTENTION_SET_FUNCTION.
//
// A span is read a block of positions at a time: the block's keys, converted to float32
// and transposed once, meet the rows' queries several rows at a time; then each row's running softmax takes the block (the
// maximum raised if need be, what was summed so far scaled down to it) and its values,
// also converted once, are added in weighted by e^(score - maximum). The softmax is
// float32 throughout, whatever the cache holds.
#include "attention.h"

namespace llama_chat_kernels {
namespace VARIANT_NAMESPACE {
namespace attention {

constexpr int BLOCK = 32;  // positions converted and scored at a time (a multiple of every W)
constexpr int LANES = BLOCK / W;  // vectors of a block's scores
// Rows taken together, as many as keep their sums in registers: scoring, a block's scores
// of each (LANES vectors a row); weighing values, 4 vectors of each row's sum.
constexpr int SCORE_ROWS = W == 16 ? 8 : W == 8 ? 2 : 1;
constexpr int VALUE_ROWS = W == 16 ? 4 : W == 8 ? 2 : 1;
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

inline float cache_value(const void* source, int type, int64_t at) {
    const uint16_t* halves = static_cast<const uint16_t*>(source);
    switch (type) {
        case CACHE_FLOAT32: return static_cast<const float*>(source)[at];
        case CACHE_FLOAT16: return half_to_float(reinterpret_cast<const uint8_t*>(halves + at));
        default: return bfloat16_to_float(halves[at]);
    }
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
        } else if (type == CACHE_BFLOAT16) {
            for (; d + W <= head_dim; d += W) store(into + d, load_bfloat16(row + d));
        }
        for (; d < head_dim; ++d) into[d] = cache_value(source, type, j * stride + d);
    }
}

// A block's `count` rows (keys or values, `stride` elements apart) as float32: where they
// lie in a float32 cache, else converted into `buffer` (and stride becomes head_dim).
inline const float* block_rows(const void* source, int type, int64_t count, int64_t head_dim, float* buffer,
                               int64_t& stride) {
    if (type == CACHE_FLOAT32) return static_cast<const float*>(source);
    to_float32(source, type, stride, count, head_dim, buffer);
    stride = head_dim;
    return buffer;
}

// `count` keys as float32 columns: out[d * BLOCK + j] is key j's feature d, zeros past count,
// so that a row's scores over the block are sums of its features times whole vectors.
void keys_transposed(const void* source, int type, int64_t stride, int64_t count, int64_t head_dim, float* out) {
    for (int64_t d = 0; d < head_dim; ++d) {
        float* column = out + d * BLOCK;
        for (int64_t j = 0; j < count; ++j) column[j] = cache_value(source, type, j * stride + d);
        std::fill(column + count, column + BLOCK, 0.0f);
    }
}

// A score capped to softcap * tanh(score / softcap), where softcap is set (Gemma 2).
inline float capped(float score, float softcap) { return softcap > 0.0f ? softcap * std::tanh(score / softcap) : score; }

// One row's dot products with a block's `count` keys (rows of key_stride) into scores:
// four keys at a time, each a chain of its own, so that a load of q serves four. The
// arrangement of a step of up to 32 tokens (a single token's, a verify step's), whose few
// rows would not pay for transposing the keys.
void row_dot_products(const float* q, const float* keys, int64_t key_stride, int64_t count, int64_t head_dim,
                      float* scores) {
    int64_t j = 0;
    for (; j + 4 <= count; j += 4) {
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
        sum4(a0, a1, a2, a3, scores + j);
        for (; d < head_dim; ++d)
            for (int i = 0; i < 4; ++i) scores[j + i] += q[d] * k[i * key_stride + d];
    }
    for (; j < count; ++j) {
        const float* k = keys + j * key_stride;
        VecF a = zero();
        int64_t d = 0;
        for (; d + W <= head_dim; d += W) a = fma(load(q + d), load(k + d), a);
        float total = sum(a);
        for (; d < head_dim; ++d) total += q[d] * k[d];
        scores[j] = total;
    }
}

// The dot products of `count` rows' queries (count <= SCORE_ROWS) with a block's keys
// (transposed), into scores[r * BLOCK ..]: a prompt chunk's many rows. Each row's and key's
// sum runs along the features in one chain, whatever rows share the call.
void dot_products(const float* const* q, int count, const float* keys_t, int64_t head_dim, float* scores) {
    VecF sums[SCORE_ROWS][LANES];
    for (int r = 0; r < SCORE_ROWS; ++r)
        for (int v = 0; v < LANES; ++v) sums[r][v] = zero();
    for (int64_t d = 0; d < head_dim; ++d) {
        VecF key[LANES];
        for (int v = 0; v < LANES; ++v) key[v] = load(keys_t + d * BLOCK + v * W);
        for (int r = 0; r < SCORE_ROWS; ++r) {
            if (r >= count) break;
            const VecF feature = broadcast(q[r][d]);
            for (int v = 0; v < LANES; ++v) sums[r][v] = fma(feature, key[v], sums[r][v]);
        }
    }
    for (int r = 0; r < count; ++r)
        for (int v = 0; v < LANES; ++v) store(scores + r * BLOCK + v * W, sums[r][v]);
}

// What token t of the rows sees of the block at `first` (`count` positions).
struct TokenView {
    int64_t visible;     // positions 0..visible - 1 of the block: itself and those before it
    int64_t hidden;      // of those, the first `hidden` lie before its window
    const float* bias;   // its biases for the block's positions, or null
    bool skipped;        // its bias hides every visible position
};

inline TokenView token_view(const QueryRows& rows, const KeyValueSpan& span, int64_t first, int64_t count, int64_t t) {
    const int64_t token = rows.first_token + t;
    const int64_t visible = span.causal ? std::clamp<int64_t>(token + 1 - first, 0, count) : count;
    const int64_t hidden =
        span.causal && span.window ? std::clamp<int64_t>(token + 1 - span.window - first, 0, visible) : 0;
    const float* bias = span.bias ? span.bias + token * span.bias_stride + first : nullptr;
    const bool skipped = bias && std::all_of(bias, bias + visible, [](float b) { return b == NEGATIVE_INFINITY; });
    return {visible, hidden, bias, skipped};
}

// A row's dot products made scores: scaled, capped, biased for the visible positions, -inf
// for the hidden ones and from `visible` on (and all, where the token's block is skipped).
void finish_scores(float* scores, const TokenView& view, float scale, float softcap) {
    if (view.skipped) {
        std::fill(scores, scores + BLOCK, NEGATIVE_INFINITY);
        return;
    }
    const float* bias = view.bias;
    int64_t j = 0;
    if (softcap == 0.0f)
        for (; j + W <= view.visible; j += W) {
            const VecF scaled = mul(load(scores + j), broadcast(scale));
            store(scores + j, bias ? add(scaled, load(bias + j)) : scaled);
        }
    for (; j < view.visible; ++j) scores[j] = capped(scores[j] * scale, softcap) + (bias ? bias[j] : 0.0f);
    std::fill(scores, scores + view.hidden, NEGATIVE_INFINITY);
    std::fill(scores + view.visible, scores + BLOCK, NEGATIVE_INFINITY);
}

// One row's running softmax takes a block's scores[BLOCK] (-inf where hidden): they become
// the weights e^(score - maximum); returns what the row's weighted sum so far is scaled by,
// or -1 where nothing of the block is visible (the state stands).
float take_scores(float* state, float* scores) {
    VecF top = broadcast(NEGATIVE_INFINITY);
    for (int j = 0; j < BLOCK; j += W) top = maximum(top, load(scores + j));
    const float block_maximum = largest(top);
    if (block_maximum == NEGATIVE_INFINITY) return -1.0f;
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
    return rescale;
}

// Rows' weighted sums (count <= VALUE_ROWS; sums[r] = state + 2) scaled by rescale[r], plus
// their weights[r][j] times the block's values: four vectors of every row at a time, so a
// value's load serves every row and each row's sum is a chain of its own.
void weigh_values(float* const* sums, const float* const* weights, const float* rescale, int count,
                  const float* values, int64_t value_stride, int64_t positions, int64_t head_dim) {
    int64_t d = 0;
    for (; d + 4 * W <= head_dim; d += 4 * W) {
        VecF a[VALUE_ROWS][4];
        for (int r = 0; r < count; ++r)
            for (int i = 0; i < 4; ++i) a[r][i] = mul(load(sums[r] + d + i * W), broadcast(rescale[r]));
        for (int64_t j = 0; j < positions; ++j) {
            const float* v = values + j * value_stride + d;
            const VecF v0 = load(v), v1 = load(v + W), v2 = load(v + 2 * W), v3 = load(v + 3 * W);
            for (int r = 0; r < VALUE_ROWS; ++r) {
                if (r >= count) break;
                const VecF weight = broadcast(weights[r][j]);
                a[r][0] = fma(weight, v0, a[r][0]);
                a[r][1] = fma(weight, v1, a[r][1]);
                a[r][2] = fma(weight, v2, a[r][2]);
                a[r][3] = fma(weight, v3, a[r][3]);
            }
        }
        for (int r = 0; r < count; ++r)
            for (int i = 0; i < 4; ++i) store(sums[r] + d + i * W, a[r][i]);
    }
    for (int r = 0; r < count; ++r) {
        float* accumulated = sums[r];
        int64_t e = d;
        for (; e + W <= head_dim; e += W) {
            VecF a = mul(load(accumulated + e), broadcast(rescale[r]));
            for (int64_t j = 0; j < positions; ++j) a = fma(broadcast(weights[r][j]), load(values + j * value_stride + e), a);
            store(accumulated + e, a);
        }
        for (; e < head_dim; ++e) {
            float a = accumulated[e] * rescale[r];
            for (int64_t j = 0; j < positions; ++j) a += weights[r][j] * values[j * value_stride + e];
            accumulated[e] = a;
        }
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

#if defined(AMX_TILES)
#include "attention_amx.h"
#endif

void attend_span(const QueryRows& rows, const KeyValueSpan& span, float* state) {
#if defined(AMX_TILES)
    if (tiles::takes(rows)) return attend_span_tiles(rows, span, state);
#endif
    const int64_t head_dim = rows.head_dim, row_count = rows.tokens * rows.n_rep;
    const int64_t state_size = state_floats(head_dim);
    if (span.count == 0 || row_count == 0) return;
    // Steps of up to 32 tokens score row by row; longer ones on transposed keys, rows together.
    const bool transposed = rows.step_tokens > SPLIT_MIN_ROWS;
    std::unique_ptr<float[]> buffer(new float[row_count * BLOCK + 2 * BLOCK * head_dim]);
    float* scores = buffer.get();
    float* key_block = scores + row_count * BLOCK;
    float* value_block = key_block + BLOCK * head_dim;
    const int64_t element_bytes = span.type == CACHE_FLOAT32 ? 4 : 2;
    for (int64_t first = 0; first < span.count; first += BLOCK) {
        const int64_t count = std::min<int64_t>(BLOCK, span.count - first);
        if (span.bias && hidden_from_all(rows, span, first, count)) continue;  // a ring's empty or old slots
        const char* key_source = static_cast<const char*>(span.keys) + first * span.key_stride * element_bytes;
        const char* value_source = static_cast<const char*>(span.values) + first * span.value_stride * element_bytes;
        if (transposed) {
            keys_transposed(key_source, span.type, span.key_stride, count, head_dim, key_block);
            for (int64_t row = 0; row < row_count; row += SCORE_ROWS) {
                const int together = int(std::min<int64_t>(SCORE_ROWS, row_count - row));
                const float* q[SCORE_ROWS];
                for (int i = 0; i < together; ++i) {
                    const int64_t t = (row + i) / rows.n_rep, r = (row + i) % rows.n_rep;
                    q[i] = rows.q + t * rows.token_stride + r * head_dim;
                }
                dot_products(q, together, key_block, head_dim, scores + row * BLOCK);
            }
        } else {
            int64_t key_stride = span.key_stride;
            const float* keys = block_rows(key_source, span.type, count, head_dim, key_block, key_stride);
            // Each token's visible keys only: how they fall into fours depends on the token alone.
            for (int64_t t = 0; t < rows.tokens; ++t) {
                const TokenView view = token_view(rows, span, first, count, t);
                for (int64_t r = 0; r < rows.n_rep; ++r) {
                    float* row_scores = scores + (t * rows.n_rep + r) * BLOCK;
                    if (!view.skipped)
                        row_dot_products(rows.q + t * rows.token_stride + r * head_dim, keys, key_stride, view.visible,
                                         head_dim, row_scores);
                    finish_scores(row_scores, view, rows.scale, rows.softcap);
                }
            }
        }
        if (transposed)
            for (int64_t t = 0; t < rows.tokens; ++t) {
                const TokenView view = token_view(rows, span, first, count, t);
                for (int64_t r = 0; r < rows.n_rep; ++r)
                    finish_scores(scores + (t * rows.n_rep + r) * BLOCK, view, rows.scale, rows.softcap);
            }
        int64_t value_stride = span.value_stride;
        const float* values = block_rows(value_source, span.type, count, head_dim, value_block, value_stride);
        // The rows that see some of the block, VALUE_ROWS at a time.
        float* sums[VALUE_ROWS];
        const float* weights[VALUE_ROWS];
        float rescale[VALUE_ROWS];
        int taken = 0;
        for (int64_t row = 0; row < row_count; ++row) {
            float* row_state = state + row * state_size;
            const float factor = take_scores(row_state, scores + row * BLOCK);
            if (factor >= 0.0f) {
                sums[taken] = row_state + 2, weights[taken] = scores + row * BLOCK, rescale[taken] = factor;
                ++taken;
            }
            if (taken == VALUE_ROWS || (row + 1 == row_count && taken > 0)) {
                weigh_values(sums, weights, rescale, taken, values, value_stride, count, head_dim);
                taken = 0;
            }
        }
    }
}

}  // namespace attention
}  // namespace VARIANT_NAMESPACE

const AttentionKernels& ATTENTION_SET_FUNCTION() {
    static const AttentionKernels set{VARIANT_NAMESPACE::attention::attend_span};
    return set;
}

}  // namespace llama_chat_kernels
