// Per-target tables behind ops_kernels() and the scalar building blocks the
// SIMD files reuse for their tails. Internal to src/kernels.
#pragma once

#include <math.h>

#include "kernels/ops.h"

namespace ebb::detail {

const OpsKernels& ops_kernels_scalar();
const OpsKernels& ops_kernels_ref_engine();  // ops_ref_engine.cpp

// RMSNorm's factor 1 / sqrt(mean(x^2) + eps) from sum_sq, the sum of the
// squares x[i] * x[i] each rounded to float, added in double. The mean is
// narrowed to float and the root and reciprocal taken in float, as the
// reference engine does: a factor one ulp away moves activations across
// 8-bit quantization steps downstream, so every target computes it this way.
// Double sums in different orders agree far below float rounding, so the SIMD
// targets may add the squares in any order and still give this factor.
// static: one copy per target file, built with that file's flags.
static inline float rms_scale(double sum_sq, int64_t n, float eps) {
  const float mean = static_cast<float>(sum_sq / static_cast<double>(n));
  return 1.0f / sqrtf(mean + eps);
}

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
