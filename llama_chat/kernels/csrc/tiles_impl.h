// Tiled matrices of every type (layout in kernels.h) times
// int8 or 16-bit activations, for single tokens and several alike; included by
// kernels_impl.h, once per variant.
//
// Per group of 32 columns (Q6_K: per half group of 16, each with its own scale) and token,
// the levels (unsigned) go through byte dot products with the token's signed bytes, 16
// rows a vector; with w = scale q + minimum,
//   y += scale * xscale * sum(q x) + minimum * xsum
// where x ~ xscale * levels and xsum is the sum of the rounded x (see quantize_rows); for
// a fixed offset (minimum = -8 scale for Q4_0, -16 scale for Q5_0, -32 scale for Q6_K,
// -128 scale for Q8_0, whose levels are stored plus 128) as
//   y += scale * (xscale * sum(q x) - offset * xsum).
// With 16 bits, sum(q x) = 255 * (the high halves' sum) + the low halves' sum. Q8_0's two
// terms can be far larger than their difference (activations of one sign, levels near 0):
// each is rounded to float32 once, about 2^-24 of at most 128 x 32 x the group's largest
// activation, some 100 times less than the 16-bit activations' own rounding there.

namespace llama_chat_kernels {
namespace VARIANT_NAMESPACE {

constexpr int GROUP_CHUNKS = 4;  // 64-byte chunks of levels per group of 32 columns

inline int32_t dword(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Where group g of a tile lies, and its rows' scales and minimums (per half group for Q6_K).
template <int TYPE>
struct TileGroup {
    static constexpr int64_t GROUPS = tile_unit_columns(TYPE) / X_GROUP;  // groups a unit
    static constexpr int64_t UNIT = tile_unit_bytes(TYPE);
    static constexpr int HALVES = TYPE == Q6_K ? 2 : 1;  // scales a group
    static constexpr bool SCALE_MIN = TYPE == Q4_K || TYPE == Q5_K;  // 6-bit scales and minimums
    static constexpr bool FIFTH_BIT = TYPE == Q5_0 || TYPE == Q5_1 || TYPE == Q5_K;  // levels of 5 bits
    static constexpr bool EIGHT_BIT = TYPE == Q8_0;                  // a byte a level, no nibbles
    // the largest level AVX2 multiplies (Q8_0's as the file's signed levels: |-128|)
    static constexpr int TOP_LEVEL = EIGHT_BIT ? 128 : TYPE == Q6_K ? 63 : FIFTH_BIT ? 31 : 15;
    // minimum = -OFFSET scale, or 0: minimums stored
    static constexpr float OFFSET = TYPE == Q4_0   ? 8.0f
                                    : TYPE == Q5_0 ? 16.0f
                                    : TYPE == Q6_K ? 32.0f
                                    : EIGHT_BIT    ? 128.0f
                                                   : 0.0f;
    static constexpr int64_t FACTORS = k_type(TYPE) ? 256 : 0;  // bytes of byte factors ahead of the groups
    static constexpr int64_t GROUP_LEVELS = EIGHT_BIT ? 512 : 256;  // bytes of levels (4-bit: low 4 bits) a group
    // bytes a group of the bits above the 4: Q6_K's two, Q5's one
    static constexpr int64_t HIGH = TYPE == Q6_K ? 128 : FIFTH_BIT ? 64 : 0;
    static constexpr int64_t GROUP_BYTES = GROUP_LEVELS + HIGH;
    static constexpr int64_t HEAD = FACTORS + GROUP_BYTES * GROUPS;  // where d starts

    static const uint8_t* unit(const uint8_t* tile, int64_t g) { return tile + g / GROUPS * UNIT; }
    static const uint8_t* levels(const uint8_t* tile, int64_t g) {
        return unit(tile, g) + FACTORS + g % GROUPS * GROUP_BYTES;
    }
    static const uint8_t* high_bits(const uint8_t* tile, int64_t g) { return levels(tile, g) + GROUP_LEVELS; }
    // where the byte factors of (half) group g start in its unit, scales (Q4_K, Q5_K: then
    // minimums 128 bytes on)
    static int64_t factors(int64_t g, int half) {
        return TYPE == Q6_K ? 16 * (2 * (g % GROUPS) + half) : 16 * (g % GROUPS);
    }

    // Row n's scale and minimum in (half) group g; the vector forms below: 16 rows, or the
    // 8 from 8 h.
    static float scale(const uint8_t* tile, int64_t g, int half, int n) {
        const uint8_t* u = unit(tile, g);
        const float d = half_to_float(u + HEAD + 2 * n);
        if (TYPE == Q6_K) return d * float(int8_t(u[factors(g, half) + n]));
        return SCALE_MIN ? d * float(u[factors(g, half) + n]) : d;
    }
    static float minimum(const uint8_t* tile, int64_t g, int half, int n) {
        if (OFFSET != 0.0f) return -OFFSET * scale(tile, g, half, n);
        const uint8_t* u = unit(tile, g);
        const float m = half_to_float(u + HEAD + 32 + 2 * n);
        return SCALE_MIN ? -m * float(u[factors(g, half) + 128 + n]) : m;
    }
#if VARIANT == 2
    static __m512 halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static __m512 bytes(const uint8_t* p) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm512_cvtepi32_ps(TYPE == Q6_K ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
    }
    static __m512 scales(const uint8_t* tile, int64_t g, int half) {
        const uint8_t* u = unit(tile, g);
        const __m512 d = halves(u + HEAD);
        return k_type(TYPE) ? _mm512_mul_ps(d, bytes(u + factors(g, half))) : d;
    }
    static __m512 minimums(const uint8_t* tile, int64_t g) {  // stored minimums only (OFFSET 0)
        const uint8_t* u = unit(tile, g);
        const __m512 m = halves(u + HEAD + 32);
        return SCALE_MIN ? _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(m, bytes(u + factors(g, 0) + 128))) : m;
    }
#elif VARIANT == 1
    static __m256 halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static __m256 bytes(const uint8_t* p) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        return _mm256_cvtepi32_ps(TYPE == Q6_K ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
    }
    static __m256 scales(const uint8_t* tile, int64_t g, int half, int h) {
        const uint8_t* u = unit(tile, g);
        const __m256 d = halves(u + HEAD + 16 * h);
        return k_type(TYPE) ? _mm256_mul_ps(d, bytes(u + factors(g, half) + 8 * h)) : d;
    }
    static __m256 minimums(const uint8_t* tile, int64_t g, int h) {
        const uint8_t* u = unit(tile, g);
        const __m256 m = halves(u + HEAD + 32 + 16 * h);
        return SCALE_MIN ? _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(m, bytes(u + factors(g, 0) + 128 + 8 * h)))
                            : m;
    }
#endif
};

#if VARIANT == 2
// One (half) group's float work for one token: total (the integer dot products) into acc.
template <int TYPE>
inline __m512 add_group(__m512 acc, __m512i total, __m512 scale, __m512 minimum, float step, float summed) {
    constexpr float OFFSET = TileGroup<TYPE>::OFFSET;
    if constexpr (OFFSET != 0.0f) {
        const __m512 part =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(step), _mm512_set1_ps(-OFFSET * summed));
        return _mm512_fmadd_ps(part, scale, acc);
    } else {
        acc = _mm512_fmadd_ps(minimum, _mm512_set1_ps(summed), acc);
        return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(step)), scale, acc);
    }
}

