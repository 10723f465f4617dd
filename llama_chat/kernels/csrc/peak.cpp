// llama_chat::dot_product_rate: how many of one dot-product instruction this CPU completes a
// second on PyTorch's threads, with nothing else in the loop: the peak that the prompt
// kernels' products can approach (vpdpbusd for the AVX-512 variants, vpmaddubsw for AVX2),
// and vdpbf16ps beside it, alone and interleaved with vpdpbusd (whether the two share the
// CPU's pipes: interleaved, separate pipes would add their rates, shared ones split one).
// Each thread runs CHAINS independent accumulators, more than an instruction's latency
// times its throughput on any CPU measured, so the loop is bound by issue alone.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LLAMA_CHAT_X86 1
#endif

namespace llama_chat_kernels {
namespace {

constexpr int CHAINS = 12;  // instructions a round (vpmaddubsw: 6)

#if defined(LLAMA_CHAT_X86)
// Keeps a register's value alive without an instruction, so the loop is neither folded nor
// dropped; the chains are named variables (an array would live in memory, not registers).
#define KEEP(value) __asm__ volatile("" : "+v"(value))
#define SIX(DO) DO(0) DO(1) DO(2) DO(3) DO(4) DO(5)
#define TWELVE(DO) SIX(DO) DO(6) DO(7) DO(8) DO(9) DO(10) DO(11)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vpdpbusd_loop(int64_t rounds) {
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
#define START(i) __m512i acc##i = _mm512_set1_epi32(i);
#define STEP(i) acc##i = _mm512_dpbusd_epi32(acc##i, a, b); KEEP(acc##i);
    TWELVE(START)
    for (int64_t r = 0; r < rounds; ++r) {
        TWELVE(STEP)
    }
#undef START
#undef STEP
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void vdpbf16ps_loop(int64_t rounds) {
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f)), b = a;
#define START(i) __m512 acc##i = _mm512_set1_ps(float(i));
#define STEP(i) acc##i = _mm512_dpbf16_ps(acc##i, a, b); KEEP(acc##i);
    TWELVE(START)
    for (int64_t r = 0; r < rounds; ++r) {
        TWELVE(STEP)
    }
#undef START
#undef STEP
}

// Six chains each: one vpdpbusd, then one vdpbf16ps, and so on.
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16"))) void interleaved_loop(int64_t rounds) {
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    const __m512bh p = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f)), q = p;
#define START(i) __m512i integer##i = _mm512_set1_epi32(i); __m512 floating##i = _mm512_set1_ps(float(i));
#define STEP(i)                                                 \
    integer##i = _mm512_dpbusd_epi32(integer##i, a, b);         \
    floating##i = _mm512_dpbf16_ps(floating##i, p, q);          \
    KEEP(integer##i);                                           \
    KEEP(floating##i);
    SIX(START)
    for (int64_t r = 0; r < rounds; ++r) {
        SIX(STEP)
    }
#undef START
#undef STEP
}

// AVX2's mix: each product summed into 16-bit lanes, as the AVX2 kernels do, on 6 chains
// (16 vector registers only); each product an asm statement of its own (the same operands
// every time would otherwise be multiplied once and reused).
__attribute__((target("avx2"))) void vpmaddubsw_loop(int64_t rounds) {
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
#define START(i) __m256i acc##i = _mm256_set1_epi16(short(i));
#define STEP(i)                                                                            \
    {                                                                                      \
        __m256i product;                                                                   \
        __asm__ volatile("vpmaddubsw %2, %1, %0" : "=x"(product) : "x"(a), "x"(b));        \
        acc##i = _mm256_add_epi16(acc##i, product);                                        \
        KEEP(acc##i);                                                                      \
    }
    SIX(START)
    for (int64_t r = 0; r < rounds; ++r) {
        SIX(STEP)
    }
#undef START
#undef STEP
}
#undef SIX
#undef TWELVE
#undef KEEP
#endif

struct Instruction {
    const char* name;
    const char* needs;  // CPU features, for the error line
    bool (*supported)();
    void (*loop)(int64_t);
    int chains;  // instructions a round
};

#if defined(LLAMA_CHAT_X86)
bool has_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
bool has_bf16() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
}
bool has_both() { return has_vnni() && has_bf16(); }
bool has_avx2() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

const Instruction INSTRUCTIONS[] = {
    {"vpdpbusd", "AVX-512 VNNI", has_vnni, vpdpbusd_loop, CHAINS},
    {"vdpbf16ps", "AVX-512 BF16", has_bf16, vdpbf16ps_loop, CHAINS},
    {"vpdpbusd+vdpbf16ps", "AVX-512 VNNI and BF16", has_both, interleaved_loop, CHAINS},
    {"vpmaddubsw", "AVX2", has_avx2, vpmaddubsw_loop, CHAINS / 2},
};
#endif

// Instructions a second on all of PyTorch's threads, each running `rounds` rounds.
double dot_product_rate(const std::string& name, int64_t rounds) {
    TORCH_CHECK(rounds > 0, "llama_chat: rounds must be positive, not ", rounds);
#if defined(LLAMA_CHAT_X86)
    for (const Instruction& instruction : INSTRUCTIONS) {
        if (name != instruction.name) continue;
        TORCH_CHECK(instruction.supported(), "llama_chat: this CPU has no ", instruction.needs, " for ", name);
        const int64_t threads = at::get_num_threads();
        const auto start = std::chrono::steady_clock::now();
        at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) instruction.loop(rounds);
        });
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return double(threads) * double(rounds) * instruction.chains / seconds;
    }
    TORCH_CHECK(false, "llama_chat: no dot-product instruction named ", name,
                "; vpdpbusd, vdpbf16ps, vpdpbusd+vdpbf16ps or vpmaddubsw");
#else
    TORCH_CHECK(false, "llama_chat: dot-product rates are measured on x86-64 only, not for ", name);
#endif
}

}  // namespace
}  // namespace llama_chat_kernels

TORCH_LIBRARY_FRAGMENT(llama_chat, m) { m.def("dot_product_rate(str instruction, int rounds) -> float"); }

TORCH_LIBRARY_IMPL(llama_chat, CompositeExplicitAutograd, m) {
    m.impl("dot_product_rate", &llama_chat_kernels::dot_product_rate);
}
