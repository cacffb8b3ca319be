// Attention kernels of the ref-engine target (Isa::kRefEngine): the scalar
// kernels, with the F16-KV scores summed as the reference engine's AVX-512
// build sums them and its softmax sum fused. pv_seq (fma, then F16 rounding)
// is the scalar kernel's.
#include <math.h>

#include "kernels/attention_internal.h"
#include "platform/fp16.h"

namespace ebb::detail {
namespace {

// dot(q, k) of one head, q already rounded to F16 values: 4 accumulators of
// 16 lanes; steps of 64 elements, element 64 i + 16 j + l fused into lane l
// of accumulator j. Then (acc0 + acc2) + (acc1 + acc3), the 16 lanes halved
// (upper half added to lower) down to one, widened to double; elements past
// the last whole step added in double one by one, each product rounded to
// float first; the sum rounded to float.
float dot_f16_ref(const float* q, const uint16_t* k, int64_t n) {
  float acc[4][16] = {};
  const int64_t whole = n / 64 * 64;
  for (int64_t i = 0; i < whole; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 16; ++l) acc[j][l] = fmaf(q[i + 16 * j + l], fp16_to_fp32(k[i + 16 * j + l]), acc[j][l]);
  float x[16];
  for (int l = 0; l < 16; ++l) x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) x[l] = x[l + w] + x[l];
  double sum = x[0];
  for (int64_t i = whole; i < n; ++i) {
    const float p = q[i] * fp16_to_fp32(k[i]);
    sum += static_cast<double>(p);
  }
  return static_cast<float>(sum);
}

void qk_ref_f16(const float* q, int nr, const void* k, int64_t kv_stride, int np, int64_t hd, float* s,
                int64_t s_stride) {
  const auto* kb = static_cast<const uint16_t*>(k);
  for (int j = 0; j < np; ++j)
    for (int r = 0; r < nr; ++r) s[r * s_stride + j] = dot_f16_ref(q + r * hd, kb + j * kv_stride, hd);
}

// seq_weights (see attention_internal.h) with the running sum updated by one
// fused multiply-add, l = fma(l, ms, vs), as the reference engine's compiler
// contracts it; the exponentials are libm's expf.
void seq_weights_ref(float* s, float* ms, int n_valid, float scale, float* m, float* l) {
  float mx = *m, sum = *l;
  for (int j = 0; j < n_valid; ++j) {
    const float x = s[j] * scale;
    float a = 1.0f, b = 1.0f;
    if (x > mx) {
      a = expf(mx - x);  // 0 at the first position (mx = -inf)
      mx = x;
    } else {
      b = expf(x - mx);
    }
    ms[j] = a;
    s[j] = b;
    sum = fmaf(sum, a, b);
  }
  *m = mx;
  *l = sum;
}

}  // namespace

const AttnKernels& attn_kernels_ref_engine(DType kv) {
  static const AttnKernels f16 = [] {
    AttnKernels k = attn_kernels_scalar(DType::kF16);
    k.qk = qk_ref_f16;
    k.seq_weights = seq_weights_ref;
    return k;
  }();
  return kv == DType::kF16 ? f16 : attn_kernels_scalar(kv);
}

}  // namespace ebb::detail