// 255 high + low. A group's sums fit in int32 for every type: Q8_0's are the largest, each
// plane's at most 32 x 255 x 127 = 1,036,320 (levels to 255 against activations to +-127),
// and 255 times that is 264 million, below 2^31.
inline __m512i combine(__m512i high, __m512i low) {
    return _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(high, 8), high), low);
}

// Level vectors 2 k and 2 k + 1 of a group (columns 8 k .. 8 k + 8), Q5's fifth bits or
// Q6_K's high bits added.
template <int TYPE>
inline void unpack_chunk(const uint8_t* levels, const uint8_t* high_bits, int k, __m512i& low, __m512i& high) {
    if constexpr (TileGroup<TYPE>::EIGHT_BIT) {  // a line a vector, read as stored
        low = _mm512_loadu_si512(levels + 128 * k);
        high = _mm512_loadu_si512(levels + 128 * k + 64);
    } else {
        const __m512i nibble = _mm512_set1_epi8(0x0F);
        const __m512i bytes = _mm512_loadu_si512(levels + 64 * k);
        low = _mm512_and_si512(bytes, nibble);
        high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
    }
    if constexpr (TYPE == Q6_K) {
        // vectors 2 k and 2 k + 1 have bits 2 i, 2 i + 1 of chunk k / 2, i = 2 (k % 2) + half:
        // shifted to bits 4-5 of each byte (16-bit shifts; the mask drops what crosses bytes)
        const __m512i top = _mm512_set1_epi8(0x30);
        const __m512i bits = _mm512_loadu_si512(high_bits + 64 * (k / 2));
        const __m512i first = k % 2 ? bits : _mm512_slli_epi16(bits, 4);
        const __m512i second = k % 2 ? _mm512_srli_epi16(bits, 2) : _mm512_slli_epi16(bits, 2);
        low = _mm512_or_si512(low, _mm512_and_si512(first, top));
        high = _mm512_or_si512(high, _mm512_and_si512(second, top));
    } else if constexpr (TileGroup<TYPE>::FIFTH_BIT) {
        // vector v's fifth bits are bit v of the group's 64 bytes: a vptestmb picks them into
        // a mask, a masked vpaddb adds 16 where they are set (a single token's tiles in L2
        // measured 1.13x faster, 4 tokens' 1.03x, than moving the bit to bit 4 by a shift and
        // or-ing it in: the shift competes with vpdpbusd for port 0, the test does not)
        const __m512i fifth = _mm512_set1_epi8(0x10);
        const __m512i bits = _mm512_loadu_si512(high_bits);
        const __mmask64 first = _mm512_test_epi8_mask(bits, _mm512_set1_epi8(char(1 << (2 * k))));
        const __mmask64 second = _mm512_test_epi8_mask(bits, _mm512_set1_epi8(char(1 << (2 * k + 1))));
        low = _mm512_mask_add_epi8(low, first, low, fifth);
        high = _mm512_mask_add_epi8(high, second, high, fifth);
    }
}
#endif

