// Per-target tables behind lora_kernels(). Internal to src/kernels.
#pragma once

#include "kernels/lora.h"

namespace ebb::detail {

const LoraKernels& lora_kernels_scalar();  // lora_scalar.cpp
#if defined(EBB_ARCH_X86)
const LoraKernels& lora_kernels_avx2();    // lora_avx2.cpp
const LoraKernels& lora_kernels_avx512();  // lora_avx512.cpp
#endif
#if defined(EBB_ARCH_ARM)
const LoraKernels& lora_kernels_neon();  // lora_neon.cpp
#endif

}  // namespace ebb::detail
