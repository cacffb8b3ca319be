// The per-target dispatch of the LoRA products (the kernels are in
// lora_scalar.cpp and lora_<target>.cpp).
#include "kernels/lora.h"
#include "kernels/lora_internal.h"
#include "platform/error.h"

namespace ebb {

const LoraKernels& lora_kernels(Isa isa) {
  EBB_CHECK_MSG(isa_supported(isa), "lora_kernels: instruction set not supported on this CPU");
  switch (isa) {
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2: return detail::lora_kernels_avx2();
    case Isa::kAvx512: return detail::lora_kernels_avx512();
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: return detail::lora_kernels_neon();
#endif
    // kRefEngine: the reference engine has no LoRA kernels of its own, so
    // the scalar reference stands in.
    default: return detail::lora_kernels_scalar();
  }
}

}  // namespace ebb
