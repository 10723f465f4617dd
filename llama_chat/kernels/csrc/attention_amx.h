// A prompt chunk's attention on AMX's tile unit, in split bfloat16 as its matrices (the
// avx512-amx variant; included by attention_impl.h where AMX_TILES is defined).
//
// For each block of 32 positions and 16 query rows: the scores S = Q K^T, three products
// of 16 x 16 x 32 a feature group (q = q_hi + q_lo, k = k_hi + k_lo, the dropped q_lo k_lo
// below 2^-16 of each product: float16 keys split exactly), then each row's running softmax
// in float32 as the vector kernel takes it, then P V in three products a 16-feature tile,
// the weights split as the queries. Operands (64-byte tile rows): A, the rows' queries or
// weights, 16 x 32 bfloat16 as they lie; B, keys as pairs of features [16 pairs][16
// positions][2] and values as pairs of positions [16 pairs][16 features][2], made once a
// block for every row group of the call.

namespace tiles {

constexpr int ROWS = 16;            // query rows a group (A's and C's rows)
constexpr int PLANE = 16 * 32;      // bfloat16 in one 16 x 32 plane (1 KB)
constexpr int64_t MAX_HEAD = 256;   // features a row holds at most here

// Whether the tile unit takes this call: a prompt chunk's many tokens, features in whole
// groups of 32, no soft cap (its tanh is the vector kernel's).
inline bool takes(const QueryRows& rows) {
    return rows.step_tokens > SPLIT_MIN_ROWS && rows.head_dim % 32 == 0 && rows.head_dim <= MAX_HEAD &&
           rows.softcap == 0.0f;
}

// 32 floats as bfloat16 halves, hi and lo planes of one 64-byte row each.
inline void split_row(const float* x, uint16_t* hi, uint16_t* lo) {
    __m512i h, l;
    amx::split(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), h, l);
    _mm512_storeu_si512(hi, h);
    _mm512_storeu_si512(lo, l);
}

// The rows' queries as A operands: packed[group][feature group][plane][16 rows][32].
void pack_queries(const QueryRows& rows, int64_t row_count, uint16_t* packed) {
    const int64_t features = rows.head_dim / 32, groups = (row_count + ROWS - 1) / ROWS;
    std::memset(packed, 0, groups * features * 2 * PLANE * 2);
    for (int64_t row = 0; row < row_count; ++row) {
        const float* q = rows.q + row / rows.n_rep * rows.token_stride + row % rows.n_rep * rows.head_dim;
        for (int64_t f = 0; f < features; ++f) {
            uint16_t* plane = packed + ((row / ROWS) * features + f) * 2 * PLANE + row % ROWS * 32;
            split_row(q + 32 * f, plane, plane + PLANE);
        }
    }
}

// A block's `count` float32 rows of head_dim (keys or values) split into bfloat16 planes
// split[plane][position][feature], zeros past count.
void split_block(const float* rows, int64_t count, int64_t head_dim, uint16_t (*split)[32][MAX_HEAD]) {
    for (int64_t j = 0; j < 32; ++j)
        for (int64_t d = 0; d < head_dim; d += 32) {
            if (j < count) {
                split_row(rows + j * head_dim + d, &split[0][j][d], &split[1][j][d]);
            } else {
                std::memset(&split[0][j][d], 0, 64);
                std::memset(&split[1][j][d], 0, 64);
            }
        }
}

// A block's keys as B operands: keys_b[feature group][half][plane][16 feature pairs][16
// positions][2].
void pack_keys(const float* keys, int64_t count, int64_t head_dim, uint16_t* keys_b) {
    alignas(64) uint16_t split[2][32][MAX_HEAD];
    split_block(keys, count, head_dim, split);
    for (int64_t f = 0; f < head_dim / 32; ++f)
        for (int half = 0; half < 2; ++half)
            for (int plane = 0; plane < 2; ++plane) {
                uint32_t* out = reinterpret_cast<uint32_t*>(keys_b + ((f * 2 + half) * 2 + plane) * PLANE);
                for (int pair = 0; pair < 16; ++pair)
                    for (int n = 0; n < 16; ++n) std::memcpy(out + pair * 16 + n, &split[plane][16 * half + n][32 * f + 2 * pair], 4);
            }
}

// A block's values as B operands: values_b[feature tile][plane][16 position pairs][16
// features][2].
void pack_values(const float* values, int64_t count, int64_t head_dim, uint16_t* values_b) {
    alignas(64) uint16_t split[2][32][MAX_HEAD];
    split_block(values, count, head_dim, split);
    for (int64_t n = 0; n < head_dim / 16; ++n)
        for (int plane = 0; plane < 2; ++plane) {
            uint16_t* out = values_b + (n * 2 + plane) * PLANE;
            for (int pair = 0; pair < 16; ++pair)
                for (int f = 0; f < 16; ++f) {
                    out[(pair * 16 + f) * 2] = split[plane][2 * pair][16 * n + f];
                    out[(pair * 16 + f) * 2 + 1] = split[plane][2 * pair + 1][16 * n + f];
                }
        }
}

// C 0 and C 1 plus A (2: hi, 3: lo) times two B operands of two planes each at b (4, 5 and
// 6, 7): three products each, hi hi, hi lo and lo hi.
inline void split_products(const uint16_t* b) {
    _tile_loadd(4, b, 64);
    _tile_loadd(5, b + PLANE, 64);
    _tile_loadd(6, b + 2 * PLANE, 64);
    _tile_loadd(7, b + 3 * PLANE, 64);
    _tile_dpbf16ps(0, 2, 5);
    _tile_dpbf16ps(1, 2, 7);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 2, 6);
    _tile_dpbf16ps(0, 3, 4);
    _tile_dpbf16ps(1, 3, 6);
}

