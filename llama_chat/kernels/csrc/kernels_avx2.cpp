// The AVX2 variant (with FMA): 8-lane floats and vpmaddubsw for the integer products.
// Standard and intrinsic headers come before the target pragma, so that their inline
// functions are compiled for every CPU (the linker keeps one copy of each).
#include "kernels_prelude.h"
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#define VARIANT 1
#define VARIANT_NAMESPACE avx2
#define KERNEL_SET_FUNCTION kernels_avx2
#include "kernels_impl.h"
#define ATTENTION_SET_FUNCTION attention_avx2
#include "attention_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