// R tokens from row m against one tile: out[r][0..16).
template <int R, int TYPE, bool TWO>
void tile_tokens(const uint8_t* tile, const QuantizedRows& xq, int64_t m, float* out) {
    using Group = TileGroup<TYPE>;
    constexpr int PLANES = TWO ? 2 : 1, HALVES = Group::HALVES;
    const int64_t columns = xq.columns, groups = columns / X_GROUP;
    const uint8_t* x[PLANES][R];
    for (int r = 0; r < R; ++r) {
        x[0][r] = xq.high + (m + r) * columns;
        if (TWO) x[PLANES - 1][r] = xq.low + (m + r) * columns;
    }
    const float* xscale = xq.xscale + m * groups;
    const float* xsum = xq.xsum + m * groups;
    const float* xsum_half = xq.xsum_half + m * groups;
    // the sum of x over half group `half` of group g of token r
    auto summed = [&](int r, int64_t g, int half) {
        if (HALVES == 1) return xsum[r * groups + g];
        return half == 0 ? xsum_half[r * groups + g] : xsum[r * groups + g] - xsum_half[r * groups + g];
    };
#if VARIANT == 2
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m512i level[2 * GROUP_CHUNKS];  // level vector v = 2 k + half
        for (int k = 0; k < GROUP_CHUNKS; ++k)
            unpack_chunk<TYPE>(Group::levels(tile, g), Group::high_bits(tile, g), k, level[2 * k], level[2 * k + 1]);
        __m512 scale[HALVES], minimum[HALVES];
        for (int half = 0; half < HALVES; ++half) {
            scale[half] = Group::scales(tile, g, half);
            minimum[half] = Group::OFFSET != 0.0f ? scale[half] : Group::minimums(tile, g);
        }
        // Products slice by slice across all tokens and planes: R * PLANES independent
        // chains in step (a second chain each where they are fewer than 4, vpdpbusd's
        // latency in cycles; Q6_K's two half groups are two chains anyway), so the
        // products issue back to back.
        // Unrolled in full (8 x R x PLANES products: past the compiler's own limit), so
        // that the chains are registers, not an array on the stack indexed at run time.
        constexpr int CHAINS = HALVES == 2 || R * PLANES < 4 ? 2 : 1;
        __m512i dot[R][PLANES][CHAINS];
        for (int r = 0; r < R; ++r)
            for (int plane = 0; plane < PLANES; ++plane)
                for (int c = 0; c < CHAINS; ++c) dot[r][plane][c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 2 * GROUP_CHUNKS; ++v) {
            const int c = HALVES == 2 ? v / GROUP_CHUNKS : v % CHAINS;
            for (int r = 0; r < R; ++r)
                for (int plane = 0; plane < PLANES; ++plane)
                    dot[r][plane][c] = _mm512_dpbusd_epi32(dot[r][plane][c], level[v],
                                                           _mm512_set1_epi32(dword(x[plane][r] + 32 * g + 4 * v)));
        }
        for (int r = 0; r < R; ++r) {
            if constexpr (HALVES == 2) {
                for (int half = 0; half < 2; ++half) {
                    const __m512i total = TWO ? combine(dot[r][0][half], dot[r][PLANES - 1][half]) : dot[r][0][half];
                    acc[r] = add_group<TYPE>(acc[r], total, scale[half], minimum[half], xscale[r * groups + g],
                                             summed(r, g, half));
                }
            } else {
                __m512i sums[PLANES];
                for (int plane = 0; plane < PLANES; ++plane)
                    sums[plane] =
                        CHAINS == 1 ? dot[r][plane][0] : _mm512_add_epi32(dot[r][plane][0], dot[r][plane][CHAINS - 1]);
                const __m512i total = TWO ? combine(sums[0], sums[PLANES - 1]) : sums[0];
                acc[r] = add_group<TYPE>(acc[r], total, scale[0], minimum[0], xscale[r * groups + g], summed(r, g, 0));
            }
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * TILE_ROWS, acc[r]);
#elif VARIANT == 1
    // vpmaddubsw: pairs of unsigned level x signed byte products in 16 bits, at most
    // 2 * 15 * 127 = 3810 for 4-bit levels, so a group's 8 products add up in 16 bits
    // (30480) before one vpmaddwd widens them; Q5's (2 * 31 * 127 = 7874) four at a time,
    // Q6_K's (2 * 63 * 127 = 16002) two. Q8_0's stored levels (to 255) would saturate a
    // single pair (2 * 255 * 127), so they become the file's signed levels again (xor 0x80),
    // whose magnitudes go in unsigned and whose signs move onto x (vpsignb; x is never -128):
    // 2 * 128 * 127 = 32512, one product at a time, and no offset. Rows 0-7 and 8-15 in two
    // halves h.
    constexpr int IN_16_BITS = 32767 / (2 * Group::TOP_LEVEL * 127);
    static_assert(IN_16_BITS >= 1 && 2 * GROUP_CHUNKS % IN_16_BITS == 0, "a group's products in whole runs");
    const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30), fifth = _mm256_set1_epi8(0x10),
                  flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* levels = Group::levels(tile, g);
        for (int h = 0; h < 2; ++h) {
            __m256i level[2 * GROUP_CHUNKS];
            if constexpr (Group::EIGHT_BIT) {
                for (int v = 0; v < 2 * GROUP_CHUNKS; ++v)
                    level[v] = _mm256_xor_si256(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(levels + 64 * v + 32 * h)), flip);
            } else {
                for (int k = 0; k < GROUP_CHUNKS; ++k) {
                    const __m256i bytes =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(levels + 64 * k + 32 * h));
                    level[2 * k] = _mm256_and_si256(bytes, nibble);
                    level[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
                    if constexpr (TYPE == Q6_K) {  // as unpack_chunk
                        const __m256i bits = _mm256_loadu_si256(
                            reinterpret_cast<const __m256i*>(Group::high_bits(tile, g) + 64 * (k / 2) + 32 * h));
                        const __m256i first = k % 2 ? bits : _mm256_slli_epi16(bits, 4);
                        const __m256i second = k % 2 ? _mm256_srli_epi16(bits, 2) : _mm256_slli_epi16(bits, 2);
                        level[2 * k] = _mm256_or_si256(level[2 * k], _mm256_and_si256(first, top));
                        level[2 * k + 1] = _mm256_or_si256(level[2 * k + 1], _mm256_and_si256(second, top));
                    } else if constexpr (Group::FIFTH_BIT) {
                        // bit v of each byte moved to bit 4 and or-ed in (16-bit shifts: what
                        // crosses from the neighbouring byte lands on bits 0-3, shifted left by at
                        // most 4, or on bits 5-7, shifted right by at most 3; never on bit 4)
                        const __m256i bits =
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Group::high_bits(tile, g) + 32 * h));
                        for (int v = 2 * k; v < 2 * k + 2; ++v) {
                            const __m256i moved = v < 4    ? _mm256_slli_epi16(bits, 4 - v)
                                                  : v == 4 ? bits
                                                           : _mm256_srli_epi16(bits, v - 4);
                            level[v] = _mm256_or_si256(level[v], _mm256_and_si256(moved, fifth));
                        }
                    }
                }
            }
            __m256 scale[HALVES], minimum[HALVES];
            for (int half = 0; half < HALVES; ++half) {
                scale[half] = Group::scales(tile, g, half, h);
                minimum[half] = Group::OFFSET != 0.0f ? scale[half] : Group::minimums(tile, g, h);
            }
            // level vector v's pair sums with the 4 bytes of x at xg + 4 v
            auto pairs_of = [&](int v, const uint8_t* xg) {
                const __m256i xv = _mm256_set1_epi32(dword(xg + 4 * v));
                if constexpr (Group::EIGHT_BIT)
                    return _mm256_maddubs_epi16(_mm256_abs_epi8(level[v]), _mm256_sign_epi8(xv, level[v]));
                else
                    return _mm256_maddubs_epi16(level[v], xv);
            };
            for (int r = 0; r < R; ++r) {
                __m256i dot[PLANES][HALVES];
                for (int plane = 0; plane < PLANES; ++plane) {
                    const uint8_t* xg = x[plane][r] + 32 * g;
                    for (int half = 0; half < HALVES; ++half) dot[plane][half] = _mm256_setzero_si256();
                    for (int v0 = 0; v0 < 2 * GROUP_CHUNKS; v0 += IN_16_BITS) {
                        __m256i pairs = pairs_of(v0, xg);
                        for (int v = v0 + 1; v < v0 + IN_16_BITS; ++v) pairs = _mm256_add_epi16(pairs, pairs_of(v, xg));
                        const int half = HALVES == 2 ? v0 / GROUP_CHUNKS : 0;
                        dot[plane][half] = _mm256_add_epi32(dot[plane][half], _mm256_madd_epi16(pairs, ones));
                    }
                }
                for (int half = 0; half < HALVES; ++half) {
                    const __m256i total =
                        TWO ? _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(dot[0][half], 8), dot[0][half]),
                                               dot[PLANES - 1][half])
                            : dot[0][half];
                    const float step = xscale[r * groups + g], sum = summed(r, g, half);
                    if constexpr (Group::EIGHT_BIT) {  // signed levels: w = d q
                        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(step)),
                                                    scale[half], acc[r][h]);
                    } else if constexpr (Group::OFFSET != 0.0f) {
                        const __m256 part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(step),
                                                            _mm256_set1_ps(-Group::OFFSET * sum));
                        acc[r][h] = _mm256_fmadd_ps(part, scale[half], acc[r][h]);
                    } else {
                        acc[r][h] = _mm256_fmadd_ps(minimum[half], _mm256_set1_ps(sum), acc[r][h]);
                        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(step)),
                                                    scale[half], acc[r][h]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + r * TILE_ROWS + 8 * h, acc[r][h]);
