// aarch64 NEON row operations. Tails go through a padded group of four in
// the same vector code, so every element sees the same arithmetic; RoPE and
// the final RMSNorm products round exactly as the scalar reference (Arm
// builds use -ffp-contract=off, so nothing is fused that is not spelled out).
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "kernels/ops_internal.h"
#include "kernels/ops_neon.h"

namespace ebb {
namespace {

using neon::exp_ps;

// Runs f(float* group) over x[0..n) in groups of four; the last partial group
// is copied into a buffer padded with `pad`, processed, and copied back.
template <typename F>
inline void for_groups(float* x, int64_t n, float pad, F f) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) f(x + i, i);
  if (i < n) {
    float t[4] = {pad, pad, pad, pad};
    std::memcpy(t, x + i, (n - i) * sizeof(float));
    f(t, i);
    std::memcpy(x + i, t, (n - i) * sizeof(float));
  }
}

// A group of four of p starting at element i, zero-padded past n.
inline float32x4_t load_part(const float* p, int64_t i, int64_t n) {
  if (i + 4 <= n) return vld1q_f32(p + i);
  float t[4] = {};
  std::memcpy(t, p + i, (n - i) * sizeof(float));
  return vld1q_f32(t);
}

void rmsnorm_neon(const float* x, const float* w, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares rounded to float, summed in double (see rms_scale).
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = vdupq_n_f64(0.0);
  for (int64_t i = 0; i < n; i += 4) {
    const float32x4_t a = load_part(x, i, n), sq = vmulq_f32(a, a);
    s0 = vaddq_f64(s0, vcvt_f64_f32(vget_low_f32(sq)));
    s1 = vaddq_f64(s1, vcvt_high_f64_f32(sq));
  }
  const float scale = detail::rms_scale(vaddvq_f64(vaddq_f64(s0, s1)), n, eps);
  // (x * scale) * w, as the scalar row. y may alias x: each group is read
  // before it is written.
  if (y != x) std::memcpy(y, x, n * sizeof(float));
  for_groups(y, n, 0.f, [&](float* g, int64_t at) {
    vst1q_f32(g, vmulq_f32(vmulq_n_f32(vld1q_f32(g), scale), load_part(w, at, n)));
  });
}

void swiglu_neon(const float* gate, const float* up, float* y, int64_t n) {
  if (y != gate) std::memcpy(y, gate, n * sizeof(float));
  for_groups(y, n, 0.f, [&](float* g, int64_t at) {
    const float32x4_t v = vld1q_f32(g);
    const float32x4_t e = exp_ps(vnegq_f32(v));
    vst1q_f32(g, vmulq_f32(vdivq_f32(v, vaddq_f32(vdupq_n_f32(1.0f), e)), load_part(up, at, n)));
  });
}

void add_neon(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

void softmax_neon(float* x, int64_t n) {
  if (n <= 0) return;
  const float ninf = -__builtin_inff();
  float32x4_t mx = vdupq_n_f32(ninf);
  for_groups(x, n, ninf, [&](float* g, int64_t) { mx = vmaxq_f32(mx, vld1q_f32(g)); });
  const float32x4_t m = vdupq_n_f32(vmaxvq_f32(mx));
  float32x4_t sum = vdupq_n_f32(0.f);
  // Padding is -inf: e^(-inf) = 0 adds nothing to the sum.
  for_groups(x, n, ninf, [&](float* g, int64_t) {
    const float32x4_t e = exp_ps(vsubq_f32(vld1q_f32(g), m));
    vst1q_f32(g, e);
    sum = vaddq_f32(sum, e);
  });
  const float inv = 1.0f / vaddvq_f32(sum);
  for_groups(x, n, 0.f, [&](float* g, int64_t) { vst1q_f32(g, vmulq_n_f32(vld1q_f32(g), inv)); });
}

// (a, b) -> (a c - b s, a s + b c), products rounded, then the sums: the
// scalar row's arithmetic.
inline void rotate(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t s, float32x4_t* ra, float32x4_t* rb) {
  *ra = vsubq_f32(vmulq_f32(a, c), vmulq_f32(b, s));
  *rb = vaddq_f32(vmulq_f32(a, s), vmulq_f32(b, c));
}

void rope_neon(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_sin, RopeStyle style) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    int64_t i = 0;
    for (; i + 4 <= half; i += 4) {
      const float32x4x2_t cs = vld2q_f32(cos_sin + 2 * i);  // val[0]: cos, val[1]: sin
      if (style == RopeStyle::kNorm) {
        float32x4x2_t p = vld2q_f32(v + 2 * i);  // val[0]: elements 2i, val[1]: 2i + 1
        rotate(p.val[0], p.val[1], cs.val[0], cs.val[1], &p.val[0], &p.val[1]);
        vst2q_f32(v + 2 * i, p);
      } else {
        float32x4_t a, b;
        rotate(vld1q_f32(v + i), vld1q_f32(v + i + half), cs.val[0], cs.val[1], &a, &b);
        vst1q_f32(v + i, a);
        vst1q_f32(v + i + half, b);
      }
    }
    detail::rope_head_scalar(v, i, rot_dim, cos_sin, style);
  }
}

}  // namespace

namespace detail {
const OpsKernels& ops_kernels_neon() {
  static const OpsKernels k{rmsnorm_neon, swiglu_neon, add_neon, softmax_neon, rope_neon, rope_cos_sin};
  return k;
}
}  // namespace detail

}  // namespace ebb
