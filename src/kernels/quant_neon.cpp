// aarch64 NEON kernels (armv8.2-a + dot product + fp16). Quantized rows take
// int8 dot products with SDOT (vdotq_s32) against Q8_0 / Q8_K activations;
// F16 uses the hardware half <-> float conversions, BF16 a shift. Per-block
// integer sums are exact. The K-quant and Q8_K dots then add the block terms
// in the scalar reference's float order (bit-identical with it: Arm builds
// use -ffp-contract=off, so neither side fuses a multiply-add it does not
// spell out); the Q8_0 / Q4_0 / float dots keep vector accumulators.
//
// platform/fp16.h is not included: its inline functions must not be compiled
// with this file's target flags (the linker may keep any copy of an inline
// function, and the baseline code would then run armv8.2 instructions).
#include <arm_neon.h>

#include <cstring>

#include "kernels/quant_blocks.h"

namespace ebb {
namespace {

// ---- conversions -------------------------------------------------------------------

inline float h2f(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

// 4 halves -> 4 floats (exact).
inline float32x4_t load_f16x4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

// 4 bf16 -> 4 floats (a bf16 is the top half of a float).
inline float32x4_t load_bf16x4(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

// 4 floats -> 4 halves, round to nearest even (FPCR default), overflow to
// Inf, half subnormals kept, as fp32_to_fp16. NaN: the hardware keeps the
// top payload bits, the reference gives sign | 0x7e00; the payload is cleared.
inline uint16x4_t f16_round_4(float32x4_t v) {
  const uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(v));
  const uint16x4_t nan = vmovn_u32(vmvnq_u32(vceqq_f32(v, v)));
  return vbic_u16(h, vand_u16(nan, vdup_n_u16(0x01ff)));
}

inline uint16_t f2h(float f) { return vget_lane_u16(f16_round_4(vdupq_n_f32(f)), 0); }

// 4 floats -> 4 bf16 exactly as fp32_to_bf16: x + 0x7fff + (bit 16 of x),
// top half; NaN -> top half | 0x40 (quiet).
inline uint16x4_t bf16_round_4(float32x4_t v) {
  const uint32x4_t x = vreinterpretq_u32_f32(v);
  const uint32x4_t bias = vaddq_u32(vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1)), vdupq_n_u32(0x7fff));
  const uint16x4_t r = vshrn_n_u32(vaddq_u32(x, bias), 16);
  const uint16x4_t q = vorr_u16(vshrn_n_u32(x, 16), vdup_n_u16(0x40));
  const uint16x4_t nan = vmovn_u32(vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000)));
  return vbsl_u16(nan, q, r);
}

// ---- to_float rows ------------------------------------------------------------------

// dst[0..15] = d * q (k = false) or d * q - m (k = true), as the scalar rows
// compute them (one rounded product, then one rounded difference).
template <bool kMin>
inline void store_16(int8x16_t q, float d, float m, float* dst) {
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
  const int32x4_t v[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)),
                          vmovl_high_s16(hi)};
  for (int k = 0; k < 4; ++k) {
    float32x4_t f = vmulq_n_f32(vcvtq_f32_s32(v[k]), d);
    if constexpr (kMin) f = vsubq_f32(f, vdupq_n_f32(m));
    vst1q_f32(dst + 4 * k, f);
  }
}

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load_f16x4(s + i));
  for (; i < n; ++i) dst[i] = h2f(s[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load_bf16x4(s + i));
  for (; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(dst + i, &b, 4);
  }
}

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = h2f(b[i].d);
    store_16<false>(vld1q_s8(b[i].qs), d, 0.f, dst + i * kQK8_0);
    store_16<false>(vld1q_s8(b[i].qs + 16), d, 0.f, dst + i * kQK8_0 + 16);
  }
}

void q4_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = h2f(b[i].d);
    const uint8x16_t q = vld1q_u8(b[i].qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0xF))), vdupq_n_s8(8));
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
    store_16<false>(lo, d, 0.f, dst + i * kQK8_0);
    store_16<false>(hi, d, 0.f, dst + i * kQK8_0 + 16);
  }
}

// The eight 6-bit scales and mins of a Q4_K / Q5_K block (unpack_scale_min_k4
// on 32-bit words: four sub-blocks per operation).
inline void unpack_scales_mins(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  uint32_t a, b, c;
  std::memcpy(&a, q, 4);
  std::memcpy(&b, q + 4, 4);
  std::memcpy(&c, q + 8, 4);
  const uint32_t w[4] = {a & 0x3f3f3f3fu, (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u), b & 0x3f3f3f3fu,
                         ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)};
  std::memcpy(sc, w, 8);
  std::memcpy(mn, w + 2, 8);
}

