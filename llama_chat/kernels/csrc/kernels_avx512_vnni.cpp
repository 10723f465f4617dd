// The AVX-512 variant with VNNI: 16-lane floats and vpdpbusd for the integer products.
// Standard and intrinsic headers come before the target pragma, so that their inline
// functions are compiled for every CPU (the linker keeps one copy of each).
#include "kernels_prelude.h"
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif
#define VARIANT 2
#define VARIANT_NAMESPACE avx512_vnni
#define KERNEL_SET_FUNCTION kernels_avx512_vnni
#include "kernels_impl.h"
#define ATTENTION_SET_FUNCTION attention_avx512_vnni
#include "attention_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