#else
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < TILE_ROWS; ++n) out[r * TILE_ROWS + n] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* levels = Group::levels(tile, g);
        for (int n = 0; n < TILE_ROWS; ++n) {
            int level[32];  // by column
            for (int k = 0; k < GROUP_CHUNKS; ++k) {
                for (int j = 0; j < 4; ++j) {
                    if (Group::EIGHT_BIT) {  // vector v = 2 k + half: the 64 bytes from 64 v
                        level[8 * k + j] = levels[128 * k + 4 * n + j];
                        level[8 * k + 4 + j] = levels[128 * k + 64 + 4 * n + j];
                    } else {
                        const uint8_t both = levels[64 * k + 4 * n + j];
                        level[8 * k + j] = both & 15;
                        level[8 * k + 4 + j] = both >> 4;
                    }
                    if (TYPE == Q6_K) {
                        for (int half = 0; half < 2; ++half) {
                            const int v = 2 * k + half;
                            const uint8_t bits = Group::high_bits(tile, g)[64 * (v / 4) + 4 * n + j];
                            level[8 * k + 4 * half + j] |= ((bits >> (2 * (v % 4))) & 3) << 4;
                        }
                    } else if (Group::FIFTH_BIT) {
                        const uint8_t bits = Group::high_bits(tile, g)[4 * n + j];
                        for (int half = 0; half < 2; ++half)
                            level[8 * k + 4 * half + j] |= ((bits >> (2 * k + half)) & 1) << 4;
                    }
                }
            }
            for (int half = 0; half < HALVES; ++half) {
                const float scale = Group::scale(tile, g, half, n), minimum = Group::minimum(tile, g, half, n);
                const int first = 32 / HALVES * half, last = 32 / HALVES * (half + 1);
                for (int r = 0; r < R; ++r) {
                    int32_t dot[PLANES];
                    for (int plane = 0; plane < PLANES; ++plane) {
                        const int8_t* xg = reinterpret_cast<const int8_t*>(x[plane][r] + 32 * g);
                        dot[plane] = 0;
                        for (int c = first; c < last; ++c) dot[plane] += level[c] * xg[c];
                    }
                    const int32_t total = TWO ? 255 * dot[0] + dot[PLANES - 1] : dot[0];
                    out[r * TILE_ROWS + n] += scale * (float(total) * xscale[r * groups + g]) + minimum * summed(r, g, half);
                }
            }
        }
    }