// Q4_K (kQ5 = false) and Q5_K (kQ5 = true) rows: sub-block j of 32 elements
// is d * sc[j] * q - dmin * m[j].
template <bool kQ5, typename Block>
void k4_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  const uint8x16_t m4 = vdupq_n_u8(0xF), one = vdupq_n_u8(1);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    uint8_t sc[8], mn[8];
    unpack_scales_mins(b[i].scales, sc, mn);
    uint8x16_t hb[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if constexpr (kQ5) {
      hb[0] = vld1q_u8(b[i].qh);
      hb[1] = vld1q_u8(b[i].qh + 16);
    }
    float* y = dst + i * kQK_K;
    for (int k = 0; k < 4; ++k)
      for (int c = 0; c < 2; ++c) {  // elements 16c .. 16c + 15 of each sub-block
        const uint8x16_t q = vld1q_u8(b[i].qs + 32 * k + 16 * c);
        uint8x16_t lo = vandq_u8(q, m4), hi = vshrq_n_u8(q, 4);
        if constexpr (kQ5) {
          lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(hb[c], one), 4));
          hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshrq_n_u8(hb[c], 1), one), 4));
          hb[c] = vshrq_n_u8(hb[c], 2);
        }
        store_16<true>(vreinterpretq_s8_u8(lo), d * sc[2 * k], dmin * mn[2 * k], y + 64 * k + 16 * c);
        store_16<true>(vreinterpretq_s8_u8(hi), d * sc[2 * k + 1], dmin * mn[2 * k + 1], y + 64 * k + 32 + 16 * c);
      }
  }
}

// The 6-bit values of a Q6_K block minus 32, 16 at a time: q[2h][p][c] holds
// elements 128h + 32p + 16c .. + 15 (layout in quant_blocks.h).
inline void q6_k_values(const BlockQ6_K& b, int h, int c, int8x16_t* q) {
  const uint8x16_t m4 = vdupq_n_u8(0xF), m3 = vdupq_n_u8(3);
  const uint8x16_t qa = vld1q_u8(b.ql + 64 * h + 16 * c), qb = vld1q_u8(b.ql + 64 * h + 32 + 16 * c);
  const uint8x16_t hb = vld1q_u8(b.qh + 32 * h + 16 * c);
  const uint8x16_t v[4] = {vorrq_u8(vandq_u8(qa, m4), vshlq_n_u8(vandq_u8(hb, m3), 4)),
                           vorrq_u8(vandq_u8(qb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4)),
                           vorrq_u8(vshrq_n_u8(qa, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4)),
                           vorrq_u8(vshrq_n_u8(qb, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))};
  for (int p = 0; p < 4; ++p) q[p] = vsubq_s8(vreinterpretq_s8_u8(v[p]), vdupq_n_s8(32));
}

void q6_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = h2f(b[i].d);
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 2; ++c) {
        int8x16_t q[4];
        q6_k_values(b[i], h, c, q);
        for (int p = 0; p < 4; ++p) {
          const int e = 128 * h + 32 * p + 16 * c;
          store_16<false>(q[p], d * static_cast<float>(b[i].scales[e / 16]), 0.f, dst + i * kQK_K + e);
        }
      }
  }
}

void q8_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i)
    for (int j = 0; j < kQK_K; j += 16) store_16<false>(vld1q_s8(b[i].qs + j), b[i].d, 0.f, dst + i * kQK_K + j);
}

// ---- activation quantizers -------------------------------------------------------------
// The same bytes as the scalar reference. Float tails go through a
// zero-padded group of the vector code, so there is one code path.

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(d + i, f16_round_4(vld1q_f32(src + i)));
  if (i < n) {
    float in[4] = {};
    uint16_t out[4];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    vst1_u16(out, f16_round_4(vld1q_f32(in)));
    std::memcpy(d + i, out, (n - i) * sizeof(uint16_t));
  }
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(d + i, bf16_round_4(vld1q_f32(src + i)));
  if (i < n) {
    float in[4] = {};
    uint16_t out[4];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    vst1_u16(out, bf16_round_4(vld1q_f32(in)));
    std::memcpy(d + i, out, (n - i) * sizeof(uint16_t));
  }
}

