// The operators PyTorch sees: llama_chat::block_linear, llama_chat::supported_variants and
// llama_chat::layout.
// Work is split over PyTorch's own threads; each piece runs one instruction-set variant.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <memory>
#include <sstream>
#include <string>

#include "blocks.h"
#include "kernels.h"

namespace llama_chat_kernels {

enum Variant : int64_t { PORTABLE = 0, AVX2 = 1, AVX512_VNNI = 2, AVX512_AMX = 3 };
// Their names for people and for LLAMA_CHAT_KERNEL_VARIANT, in that numbering.
constexpr const char* VARIANT_NAMES[] = {"portable", "avx2", "avx512-vnni", "avx512-amx"};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Whether the CPU has AMX's tiles and int8 products, the system saves their state (XCR0),
// and Linux grants this process the tile registers (asked once here: without the grant the
// first tile instruction is SIGILL).
static bool amx_granted() {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tiles = edx & (1u << 24), int8 = edx & (1u << 25);
    if (!tiles || !int8 || !__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
    unsigned low, high;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    if ((low & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA
#if defined(__linux__)
    constexpr long REQUEST_PERMISSION = 0x1023, TILE_DATA = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, REQUEST_PERMISSION, TILE_DATA) == 0;
#else
    return false;
#endif
}
#endif

// Bit v set: this CPU runs variant v.
static int64_t detect_variants() {
    int64_t bits = 1 << PORTABLE;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) bits |= 1 << AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni")) {
        bits |= 1 << AVX512_VNNI;
        if (amx_granted()) bits |= 1 << AVX512_AMX;
    }
#endif
    return bits;
}

int64_t supported_variants() {
    static const int64_t bits = detect_variants();  // asked once: every call checks its variant
    return bits;
}

// The weight layout and the variants, as JSON text, for Python to read rather than keep
// copies of (native.py): rows a tile holds, and per block type (by its ggml number) its
// block's weights and bytes, a unit's columns and bytes and where its float16 fields lie.
std::string layout() {
    std::ostringstream out;
    out << "{\"variants\": [";
    for (int v = PORTABLE; v <= AVX512_AMX; ++v) out << (v ? ", " : "") << '"' << VARIANT_NAMES[v] << '"';
    out << "], \"tile_rows\": " << TILE_ROWS << ", \"types\": {";
    bool first = true;
    for (int type : KNOWN_TYPES) {
        const TypeInfo info = type_info(type);
        out << (first ? "" : ", ") << '"' << type << "\": {\"block_weights\": " << info.block_weights
            << ", \"block_bytes\": " << info.block_bytes << ", \"unit_columns\": " << tile_unit_columns(type)
            << ", \"unit_bytes\": " << tile_unit_bytes(type) << ", \"halves_at\": " << halves_of(type).at
            << ", \"halves\": " << halves_of(type).count << "}";
        first = false;
    }
    out << "}}";
    return out.str();
}

static const KernelSet& kernel_set(int64_t variant) {
    TORCH_CHECK(variant >= 0 && variant <= AVX512_AMX, "llama_chat: unknown kernel variant ", variant);
    TORCH_CHECK(supported_variants() & (int64_t(1) << variant), "llama_chat: this CPU cannot run kernel variant ",
                variant);
    switch (variant) {
        case AVX2: return kernels_avx2();
        case AVX512_VNNI: return kernels_avx512_vnni();
        case AVX512_AMX: return kernels_avx512_amx();
        default: return kernels_portable();
    }
}

// y = x w^T, w [out_features, columns] in tiles of 16 rows (kernels.h); x is quantised in
// groups of 32 to activation_bits (8 or 16) for the integer kernels, or (16 bits, more
// tokens than SPLIT_MIN_ROWS, a variant with AMX) split into bfloat16 for the tile unit.
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& weight, int64_t block_type, int64_t out_features,
                        int64_t variant, int64_t activation_bits) {
    TORCH_CHECK(activation_bits == 8 || activation_bits == 16, "llama_chat: activation_bits must be 8 or 16, not ",
                activation_bits);
    // Range first: the int cast of a value beyond int would wrap onto a known type.
    TORCH_CHECK(block_type >= 0 && block_type <= 255 && known_type(int(block_type)),
                "llama_chat: unsupported block type ", block_type);
    TORCH_CHECK(out_features >= 0, "llama_chat: out_features is negative: ", out_features);
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "llama_chat: x must be contiguous float32");
    TORCH_CHECK(x.dim() >= 1, "llama_chat: x must have a dimension to multiply along");
    TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous(), "llama_chat: weight must be contiguous uint8");
    const TypeInfo info = type_info(int(block_type));
    const int64_t columns = x.size(-1);
    // Width 0 too: the rows are counted by dividing by it.
    TORCH_CHECK(columns > 0 && columns % info.block_weights == 0, "llama_chat: width ", columns,
                " is not whole blocks of ", info.block_weights, " weights");
    const int64_t expected = tile_count(out_features) * tile_bytes(int(block_type), columns);
    TORCH_CHECK(weight.numel() == expected, "llama_chat: weight holds ", weight.numel(), " bytes, not the ", expected,
                " of ", out_features, " rows of ", columns, " in tiles of 16");
    const KernelSet& kernels = kernel_set(variant);
    const int64_t rows = x.numel() / columns;
    auto out_shape = x.sizes().vec();
    out_shape.back() = out_features;
    at::Tensor y = at::empty(out_shape, x.options());
    const float* xp = x.const_data_ptr<float>();
    const uint8_t* wp = weight.const_data_ptr<uint8_t>();
    float* yp = y.mutable_data_ptr<float>();
    if (rows == 0 || out_features == 0) return y;

    if (kernels.split_tile_rows != nullptr && rows > SPLIT_MIN_ROWS && activation_bits == 16) {
        const int64_t blocks = (rows + SPLIT_BLOCK - 1) / SPLIT_BLOCK;
        std::unique_ptr<uint16_t, decltype(&std::free)> packed(
            static_cast<uint16_t*>(std::aligned_alloc(64, split_bytes(rows, columns))), &std::free);
        TORCH_CHECK(packed != nullptr, "llama_chat: out of memory for a prompt's activations");
        at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
            kernels.pack_split(xp, rows, columns, packed.get(), b0, b1);
        });
        at::parallel_for(0, tile_count(out_features), 1, [&](int64_t t0, int64_t t1) {
            kernels.split_tile_rows(int(block_type), wp, packed.get(), rows, columns, yp, out_features, t0, t1);
        });
        return y;
    }
    const int64_t groups = columns / X_GROUP;
    std::unique_ptr<uint8_t[]> high(new uint8_t[rows * columns]);
    std::unique_ptr<uint8_t[]> low(activation_bits == 16 ? new uint8_t[rows * columns] : nullptr);
    std::unique_ptr<float[]> xscale(new float[rows * groups]), xsum(new float[rows * groups]),
        xsum_half(new float[rows * groups]);
    at::parallel_for(0, rows, 1, [&](int64_t m0, int64_t m1) {
        kernels.quantize_rows(xp, columns, high.get(), low.get(), xscale.get(), xsum.get(), xsum_half.get(), m0, m1);
    });
    const QuantizedRows xq{high.get(), low.get(), xscale.get(), xsum.get(), xsum_half.get(), rows, columns};
    at::parallel_for(0, tile_count(out_features), 1, [&](int64_t t0, int64_t t1) {
        kernels.tile_rows(int(block_type), wp, xq, yp, out_features, t0, t1);
    });
    return y;
}

}  // namespace llama_chat_kernels

TORCH_LIBRARY(llama_chat, m) {
    m.def("block_linear(Tensor x, Tensor weight, int block_type, int out_features, int variant, "
          "int activation_bits) -> Tensor");
    m.def("supported_variants() -> int");
    m.def("layout() -> str");
}

TORCH_LIBRARY_IMPL(llama_chat, CPU, m) { m.impl("block_linear", &llama_chat_kernels::block_linear); }

TORCH_LIBRARY_IMPL(llama_chat, CompositeExplicitAutograd, m) {
    m.impl("supported_variants", &llama_chat_kernels::supported_variants);
    m.impl("layout", &llama_chat_kernels::layout);
}