#endif
}

#if VARIANT == 2
// One token's integer sums over group g of a tile, xv its bytes broadcast (vector v of the
// group's columns 4 v .. 4 v + 4): two chains a plane, the even and odd level vectors or
// Q6_K's half groups.
template <int TYPE, int PLANES>
inline void group_dots(const uint8_t* tile, int64_t g, const __m512i (&xv)[PLANES][2 * GROUP_CHUNKS],
                       __m512i (&dot)[PLANES][2]) {
    using Group = TileGroup<TYPE>;
    for (int plane = 0; plane < PLANES; ++plane) dot[plane][0] = dot[plane][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < GROUP_CHUNKS; ++k) {
        __m512i low, high;
        unpack_chunk<TYPE>(Group::levels(tile, g), Group::high_bits(tile, g), k, low, high);
        const int first = Group::HALVES == 2 ? k / 2 : 0, second = Group::HALVES == 2 ? k / 2 : 1;
        for (int plane = 0; plane < PLANES; ++plane) {
            dot[plane][first] = _mm512_dpbusd_epi32(dot[plane][first], low, xv[plane][2 * k]);
            dot[plane][second] = _mm512_dpbusd_epi32(dot[plane][second], high, xv[plane][2 * k + 1]);
        }
    }
}

// One token against T tiles: the token's bytes are broadcast once a group for all T (for
// a single token the broadcasts would otherwise cost as much as the products).
template <int T, int TYPE, bool TWO>
void tiles_one_token(const uint8_t* tiles, int64_t stride, const QuantizedRows& xq, float* out) {
    using Group = TileGroup<TYPE>;
    constexpr int PLANES = TWO ? 2 : 1, HALVES = Group::HALVES;
    const int64_t groups = xq.columns / X_GROUP;
    const uint8_t* x[PLANES] = {xq.high};
    if (TWO) x[PLANES - 1] = xq.low;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m512i xv[PLANES][2 * GROUP_CHUNKS];
        for (int plane = 0; plane < PLANES; ++plane)
            for (int v = 0; v < 2 * GROUP_CHUNKS; ++v) xv[plane][v] = _mm512_set1_epi32(dword(x[plane] + 32 * g + 4 * v));
        const float summed[2] = {HALVES == 1 ? xq.xsum[g] : xq.xsum_half[g], xq.xsum[g] - xq.xsum_half[g]};
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            const uint8_t* tile = tiles + t * stride;
            __m512i dot[PLANES][2];
            group_dots<TYPE, PLANES>(tile, g, xv, dot);
            if constexpr (HALVES == 2) {
                for (int half = 0; half < 2; ++half) {
                    const __m512i total = TWO ? combine(dot[0][half], dot[PLANES - 1][half]) : dot[0][half];
                    const __m512 scale = Group::scales(tile, g, half);
                    acc[t] = add_group<TYPE>(acc[t], total, scale, scale, xq.xscale[g], summed[half]);
                }
            } else {
                const __m512i first = _mm512_add_epi32(dot[0][0], dot[0][1]);
                const __m512i total =
                    TWO ? combine(first, _mm512_add_epi32(dot[PLANES - 1][0], dot[PLANES - 1][1])) : first;
                const __m512 scale = Group::scales(tile, g, 0);
                const __m512 minimum = Group::OFFSET != 0.0f ? scale : Group::minimums(tile, g);
                acc[t] = add_group<TYPE>(acc[t], total, scale, minimum, xq.xscale[g], summed[0]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * TILE_ROWS, acc[t]);
}

// One token against T tiles of a K type, a unit at a time: its groups' sums are weighted by
// their byte factors (read ahead of the levels) and the unit's float16 fields (read after
// them) scale the whole unit once, so a group's float work is a convert and one or two
// multiply-adds, and each tile is read as one forward stream.
template <int T, int TYPE, bool TWO>
void k_tiles_one_token(const uint8_t* tiles, int64_t stride, const QuantizedRows& xq, float* out) {
    using Group = TileGroup<TYPE>;
    constexpr int PLANES = TWO ? 2 : 1;
    const int64_t groups = xq.columns / X_GROUP;
    const uint8_t* x[PLANES] = {xq.high};
    if (TWO) x[PLANES - 1] = xq.low;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t first = 0; first < groups; first += Group::GROUPS) {
        __m512 scaled[T], minimums[T];  // a unit's sums: weighted by the scales; (Q4_K, Q5_K) minimums times xsum
        for (int t = 0; t < T; ++t) scaled[t] = minimums[t] = _mm512_setzero_ps();
        for (int64_t g = first; g < first + Group::GROUPS; ++g) {
            const __m512 step = _mm512_set1_ps(xq.xscale[g]);
            __m512i xv[PLANES][2 * GROUP_CHUNKS];
            for (int plane = 0; plane < PLANES; ++plane)
                for (int v = 0; v < 2 * GROUP_CHUNKS; ++v) xv[plane][v] = _mm512_set1_epi32(dword(x[plane] + 32 * g + 4 * v));
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                const uint8_t* tile = tiles + t * stride;
                const uint8_t* unit = Group::unit(tile, g);
                __m512i dot[PLANES][2];
                group_dots<TYPE, PLANES>(tile, g, xv, dot);
                if constexpr (Group::HALVES == 2) {  // Q6_K: w = d sc (q - 32), sc per half group
                    const float summed[2] = {xq.xsum_half[g], xq.xsum[g] - xq.xsum_half[g]};
                    for (int half = 0; half < 2; ++half) {
                        const __m512i total = TWO ? combine(dot[0][half], dot[PLANES - 1][half]) : dot[0][half];
                        const __m512 part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), step,
                                                            _mm512_set1_ps(-Group::OFFSET * summed[half]));
                        scaled[t] = _mm512_fmadd_ps(part, Group::bytes(unit + Group::factors(g, half)), scaled[t]);
                    }
                } else {  // Q4_K, Q5_K: w = d sc q - dmin mn
                    const __m512i sums = _mm512_add_epi32(dot[0][0], dot[0][1]);
                    const __m512i total = TWO ? combine(sums, _mm512_add_epi32(dot[PLANES - 1][0], dot[PLANES - 1][1])) : sums;
                    const int64_t at = Group::factors(g, 0);
                    scaled[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(total), step), Group::bytes(unit + at),
                                                scaled[t]);
                    minimums[t] = _mm512_fmadd_ps(Group::bytes(unit + at + 128), _mm512_set1_ps(xq.xsum[g]), minimums[t]);
                }
            }
        }
        for (int t = 0; t < T; ++t) {
            const uint8_t* unit = Group::unit(tiles + t * stride, first);
            acc[t] = _mm512_fmadd_ps(Group::halves(unit + Group::HEAD), scaled[t], acc[t]);
            if constexpr (Group::SCALE_MIN)
                acc[t] = _mm512_fnmadd_ps(Group::halves(unit + Group::HEAD + 32), minimums[t], acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * TILE_ROWS, acc[t]);
}