// max |x[j]|, j < n (a multiple of 16); maxnm ignores NaN as std::fmax does.
inline float abs_max(const float* x, int n) {
  float32x4_t m = vdupq_n_f32(0.f);
  for (int j = 0; j < n; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
  return vmaxnmvq_f32(m);
}

// 16 floats times the multiplier id, rounded to nearest even (FCVTNS) and
// clamped to [-127, 127], as round_q8.
inline int8x16_t quantize_16(const float* x, float id) {
  int32x4_t v[4];
  for (int k = 0; k < 4; ++k) v[k] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * k), id));
  const int16x8_t lo = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
  const int16x8_t hi = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
  return vmaxq_s8(vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)), vdupq_n_s8(-127));
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + i * kQK8_0;
    const float amax = abs_max(x, kQK8_0);
    const float id = amax != 0.f ? 127.f / amax : 0.f;  // 127 / amax, not 1 / d, as the reference
    b[i].d = f2h(amax / 127.f);
    vst1q_s8(b[i].qs, quantize_16(x, id));
    vst1q_s8(b[i].qs + 16, quantize_16(x + 16, id));
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    const float amax = abs_max(x, kQK_K);
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    b[i].d = id != 0.f ? 1.f / id : 0.f;
    for (int g = 0; g < kQK_K / 16; ++g) {
      const int8x16_t q = quantize_16(x + 16 * g, id);
      vst1q_s8(b[i].qs + 16 * g, q);
      b[i].bsums[g] = vaddlvq_s8(q);  // |sum| <= 16 * 127
    }
  }
}

// ---- dot products ----------------------------------------------------------------------

void dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) acc[k] = vfmaq_f32(acc[k], vld1q_f32(x + i + 4 * k), vld1q_f32(y + i + 4 * k));
  for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(x + i), vld1q_f32(y + i));
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  for (; i < n; ++i) s += x[i] * y[i];
  *out = s;
}

// F16 x F16 and BF16 x BF16: both operands widened (exactly); the products
// are exact in float, so fusing them changes nothing but speed.
template <float32x4_t (*Load)(const uint16_t*), float (*Widen)(uint16_t)>
void dot_half(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) acc[k] = vfmaq_f32(acc[k], Load(x + i + 4 * k), Load(y + i + 4 * k));
  for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], Load(x + i), Load(y + i));
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  for (; i < n; ++i) s += Widen(x[i]) * Widen(y[i]);
  *out = s;
}

inline float bf2f(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Signed dot of 32 int8 pairs, as four int32 partial sums (added to acc).
inline int32x4_t dot_32(int32x4_t acc, int8x16_t x0, int8x16_t x1, const int8_t* y) {
  return vdotq_s32(vdotq_s32(acc, x0, vld1q_s8(y)), x1, vld1q_s8(y + 16));
}

// Q8_0 / Q4_0: even blocks into one float accumulator, odd ones into another.
template <typename Block, void (*Values)(const Block&, int8x16_t*, int8x16_t*)>
void dot_32_blocks(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK8_0;
  float32x4_t acc[2] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  for (int64_t i = 0; i < nb; ++i) {
    int8x16_t q0, q1;
    Values(x[i], &q0, &q1);
    const int32x4_t p = dot_32(vdupq_n_s32(0), q0, q1, y[i].qs);
    acc[i & 1] = vfmaq_n_f32(acc[i & 1], vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
  }
  *out = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
}

inline void q8_0_values(const BlockQ8_0& b, int8x16_t* q0, int8x16_t* q1) {
  *q0 = vld1q_s8(b.qs);
  *q1 = vld1q_s8(b.qs + 16);
}

inline void q4_0_values(const BlockQ4_0& b, int8x16_t* q0, int8x16_t* q1) {
  const uint8x16_t q = vld1q_u8(b.qs);
  *q0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0xF))), vdupq_n_s8(8));
  *q1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}

