// Per-target tables behind ops_kernels() and the scalar building blocks the
// SIMD files reuse for their tails. Internal to src/kernels.
#pragma once

#include "kernels/ops.h"

namespace ebb::detail {

const OpsKernels& ops_kernels_scalar();
#if defined(EBB_ARCH_X86)
const OpsKernels& ops_kernels_avx2();    // ops_avx2.cpp
const OpsKernels& ops_kernels_avx512();  // ops_avx512.cpp
#endif
#if defined(EBB_ARCH_ARM)
const OpsKernels& ops_kernels_neon();  // ops_neon.cpp
#endif

}  // namespace ebb::detail
