// The AVX-512 variant with AMX: the avx512-vnni kernels, but a prompt's tokens against tiled
// matrices run on the tile unit (tiles_amx.h). Compiled as a variant of its own so that the
// others never carry tile instructions; ops.cpp offers it only where the CPU has AMX and
// Linux has granted the process its tile registers.
#include "kernels_prelude.h"
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,avx512bf16,amx-tile,amx-bf16"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,avx512bf16,amx-tile,amx-bf16")
#endif
#define VARIANT 2
#define AMX_TILES 1
#define VARIANT_NAMESPACE avx512_amx
#define KERNEL_SET_FUNCTION kernels_avx512_amx
#include "kernels_impl.h"
#define ATTENTION_SET_FUNCTION attention_avx512_amx
#include "attention_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