// Q4_K / Q5_K: sum_j sc[j] * dot(q, a) over sub-blocks, and the min part
// sum_j m[j] * (bsums[2j] + bsums[2j + 1]); both exact, then the block's
// float terms as the scalar row adds them.
template <bool kQ5, typename Block>
void dot_k4(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const uint8x16_t m4 = vdupq_n_u8(0xF), one = vdupq_n_u8(1);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t sc[8], mn[8];
    unpack_scales_mins(x[i].scales, sc, mn);
    const int16x8_t bs = vpaddq_s16(vld1q_s16(y[i].bsums), vld1q_s16(y[i].bsums + 8));  // per sub-block
    const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    const int summ = vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(m16), vget_low_s16(bs)), m16, bs));
    uint8x16_t hb[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if constexpr (kQ5) {
      hb[0] = vld1q_u8(x[i].qh);
      hb[1] = vld1q_u8(x[i].qh + 16);
    }
    int32x4_t sumi = vdupq_n_s32(0);
    for (int k = 0; k < 4; ++k) {
      uint8x16_t lo[2], hi[2];
      for (int c = 0; c < 2; ++c) {
        const uint8x16_t q = vld1q_u8(x[i].qs + 32 * k + 16 * c);
        lo[c] = vandq_u8(q, m4);
        hi[c] = vshrq_n_u8(q, 4);
        if constexpr (kQ5) {
          lo[c] = vorrq_u8(lo[c], vshlq_n_u8(vandq_u8(hb[c], one), 4));
          hi[c] = vorrq_u8(hi[c], vshlq_n_u8(vandq_u8(vshrq_n_u8(hb[c], 1), one), 4));
          hb[c] = vshrq_n_u8(hb[c], 2);
        }
      }
      const int8_t* q8 = y[i].qs + 64 * k;
      const int32x4_t pl = dot_32(vdupq_n_s32(0), vreinterpretq_s8_u8(lo[0]), vreinterpretq_s8_u8(lo[1]), q8);
      const int32x4_t ph = dot_32(vdupq_n_s32(0), vreinterpretq_s8_u8(hi[0]), vreinterpretq_s8_u8(hi[1]), q8 + 32);
      sumi = vmlaq_n_s32(sumi, pl, sc[2 * k]);
      sumi = vmlaq_n_s32(sumi, ph, sc[2 * k + 1]);
    }
    const float d = h2f(x[i].d) * y[i].d, dmin = h2f(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(vaddvq_s32(sumi)) - dmin * static_cast<float>(summ);
  }
  *out = s;
}

void dot_q6_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int32x4_t sumi = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 2; ++c) {
        int8x16_t q[4];
        q6_k_values(x[i], h, c, q);
        for (int p = 0; p < 4; ++p) {
          const int e = 128 * h + 32 * p + 16 * c;
          const int32x4_t dot = vdotq_s32(vdupq_n_s32(0), q[p], vld1q_s8(y[i].qs + e));
          sumi = vmlaq_n_s32(sumi, dot, x[i].scales[e / 16]);
        }
      }
    s += h2f(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(sumi));
  }
  *out = s;
}

void dot_q8_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int32x4_t sumi = vdupq_n_s32(0);
    for (int j = 0; j < kQK_K; j += 32) sumi = dot_32(sumi, vld1q_s8(x[i].qs + j), vld1q_s8(x[i].qs + j + 16), y[i].qs + j);
    s += x[i].d * y[i].d * static_cast<float>(vaddvq_s32(sumi));
  }
  *out = s;
}

}  // namespace

FormatTable neon_format_table() {
  using D = DType;
  // F32 rows keep the scalar to_float / quantize_act (copies).
  FormatTable t = scalar_format_table();
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  row(D::kF32).vec_dot = dot_f32;
  row(D::kF16) = {D::kF16, D::kF16, f16_to_float, quantize_f16, dot_half<load_f16x4, h2f>};
  row(D::kBF16) = {D::kBF16, D::kBF16, bf16_to_float, quantize_bf16, dot_half<load_bf16x4, bf2f>};
  row(D::kQ8_0) = {D::kQ8_0, D::kQ8_0, q8_0_to_float, quantize_q8_0, dot_32_blocks<BlockQ8_0, q8_0_values>};
  row(D::kQ4_0) = {D::kQ4_0, D::kQ8_0, q4_0_to_float, quantize_q8_0, dot_32_blocks<BlockQ4_0, q4_0_values>};
  row(D::kQ4_K) = {D::kQ4_K, D::kQ8_K, k4_to_float<false, BlockQ4_K>, quantize_q8_k, dot_k4<false, BlockQ4_K>};
  row(D::kQ5_K) = {D::kQ5_K, D::kQ8_K, k4_to_float<true, BlockQ5_K>, quantize_q8_k, dot_k4<true, BlockQ5_K>};
  row(D::kQ6_K) = {D::kQ6_K, D::kQ8_K, q6_k_to_float, quantize_q8_k, dot_q6_k};
  row(D::kQ8_K) = {D::kQ8_K, D::kQ8_K, q8_k_to_float, quantize_q8_k, dot_q8_k};
  neon_lowbit_rows(t);  // Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS (quant_lowbit_neon.cpp)
  return t;
}

}  // namespace ebb
