// Scalar reference of the row operations (STYLE habit 2), the per-target
// dispatch, and rope_cos_sin.
#include <cmath>

#include "kernels/ops.h"
#include "kernels/ops_internal.h"
#include "platform/error.h"

namespace ebb {
namespace {

void rmsnorm_scalar(const float* x, const float* w, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float sq = x[i] * x[i];  // rounded to float, then added in double
    ss += static_cast<double>(sq);
  }
  const float scale = detail::rms_scale(ss, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void swiglu_scalar(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_scalar(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax_scalar(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_scalar(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_sin,
                 RopeStyle style) {
  for (int64_t h = 0; h < n_heads; ++h) detail::rope_head_scalar(x + h * head_dim, 0, rot_dim, cos_sin, style);
}

}  // namespace

namespace detail {
void rope_head_scalar(float* v, int64_t i0, int64_t rot_dim, const float* cos_sin, RopeStyle style) {
  const int64_t half = rot_dim / 2;
  for (int64_t i = i0; i < half; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    float* a = style == RopeStyle::kNorm ? v + 2 * i : v + i;
    float* b = style == RopeStyle::kNorm ? v + 2 * i + 1 : v + i + half;
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
  }
}

const OpsKernels& ops_kernels_scalar() {
  static const OpsKernels k{rmsnorm_scalar, swiglu_scalar, add_scalar, softmax_scalar, rope_scalar, rope_cos_sin};
  return k;
}
}  // namespace detail

const OpsKernels& ops_kernels(Isa isa) {
  EBB_CHECK_MSG(isa_supported(isa), "ops_kernels: instruction set not supported on this CPU");
  switch (isa) {
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2: return detail::ops_kernels_avx2();
    case Isa::kAvx512: return detail::ops_kernels_avx512();
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: return detail::ops_kernels_neon();
#endif
    case Isa::kRefEngine: return detail::ops_kernels_ref_engine();
    default: return detail::ops_kernels_scalar();
  }
}

void rope_cos_sin(int64_t pos, int64_t rot_dim, float base, float freq_scale, float* cos_sin, const float* factors) {
  // In double: at pos ~ 1e5 a float angle would already be off by ~1e-2 rad.
  const double p = static_cast<double>(pos) * static_cast<double>(freq_scale);
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    double theta = p * std::pow(static_cast<double>(base), -static_cast<double>(2 * i) / static_cast<double>(rot_dim));
    if (factors) theta /= static_cast<double>(factors[i]);
    cos_sin[2 * i] = static_cast<float>(std::cos(theta));
    cos_sin[2 * i + 1] = static_cast<float>(std::sin(theta));
  }
}

}  // namespace ebb
