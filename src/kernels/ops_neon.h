// NEON helpers shared by the aarch64 kernel files (included only from
// *_neon.cpp, which are built with the NEON target's flags).
#pragma once

#include <arm_neon.h>

namespace ebb::neon {

// e^x, relative error ~2e-7 over the float range (the AVX2 exp_ps, in NEON):
// x = n ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2), e^r by its degree-6
// Taylor polynomial, 2^n put in the exponent in two halves so n = 128 does
// not overflow. x > 88.72 gives +inf, x < -87.33 (and -inf) 0, NaN stays NaN.
inline float32x4_t exp_ps(float32x4_t x) {
  const float32x4_t hi = vdupq_n_f32(88.7228f), lo = vdupq_n_f32(-87.3365f);
  const uint32x4_t over = vcgtq_f32(x, hi), under = vcltq_f32(x, lo);
  const float32x4_t xc = vminnmq_f32(vmaxnmq_f32(x, lo), hi);
  const float32x4_t n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(xc, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.0f / 720.0f);
  for (float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = vfmaq_f32(vdupq_n_f32(c), p, r);
  const int32x4_t ni = vcvtq_s32_f32(n);
  const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
  const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
  const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
  p = vmulq_f32(vmulq_f32(p, s1), s2);
  p = vbslq_f32(over, vdupq_n_f32(__builtin_inff()), p);
  p = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(p), under));
  return vbslq_f32(vceqq_f32(x, x), p, x);
}

}  // namespace ebb::neon
