// The operator llama_chat::cache_attention: a step's new tokens attending over the KV cache
// and over themselves (causally), under one softmax, reading the cache where it lies in its
// own dtype. The cached positions of each key/value head are cut into chunks so that every
// thread has as many as the others (a model with 3 key/value heads on 2 threads would
// otherwise leave one idle a third of the time); the chunks' partial softmaxes merge
// exactly. A prompt chunk's many tokens are also cut into runs.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

#include "attention.h"

namespace llama_chat_kernels {

int64_t supported_variants();  // ops.cpp

// Cached positions a chunk holds at least: fewer cost more to merge than they save.
constexpr int64_t MIN_CHUNK = 128;
// New tokens a run holds at least, and runs a thread gets at most (several, so that the
// pairing of early and late runs evens out the threads' work).
constexpr int64_t MIN_RUN = 16;
constexpr int64_t RUNS_A_THREAD = 4;

static const AttentionKernels& attention_kernels(int64_t variant) {
    TORCH_CHECK(variant >= 0 && variant <= 3, "llama_chat: unknown kernel variant ", variant);
    TORCH_CHECK(supported_variants() & (int64_t(1) << variant), "llama_chat: this CPU cannot run kernel variant ",
                variant);
    switch (variant) {
        case 1: return attention_avx2();
        case 2: return attention_avx512_vnni();
        case 3: return attention_avx512_amx();
        default: return attention_portable();
    }
}

static int cache_type(const at::Tensor& cache) {
    switch (cache.scalar_type()) {
        case at::kFloat: return CACHE_FLOAT32;
        case at::kHalf: return CACHE_FLOAT16;
        case at::kBFloat16: return CACHE_BFLOAT16;
        default: TORCH_CHECK(false, "llama_chat: the cache must be float32, float16 or bfloat16, not ", cache.scalar_type());
    }
}

// Token rows [tokens, heads, head_dim] whose heads lie side by side (tokens may be apart).
static void check_rows(const at::Tensor& t, const char* name, int64_t head_dim) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 3, "llama_chat: ", name,
                " must be float32 [tokens, heads, head_dim]");
    TORCH_CHECK(t.size(2) == head_dim && t.stride(2) == 1 && t.stride(1) == head_dim, "llama_chat: ", name,
                " must hold each token's heads side by side, head_dim ", head_dim);
}

