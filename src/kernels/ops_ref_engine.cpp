// Row operations of the ref-engine target (Isa::kRefEngine): scalar code that
// rounds where and as the reference engine's x86 AVX-512 build does, so its
// logits can be reproduced to print precision. Where that engine's rounding
// is already ebb's (RMSNorm, the residual add), the scalar kernels serve.
#include <math.h>

#include "kernels/ops_internal.h"

namespace ebb::detail {
namespace {

// e^x as the reference engine's vectorised SiLU computes it: n = x log2(e)
// rounded to an integer by adding and subtracting 1.5 * 2^23, b = x - n ln2
// with ln2 in two parts (each step one fused multiply-add), e^b by a degree-5
// polynomial evaluated as (p5 b + p4) u + (p3 b + p2), times u, plus
// (p1 b + 1), u = b^2; the result scaled by 2^n exactly. |n| > 192 gives 0
// (x < 0) or inf. Error about 1.5 ulp, so it differs from libm's expf in the
// last bit for many x: that bit is what this target reproduces.
float expf_silu(float x) {
  const float shift = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, shift);
  const float n = z - shift;
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  if (fabsf(n) > 192.0f) return n > 0.0f ? INFINITY : 0.0f;
  const float u = b * b;
  const float hi = fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f));
  const float j = fmaf(hi, u, fmaf(0x1.ffffecp-1f, b, 1.0f));
  return ldexpf(j, static_cast<int>(n));  // exact: j * 2^n
}

// silu(g) * up in groups of 16 with expf_silu; the elements past the last
// whole group (the reference engine's scalar tail) with libm's expf.
void swiglu_ref(const float* gate, const float* up, float* y, int64_t n) {
  const int64_t whole = n / 16 * 16;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float e = i < whole ? expf_silu(0.0f - g) : expf(-g);
    const float silu = g / (1.0f + e);
    y[i] = silu * up[i];
  }
}

// The rotation as the reference engine's C compiles with FMA contraction:
// x0 c - x1 s = fma(x0, c, -(x1 s)) and x0 s + x1 c = fma(x0, s, x1 c).
void rope_ref(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_sin, RopeStyle style) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      float* a = style == RopeStyle::kNorm ? v + 2 * i : v + i;
      float* b = style == RopeStyle::kNorm ? v + 2 * i + 1 : v + i + half;
      const float x0 = *a, x1 = *b;
      *a = fmaf(x0, c, -(x1 * s));
      *b = fmaf(x0, s, x1 * c);
    }
  }
}

// The reference engine's angles, all in float: theta_0 = pos, theta_(i+1) =
// theta_i * base^(-2 / rot_dim) (one powf, then repeated multiplication), each
// divided by its factor and multiplied by freq_scale, then cosf and sinf.
// Less accurate than rope_cos_sin's double angles at large positions (the
// product drifts by an ulp per step); it is what the golden logits used.
void rope_angles_ref(int64_t pos, int64_t rot_dim, float base, float freq_scale, float* cos_sin,
                     const float* factors) {
  const float theta_scale = powf(base, -2.0f / static_cast<float>(rot_dim));
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    const float ff = factors ? factors[i] : 1.0f;
    const float t = freq_scale * (theta / ff);
    cos_sin[2 * i] = cosf(t);
    cos_sin[2 * i + 1] = sinf(t);
    theta *= theta_scale;
  }
}

}  // namespace

const OpsKernels& ops_kernels_ref_engine() {
  const OpsKernels& s = ops_kernels_scalar();
  static const OpsKernels k{s.rmsnorm, swiglu_ref, s.add, s.softmax, rope_ref, rope_angles_ref};
  return k;
}

}  // namespace ebb::detail
