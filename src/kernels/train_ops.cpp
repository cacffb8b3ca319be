// The per-target dispatch of the training kernels: each target's table is
// assembled once from the pieces its files fill in (train_ops_internal.h);
// the kernels are in train_ops_scalar.cpp and train_ops_<target>.cpp.
#include "kernels/train_ops.h"
#include "kernels/train_ops_internal.h"
#include "kernels/train_lora_internal.h"  // lora_backward_<target>: train_lora_*.cpp
#include "platform/error.h"

namespace ebb {
namespace {

TrainOpsKernels scalar_table() {
  TrainOpsKernels k;
  detail::fill_train_ops_scalar(k);
  k.lora_backward = detail::lora_backward_scalar;  // train_lora_scalar.cpp
  return k;
}

#if defined(EBB_ARCH_X86)
TrainOpsKernels avx2_table() {
  TrainOpsKernels k;
  detail::fill_train_ops_avx2(k);
  k.lora_backward = detail::lora_backward_avx2;  // train_lora_avx2.cpp
  return k;
}

TrainOpsKernels avx512_table() {
  TrainOpsKernels k;
  detail::fill_train_ops_avx512(k);
  k.lora_backward = detail::lora_backward_avx512;  // train_lora_avx512.cpp
  return k;
}
#endif

#if defined(EBB_ARCH_ARM)
TrainOpsKernels neon_table() {
  TrainOpsKernels k;
  detail::fill_train_ops_neon(k);
  k.lora_backward = detail::lora_backward_neon;  // train_lora_neon.cpp
  return k;
}
#endif

}  // namespace

const TrainOpsKernels& train_ops_kernels(Isa isa) {
  EBB_CHECK_MSG(isa_supported(isa), "train_ops_kernels: instruction set not supported on this CPU");
  switch (isa) {
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2: {
      static const TrainOpsKernels k = avx2_table();
      return k;
    }
    case Isa::kAvx512: {
      static const TrainOpsKernels k = avx512_table();
      return k;
    }
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: {
      static const TrainOpsKernels k = neon_table();
      return k;
    }
#endif
    // kRefEngine: the reference engine trains nothing, so the scalar
    // reference stands in.
    default: {
      static const TrainOpsKernels k = scalar_table();
      return k;
    }
  }
}

}  // namespace ebb