constexpr int TILES_AT_ONCE = 4;  // tiles sharing a single token's broadcasts
#endif

constexpr int TILE_TOKENS = per_variant(4, 2, 1);  // tokens sharing one decoding of a group's levels

#if defined(AMX_TILES)
#include "tiles_amx.h"
#endif

template <int TYPE, bool TWO>
void tile_rows_typed(const uint8_t* tiles, const QuantizedRows& xq, float* y, int64_t out_features, int64_t t0,
                     int64_t t1) {
    const int64_t stride = tile_bytes(TYPE, xq.columns);
    alignas(64) float out[4 * TILE_ROWS];
    int64_t t = t0;
#if VARIANT == 2
    static_assert(TILES_AT_ONCE <= 4 && TILE_TOKENS <= 4, "out[] holds 4 tiles' rows");
    if (xq.rows == 1) {
        for (; t + TILES_AT_ONCE <= t1; t += TILES_AT_ONCE) {
            if constexpr (k_type(TYPE))
                k_tiles_one_token<TILES_AT_ONCE, TYPE, TWO>(tiles + t * stride, stride, xq, out);
            else
                tiles_one_token<TILES_AT_ONCE, TYPE, TWO>(tiles + t * stride, stride, xq, out);
            const int64_t first = t * TILE_ROWS;
            std::memcpy(y + first, out, std::min<int64_t>(TILES_AT_ONCE * TILE_ROWS, out_features - first) * 4);
        }
    }
#endif
    for (; t < t1; ++t) {
        const uint8_t* tile = tiles + t * stride;
        const int64_t first = t * TILE_ROWS;
        const int64_t count = std::min<int64_t>(TILE_ROWS, out_features - first);
        token_runs<TILE_TOKENS>(xq.rows, [&](int64_t m, auto run) {
            tile_tokens<decltype(run)::value, TYPE, TWO>(tile, xq, m, out);
            for (int r = 0; r < decltype(run)::value; ++r)
                std::memcpy(y + (m + r) * out_features + first, out + r * TILE_ROWS, count * sizeof(float));
        });
    }
}

