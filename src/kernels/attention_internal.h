// The block kernels attention() is built from, one table per target and KV
// element type. Internal to src/kernels.
//
// The driver (attention.cpp) owns tiling, threads, causal masking and the
// online-softmax state; these kernels only see dense blocks:
//   q rows:  nr rows of head_dim floats, contiguous, already multiplied by scale
//   k, v:    np positions of head_dim elements, `kv_stride` elements apart
//            (one KV head inside a [chunk_size, n_kv_heads, head_dim] chunk)
//   s:       nr rows of scores / probabilities, `s_stride` floats apart
//   acc:     nr rows of head_dim floats, contiguous
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace ebb::detail {

struct AttnKernels {
  // s[r][j] = dot(q[r], k[j]) for r < nr, j < np.
  void (*qk)(const float* q, int nr, const void* k, int64_t kv_stride, int np, int64_t head_dim, float* s,
             int64_t s_stride) = nullptr;
  // One online-softmax step on one row of np scores of which the first
  // n_valid are visible (0 < n_valid <= np): with m' = max(m, max s[0..n_valid)),
  // s[j] = exp(s[j] - m') for j < n_valid and 0 after, l = l e^(m - m') + sum s,
  // m = m'. Returns the factor e^(m - m') the row's accumulator must take.
  float (*softmax_step)(float* s, int n_valid, int np, float* m, float* l) = nullptr;
  // acc[r] = acc[r] * corr[r] + sum_j p[r][j] * v[j] for r < nr.
  void (*pv)(const float* p, int64_t p_stride, const float* corr, int nr, const void* v, int64_t kv_stride, int np,
             int64_t head_dim, float* acc) = nullptr;
};

// kv: kF16 or kF32.
const AttnKernels& attn_kernels_scalar(DType kv);
#if defined(EBB_ARCH_X86)
// nullptr when head_dim is not a multiple of 8 (the scalar kernels serve then).
const AttnKernels* attn_kernels_avx2(DType kv, int64_t head_dim);  // attention_avx2.cpp
#endif

}  // namespace ebb::detail
