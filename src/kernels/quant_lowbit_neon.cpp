// aarch64 NEON dot products of Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and
// IQ4_XS (armv8.2-a + dot product). The integer part of each block (or
// sub-block) with SDOT (vdotq_s32), exact; the block terms are then added in
// the scalar reference's float order, so the results are the scalar's bit
// for bit (Arm builds use -ffp-contract=off, see quant_neon.cpp). The
// conversions and activation quantizers are the scalar ones.
//
// platform/fp16.h is not included (see quant_neon.cpp): halves are widened
// with the hardware conversion here.
#include <arm_neon.h>

#include <cstring>

#include "kernels/quant_blocks.h"

namespace ebb {
namespace {

inline float h2f(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

// sum of x[i] * y[i], i < 16 (int8, exact).
inline int dot16(int8x16_t x, const int8_t* y) { return vaddvq_s32(vdotq_s32(vdupq_n_s32(0), x, vld1q_s8(y))); }

// The low and high nibbles of 16 bytes: elements 0..15 and 16..31.
inline void nibbles(const uint8_t* qs, uint8x16_t* lo, uint8x16_t* hi) {
  const uint8x16_t v = vld1q_u8(qs);
  *lo = vandq_u8(v, vdupq_n_u8(0xF));
  *hi = vshrq_n_u8(v, 4);
}

// 0x10 where the Q5 high bit of element i (elements 0..15, or 16..31 from
// byte 2) is set, else 0.
inline uint8x16_t q5_high(const uint8_t* qh, int first_byte) {
  const uint8x16_t sel = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t b = vcombine_u8(vdup_n_u8(qh[first_byte]), vdup_n_u8(qh[first_byte + 1]));
  return vandq_u8(vtstq_u8(b, sel), vdupq_n_u8(0x10));
}

// ---- 32-blocks

int isum_q5_0(const BlockQ5_0& x, const int8_t* y) {
  uint8x16_t lo, hi;
  nibbles(x.qs, &lo, &hi);
  const int8x16_t a = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, q5_high(x.qh, 0))), vdupq_n_s8(16));
  const int8x16_t b = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, q5_high(x.qh, 2))), vdupq_n_s8(16));
  return dot16(a, y) + dot16(b, y + 16);
}

int isum_iq4_nl(const uint8_t* qs, const int8_t* y) {
  const int8x16_t book = vld1q_s8(kIq4nlValues);
  uint8x16_t lo, hi;
  nibbles(qs, &lo, &hi);
  return dot16(vqtbl1q_s8(book, lo), y) + dot16(vqtbl1q_s8(book, hi), y + 16);
}

void dot_q5_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i)
    s += static_cast<float>(isum_q5_0(x[i], y[i].qs)) * (h2f(x[i].d) * h2f(y[i].d));
  *out = s;
}

void dot_iq4_nl(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_NL*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i)
    s += static_cast<float>(isum_iq4_nl(x[i].qs, y[i].qs)) * (h2f(x[i].d) * h2f(y[i].d));
  *out = s;
}

// Q4_1 (Q5 = false) and Q5_1 against Q8_1.
template <bool Q5, class Block>
void dot_offset32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    uint8x16_t lo, hi;
    nibbles(x[i].qs, &lo, &hi);
    if constexpr (Q5) {
      lo = vorrq_u8(lo, q5_high(x[i].qh, 0));
      hi = vorrq_u8(hi, q5_high(x[i].qh, 2));
    }
    const int isum = dot16(vreinterpretq_s8_u8(lo), y[i].qs) + dot16(vreinterpretq_s8_u8(hi), y[i].qs + 16);
    s += static_cast<float>(isum) * (h2f(x[i].d) * h2f(y[i].d)) + h2f(x[i].m) * h2f(y[i].s);
  }
  *out = s;
}

// ---- super-blocks

void dot_q2_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0, summ = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * h), b1 = vld1q_u8(x[i].qs + 32 * h + 16);
      for (int sh = 0; sh < 4; ++sh) {
        const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * sh));
        const int8x16_t q0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b0, shift), vdupq_n_u8(3)));
        const int8x16_t q1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b1, shift), vdupq_n_u8(3)));
        const int g = 8 * h + 2 * sh;
        const int8_t* yq = y[i].qs + 16 * g;
        sumi += (x[i].scales[g] & 15) * dot16(q0, yq) + (x[i].scales[g + 1] & 15) * dot16(q1, yq + 16);
      }
    }
    for (int g = 0; g < 16; ++g) summ += (x[i].scales[g] >> 4) * y[i].bsums[g];
    const float d = h2f(x[i].d) * y[i].d, dmin = h2f(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
  }
  *out = s;
}

void dot_q3_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8x16_t m0 = vld1q_u8(x[i].hmask), m1 = vld1q_u8(x[i].hmask + 16);
    int sumi = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * h), b1 = vld1q_u8(x[i].qs + 32 * h + 16);
      for (int sh = 0; sh < 4; ++sh) {
        const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * sh));
        const uint8x16_t bit = vdupq_n_u8(static_cast<uint8_t>(1u << (4 * h + sh)));
        // value = low bits - 4 where the high bit is clear.
        const uint8x16_t off0 = vbicq_u8(vdupq_n_u8(4), vtstq_u8(m0, bit));
        const uint8x16_t off1 = vbicq_u8(vdupq_n_u8(4), vtstq_u8(m1, bit));
        const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b0, shift), vdupq_n_u8(3))),
                                      vreinterpretq_s8_u8(off0));
        const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b1, shift), vdupq_n_u8(3))),
                                      vreinterpretq_s8_u8(off1));
        const int g = 8 * h + 2 * sh;
        const int8_t* yq = y[i].qs + 16 * g;
        sumi += (q3_k_scale(x[i].scales, g) - 32) * dot16(q0, yq) + (q3_k_scale(x[i].scales, g + 1) - 32) * dot16(q1, yq + 16);
      }
    }
    s += h2f(x[i].d) * y[i].d * static_cast<float>(sumi);
  }
  *out = s;
}

void dot_iq4_xs(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0;
    for (int j = 0; j < 8; ++j)
      sumi += (iq4_xs_scale(x[i], j) - 32) * isum_iq4_nl(x[i].qs + 16 * j, y[i].qs + 32 * j);
    s += h2f(x[i].d) * y[i].d * static_cast<float>(sumi);
  }
  *out = s;
}

}  // namespace

void neon_lowbit_rows(FormatTable& t) {
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  row(DType::kQ5_0).vec_dot = dot_q5_0;
  row(DType::kQ4_1).vec_dot = dot_offset32<false, BlockQ4_1>;
  row(DType::kQ5_1).vec_dot = dot_offset32<true, BlockQ5_1>;
  row(DType::kIQ4_NL).vec_dot = dot_iq4_nl;
  row(DType::kQ2_K).vec_dot = dot_q2_k;
  row(DType::kQ3_K).vec_dot = dot_q3_k;
  row(DType::kIQ4_XS).vec_dot = dot_iq4_xs;
}

}  // namespace ebb
