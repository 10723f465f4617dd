// Attention of a step's new tokens over the KV cache, as each instruction-set variant
// provides it (plain functions over raw memory, as kernels.h; attention_ops.cpp splits the
// work over threads and merges the pieces).
//
// The query heads that share a key/value head (n_rep of them, for each of the T new
// tokens) are one group of rows: every key and value of that head is read once for all of
// them. A span of positions gives each row a partial softmax, (running maximum, sum of
// exponentials, weighted sum of values), which spans of the same rows merge exactly.
#pragma once

#include <cstdint>

namespace llama_chat_kernels {

enum CacheType : int { CACHE_FLOAT32 = 0, CACHE_FLOAT16 = 1, CACHE_BFLOAT16 = 2 };

// One key/value head's positions to attend over.
struct KeyValueSpan {
    const void* keys;     // the first position's key, of `type`
    const void* values;   // alike
    int type;             // CacheType
    int64_t key_stride;   // elements from one position's key to the next
    int64_t value_stride; // alike
    int64_t count;        // positions
    const float* bias;    // added to each position's score, or null
    int64_t bias_stride;  // from one token's biases to the next's (0: every token the same)
    bool causal;          // the new tokens themselves: row (t, r) sees positions 0..first_token + t only
    int64_t window;       // causal spans: and only the last `window` of those (0: all)
};

// The query rows of one key/value head: row t * n_rep + r is token t's query head
// head * n_rep + r, at q + t * token_stride + r * head_dim.
struct QueryRows {
    const float* q;
    int64_t token_stride;
    int64_t tokens;
    int64_t first_token;  // the rows' first token's place among the step's new tokens
    int64_t n_rep;
    int64_t head_dim;
    float scale;          // applied to every dot product (1 / sqrt(head_dim))
    float softcap;        // scores capped to softcap * tanh(score / softcap) (0: not capped)
    int64_t step_tokens;  // the step's new tokens: a prompt chunk's (more than 32) go to the tile unit, where there is one
};

// A row's partial softmax in `state`: [maximum, sum, head_dim weighted values], one after
// another for each row.
inline int64_t state_floats(int64_t head_dim) { return head_dim + 2; }

struct AttentionKernels {
    // The partial softmax of every row in `rows` over `span`, into state (rows * state_floats).
    void (*attend_span)(const QueryRows& rows, const KeyValueSpan& span, float* state);
};

const AttentionKernels& attention_portable();
const AttentionKernels& attention_avx2();
const AttentionKernels& attention_avx512_vnni();
const AttentionKernels& attention_avx512_amx();

}  // namespace llama_chat_kernels
