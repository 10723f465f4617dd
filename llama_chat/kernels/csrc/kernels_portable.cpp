// The portable variant: plain C++, for CPUs without AVX2 (and the reference the others
// are tested beside).
// Standard and intrinsic headers come before the target pragma, so that their inline
// functions are compiled for every CPU (the linker keeps one copy of each).
#include "kernels_prelude.h"
#define VARIANT 0
#define VARIANT_NAMESPACE portable
#define KERNEL_SET_FUNCTION kernels_portable
#include "kernels_impl.h"
#define ATTENTION_SET_FUNCTION attention_portable
#include "attention_impl.h"