// q [T, heads, head_dim], new_keys and new_values [T, kv_heads, head_dim] (float32),
// past_keys and past_values [kv_heads, capacity, head_dim] (float32, float16 or bfloat16)
// whose first `position` positions are scored: all visible, or with past_mask added to their
// scores where one is given (0 seen, -inf hidden): [position] alike for every token, or
// [T, position] a row a token (a windowed layer's ring); softmax(q k^T scale) v over every
// position, [T, heads, head_dim] float32.
// Among themselves the new tokens attend causally, each to the last `window` of them at most
// (0: all); softcap > 0 caps every score.
at::Tensor cache_attention(const at::Tensor& q, const at::Tensor& new_keys, const at::Tensor& new_values,
                           const at::Tensor& past_keys, const at::Tensor& past_values, int64_t position,
                           const std::optional<at::Tensor>& past_mask, double scale, int64_t window, double softcap,
                           int64_t variant) {
    const AttentionKernels& kernels = attention_kernels(variant);
    TORCH_CHECK(q.dim() == 3, "llama_chat: q must be [tokens, heads, head_dim]");
    const int64_t tokens = q.size(0), heads = q.size(1), head_dim = q.size(2);
    check_rows(q, "q", head_dim);
    check_rows(new_keys, "new_keys", head_dim);
    check_rows(new_values, "new_values", head_dim);
    const int64_t kv_heads = new_keys.size(1);
    TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "llama_chat: ", heads, " query heads do not share ", kv_heads,
                " key/value heads evenly");
    TORCH_CHECK(new_keys.sizes() == new_values.sizes() && new_keys.size(0) == tokens,
                "llama_chat: new_keys and new_values must be [tokens, kv_heads, head_dim] as q's tokens");
    TORCH_CHECK(past_keys.dim() == 3 && past_keys.sizes() == past_values.sizes() && past_keys.size(0) == kv_heads &&
                    past_keys.size(2) == head_dim,
                "llama_chat: past_keys and past_values must be [kv_heads, capacity, head_dim]");
    TORCH_CHECK(past_keys.scalar_type() == past_values.scalar_type() && past_keys.is_contiguous() &&
                    past_values.is_contiguous(),
                "llama_chat: past_keys and past_values must be contiguous, of one dtype");
    const int type = cache_type(past_keys);
    TORCH_CHECK(window >= 0 && softcap >= 0, "llama_chat: window and softcap must not be negative");
    const int64_t capacity = past_keys.size(1);
    TORCH_CHECK(position >= 0 && position <= capacity, "llama_chat: ", position, " positions past a cache of ",
                capacity);
    const float* bias = nullptr;  // none: every held position visible
    int64_t bias_stride = 0;
    if (past_mask.has_value()) {
        const at::Tensor& given = *past_mask;
        TORCH_CHECK(given.scalar_type() == at::kFloat && given.is_contiguous() &&
                        (given.dim() == 1 || (given.dim() == 2 && given.size(0) == tokens)) &&
                        given.size(-1) == position,
                    "llama_chat: past_mask must be contiguous float32 [position] or [tokens, position]");
        bias = given.const_data_ptr<float>();
        bias_stride = given.dim() == 2 ? position : 0;
    }

    at::Tensor out = at::empty({tokens, heads, head_dim}, q.options());
    const int64_t n_rep = heads / kv_heads, rows = tokens * n_rep, state_size = state_floats(head_dim);
    if (tokens == 0 || head_dim == 0) return out;
    // A piece of the work is a key/value head's run of new tokens over a chunk of its cached
    // positions. Chunks a head: the fewest that give every thread as many (kv_heads * chunks
    // a multiple of the threads), none under MIN_CHUNK positions; at least one, which also
    // takes the new tokens. They depend on the position alone, so that a token's sums run
    // in the same order whatever the number of tokens in its step. Runs: one for a few
    // tokens, more for a prompt chunk's many.
    const int64_t threads = at::get_num_threads();
    const int64_t even = threads / std::gcd(kv_heads, threads);
    const int64_t chunks = std::max<int64_t>(1, std::min(even, position / MIN_CHUNK));
    const int64_t chunk_length = (position + chunks - 1) / chunks;
    const int64_t runs = std::clamp<int64_t>(tokens / MIN_RUN, 1, RUNS_A_THREAD * threads);
    const int64_t run_length = (tokens + runs - 1) / runs;
    // states: [head][chunk][row], a run filling its own rows.
    std::unique_ptr<float[]> states(new float[kv_heads * chunks * rows * state_size]);
    const int64_t element_bytes = past_keys.element_size();
    const char* keys = static_cast<const char*>(past_keys.const_data_ptr());
    const char* values = static_cast<const char*>(past_values.const_data_ptr());

    at::parallel_for(0, kv_heads * chunks * runs, 1, [&](int64_t begin, int64_t end) {
        for (int64_t piece = begin; piece < end; ++piece) {
            const int64_t head = piece / (chunks * runs), chunk = piece / runs % chunks;
            // Runs in the order first, last, second, second last...: a later run sees more of
            // the new tokens, so a thread's consecutive pieces pair cheap with dear.
            const int64_t turn = piece % runs, run = turn % 2 ? runs - 1 - turn / 2 : turn / 2;
            const int64_t first_token = std::min(tokens, run * run_length);
            const int64_t run_tokens = std::min(tokens, first_token + run_length) - first_token;
            if (run_tokens == 0) continue;
            const QueryRows query{q.const_data_ptr<float>() + first_token * q.stride(0) + head * n_rep * head_dim,
                                  q.stride(0), run_tokens, first_token, n_rep, head_dim, float(scale), float(softcap),
                                  tokens};
            float* state = states.get() + ((head * chunks + chunk) * rows + first_token * n_rep) * state_size;
            for (int64_t row = 0; row < run_tokens * n_rep; ++row) {
                state[row * state_size] = -INFINITY;
                std::fill(state + row * state_size + 1, state + (row + 1) * state_size, 0.0f);
            }
            const int64_t first = std::min(position, chunk * chunk_length);
            const int64_t offset = (head * capacity + first) * head_dim * element_bytes;
            const KeyValueSpan past{keys + offset, values + offset, type, head_dim, head_dim,
                                    std::min(position, first + chunk_length) - first, bias ? bias + first : nullptr,
                                    bias_stride, false, 0};
            kernels.attend_span(query, past, state);
            if (chunk == chunks - 1) {  // the new tokens up to the run's last
                const KeyValueSpan fresh{new_keys.const_data_ptr<float>() + head * head_dim,
                                         new_values.const_data_ptr<float>() + head * head_dim, CACHE_FLOAT32,
                                         new_keys.stride(0), new_values.stride(0), first_token + run_tokens, nullptr,
                                         0, true, window};
                kernels.attend_span(query, fresh, state);
            }
        }
    });

    // Merge each row's chunks: each rescaled to the largest maximum, then divided by the sum.
    float* out_data = out.mutable_data_ptr<float>();
    for (int64_t head = 0; head < kv_heads; ++head) {
        for (int64_t row = 0; row < rows; ++row) {
            const int64_t t = row / n_rep, r = row % n_rep;
            float* target = out_data + (t * heads + head * n_rep + r) * head_dim;
            const float* first_state = states.get() + (head * chunks * rows + row) * state_size;
            float maximum = -INFINITY;
            for (int64_t chunk = 0; chunk < chunks; ++chunk)
                maximum = std::max(maximum, first_state[chunk * rows * state_size]);
            float total = 0.0f;
            std::fill(target, target + head_dim, 0.0f);
            for (int64_t chunk = 0; chunk < chunks; ++chunk) {
                const float* state = first_state + chunk * rows * state_size;
                if (state[0] == -INFINITY) continue;  // nothing visible in this chunk
                const float weight = std::exp(state[0] - maximum);
                total += state[1] * weight;
                for (int64_t d = 0; d < head_dim; ++d) target[d] += state[2 + d] * weight;
            }
            for (int64_t d = 0; d < head_dim; ++d) target[d] /= total;
        }
    }
    return out;
}

}  // namespace llama_chat_kernels

TORCH_LIBRARY_FRAGMENT(llama_chat, m) {
    m.def("cache_attention(Tensor q, Tensor new_keys, Tensor new_values, Tensor past_keys, Tensor past_values, "
          "SymInt position, Tensor? past_mask, float scale, int window, float softcap, int variant) -> Tensor");
}

TORCH_LIBRARY_IMPL(llama_chat, CPU, m) { m.impl("cache_attention", &llama_chat_kernels::cache_attention); }
