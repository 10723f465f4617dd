// llama_chat::read_bytes: a streaming read of a byte buffer on PyTorch's threads, for
// `llama-chat bench`'s measure of this machine's read bandwidth. A float32 sum by PyTorch
// keeps few loads in flight per thread and measured 29-34 GB/s where a decode step read
// 38.8; what decode can reach is what many independent loads in flight reach, so each
// thread folds its share with eight independent accumulators.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace llama_chat_kernels {

constexpr int64_t READ_CHUNK = 1 << 16;  // bytes a thread takes at a time
constexpr int LANES = 8;                  // independent accumulators of 16 bytes
typedef uint64_t Words __attribute__((vector_size(16)));  // what every x86-64 CPU loads at once

// The xor of the buffer's 8-byte words (a value the compiler must compute, so it reads
// every byte); the buffer's length must be a multiple of 128.
int64_t read_bytes(const at::Tensor& bytes) {
    TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.is_contiguous() && bytes.dim() == 1,
                "llama_chat: read_bytes takes contiguous uint8 [n]");
    const int64_t size = bytes.numel();
    TORCH_CHECK(size % int64_t(sizeof(Words) * LANES) == 0, "llama_chat: read_bytes takes a multiple of 128 bytes, not ", size);
    const uint8_t* data = bytes.const_data_ptr<uint8_t>();
    std::atomic<uint64_t> folded{0};
    at::parallel_for(0, (size + READ_CHUNK - 1) / READ_CHUNK, 16, [&](int64_t c0, int64_t c1) {
        Words lane[LANES] = {};
        const int64_t end = std::min(size, c1 * READ_CHUNK);
        for (int64_t at = c0 * READ_CHUNK; at < end; at += sizeof(lane)) {
            for (int j = 0; j < LANES; ++j) {
                Words words;
                std::memcpy(&words, data + at + j * sizeof(Words), sizeof(Words));
                lane[j] ^= words;
            }
        }
        uint64_t mine = 0;
        for (int j = 0; j < LANES; ++j) mine ^= lane[j][0] ^ lane[j][1];
        folded.fetch_xor(mine);
    });
    return int64_t(folded.load());
}

}  // namespace llama_chat_kernels

TORCH_LIBRARY_FRAGMENT(llama_chat, m) { m.def("read_bytes(Tensor bytes) -> int"); }

TORCH_LIBRARY_IMPL(llama_chat, CPU, m) { m.impl("read_bytes", &llama_chat_kernels::read_bytes); }