template <int TYPE>
void tile_rows_of(const uint8_t* tiles, const QuantizedRows& xq, float* y, int64_t out_features, int64_t t0, int64_t t1) {
    by_planes(xq, [&](auto two) { tile_rows_typed<TYPE, decltype(two)::value>(tiles, xq, y, out_features, t0, t1); });
}

void tile_rows(int type, const uint8_t* tiles, const QuantizedRows& xq, float* y, int64_t out_features, int64_t t0,
               int64_t t1) {
    switch (type) {
        case Q4_0: return tile_rows_of<Q4_0>(tiles, xq, y, out_features, t0, t1);
        case Q4_1: return tile_rows_of<Q4_1>(tiles, xq, y, out_features, t0, t1);
        case Q5_0: return tile_rows_of<Q5_0>(tiles, xq, y, out_features, t0, t1);
        case Q5_1: return tile_rows_of<Q5_1>(tiles, xq, y, out_features, t0, t1);
        case Q8_0: return tile_rows_of<Q8_0>(tiles, xq, y, out_features, t0, t1);
        case Q4_K: return tile_rows_of<Q4_K>(tiles, xq, y, out_features, t0, t1);
        case Q5_K: return tile_rows_of<Q5_K>(tiles, xq, y, out_features, t0, t1);
        default: return tile_rows_of<Q6_K>(tiles, xq, y, out_features, t0, t1);
    }
}

}  // namespace VARIANT_NAMESPACE
}  // namespace llama_chat_kernels
