// Per-target tables behind ops_kernels() and the scalar building blocks the
// SIMD files reuse for their tails. Internal to src/kernels.
#pragma once

#include "kernels/ops.h"

namespace ebb::detail {

const OpsKernels& ops_kernels_scalar();

// Rotates the pairs i0 <= i < rot_dim / 2 of one head v by cos_sin (the
// scalar RoPE, also the tail of the SIMD versions).
void rope_head_scalar(float* v, int64_t i0, int64_t rot_dim, const float* cos_sin, RopeStyle style);
#if defined(EBB_ARCH_X86)
const OpsKernels& ops_kernels_avx2();    // ops_avx2.cpp
const OpsKernels& ops_kernels_avx512();  // ops_avx512.cpp
#endif
#if defined(EBB_ARCH_ARM)
const OpsKernels& ops_kernels_neon();  // ops_neon.cpp
#endif

}  // namespace ebb::detail