// One row group's scores over a block: scores[16 rows][BLOCK] (C 0: positions 0-15, C 1: 16-31).
void group_scores(const uint16_t* queries, const uint16_t* keys_b, int64_t features, float* scores) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t f = 0; f < features; ++f) {
        const uint16_t* a = queries + f * 2 * PLANE;
        const uint16_t* b = keys_b + f * 4 * PLANE;
        _tile_loadd(2, a, 64);
        _tile_loadd(3, a + PLANE, 64);
        split_products(b);
    }
    _tile_stored(0, scores, BLOCK * 4);
    _tile_stored(1, scores + 16, BLOCK * 4);
}

// One row group's weights (rows x BLOCK floats, split here into A planes) times the block's
// values, added to each row's sum after scaling it by rescale[r].
void group_values(const float* weights, int rows_here, const uint16_t* values_b, int64_t head_dim,
                  float* const* sums, const float* rescale) {
    alignas(64) uint16_t a[2][PLANE];
    for (int r = 0; r < ROWS; ++r) {
        if (r < rows_here) {
            split_row(weights + r * BLOCK, a[0] + 32 * r, a[1] + 32 * r);
        } else {
            std::memset(a[0] + 32 * r, 0, 64);
            std::memset(a[1] + 32 * r, 0, 64);
        }
    }
    _tile_loadd(2, a[0], 64);
    _tile_loadd(3, a[1], 64);
    alignas(64) float out[ROWS * 32];
    for (int64_t n = 0; n < head_dim / 16; n += 2) {
        const uint16_t* b = values_b + n * 2 * PLANE;
        _tile_zero(0);
        _tile_zero(1);
        split_products(b);
        _tile_stored(0, out, 32 * 4);
        _tile_stored(1, out + 16, 32 * 4);
        for (int r = 0; r < rows_here; ++r) {
            float* sum = sums[r] + 16 * n;
            const __m512 scale = _mm512_set1_ps(rescale[r]);
            _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_loadu_ps(sum), scale, _mm512_loadu_ps(out + 32 * r)));
            _mm512_storeu_ps(sum + 16, _mm512_fmadd_ps(_mm512_loadu_ps(sum + 16), scale, _mm512_loadu_ps(out + 32 * r + 16)));
        }
    }
}

}  // namespace tiles

// attend_span on the tile unit (tiles::takes(rows) says where).
void attend_span_tiles(const QueryRows& rows, const KeyValueSpan& span, float* state) {
    const int64_t head_dim = rows.head_dim, row_count = rows.tokens * rows.n_rep, features = head_dim / 32;
    const int64_t state_size = state_floats(head_dim), groups = (row_count + tiles::ROWS - 1) / tiles::ROWS;
    std::unique_ptr<uint16_t[]> packed(new uint16_t[groups * features * 2 * tiles::PLANE + 4 * head_dim / 32 * 2 * tiles::PLANE]);
    uint16_t* queries = packed.get();
    uint16_t* keys_b = queries + groups * features * 2 * tiles::PLANE;  // [features][half][plane]
    uint16_t* values_b = keys_b + features * 4 * tiles::PLANE;          // [head_dim / 16][plane]
    tiles::pack_queries(rows, row_count, queries);
    std::unique_ptr<float[]> buffer(new float[row_count * BLOCK + 2 * BLOCK * head_dim]);
    float* scores = buffer.get();
    float* key_block = scores + row_count * BLOCK;
    float* value_block = key_block + BLOCK * head_dim;
    const int64_t element_bytes = span.type == CACHE_FLOAT32 ? 4 : 2;
    int configured = 0;
    for (int64_t first = 0; first < span.count; first += BLOCK) {
        const int64_t count = std::min<int64_t>(BLOCK, span.count - first);
        if (span.bias && hidden_from_all(rows, span, first, count)) continue;  // a ring's empty or old slots
        const char* key_source = static_cast<const char*>(span.keys) + first * span.key_stride * element_bytes;
        const char* value_source = static_cast<const char*>(span.values) + first * span.value_stride * element_bytes;
        to_float32(key_source, span.type, span.key_stride, count, head_dim, key_block);
        to_float32(value_source, span.type, span.value_stride, count, head_dim, value_block);
        tiles::pack_keys(key_block, count, head_dim, keys_b);
        tiles::pack_values(value_block, count, head_dim, values_b);
        for (int64_t g = 0; g < groups; ++g) {
            const int rows_here = int(std::min<int64_t>(tiles::ROWS, row_count - g * tiles::ROWS));
            if (rows_here != configured) {
                amx::configure(rows_here);
                configured = rows_here;
            }
            float* group_scores = scores + g * tiles::ROWS * BLOCK;
            tiles::group_scores(queries + g * features * 2 * tiles::PLANE, keys_b, features, group_scores);
            float* sums[tiles::ROWS];
            float rescale[tiles::ROWS];
            for (int i = 0; i < rows_here; ++i) {
                const int64_t row = g * tiles::ROWS + i;
                const TokenView view = token_view(rows, span, first, count, row / rows.n_rep);
                float* row_scores = group_scores + i * BLOCK;
                finish_scores(row_scores, view, rows.scale, 0.0f);
                float* row_state = state + row * state_size;
                const float factor = take_scores(row_state, row_scores);
                if (factor < 0.0f) std::fill(row_scores, row_scores + BLOCK, 0.0f);  // nothing visible: add nothing
                sums[i] = row_state + 2;
                rescale[i] = factor < 0.0f ? 1.0f : factor;
            }
            tiles::group_values(group_scores, rows_here, values_b, head_dim, sums, rescale);
        }
    }
    if (configured) _tile_release();
}
