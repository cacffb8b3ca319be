// Per-target pieces behind train_ops_kernels(). Internal to src/kernels.
// Each file fills the members of TrainOpsKernels it implements into a table
// and leaves the others alone; train_ops.cpp assembles one table per target
// from these pieces (a target that gains a kernel file gains one call there).
#pragma once

#include "kernels/train_ops.h"
#include "platform/error.h"

namespace ebb::detail {

// The checks every target's attention kernels make before they start: whole
// groups of query heads over each KV head (a bug otherwise, not bad input).
static inline int64_t attention_group(int64_t n_heads, int64_t n_kv_heads) {
  EBB_CHECK_MSG(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  return n_heads / n_kv_heads;
}
// cross_entropy's target must be a token of the vocabulary.
static inline void check_target(int64_t n_vocab, int32_t target) {
  EBB_CHECK_MSG(target >= 0 && target < n_vocab, "cross_entropy: target outside the vocabulary");
}

// rmsnorm_backward, swiglu_backward, attention_forward, attention_backward,
// cross_entropy:
void fill_train_ops_scalar(TrainOpsKernels& k);  // train_ops_scalar.cpp (the reference)
#if defined(EBB_ARCH_X86)
void fill_train_ops_avx2(TrainOpsKernels& k);    // train_ops_avx2.cpp
void fill_train_ops_avx512(TrainOpsKernels& k);  // train_ops_avx512.cpp
#endif
#if defined(EBB_ARCH_ARM)
void fill_train_ops_neon(TrainOpsKernels& k);  // train_ops_neon.cpp
#endif

// lora_backward: train_lora_*.cpp (their fill functions are declared here)

}  // namespace ebb::detail
