// Scalar reference kernels: the definition of correct for every format. Kept
// straightforward on purpose; the SIMD files are tested against these.
#include <cmath>
#include <cstring>

#include "kernels/quant_blocks.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

// ---- conversions to float ----------------------------------------------------

void f32_to_float(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
}

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void q4_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    float* y = dst + i * kQK8_0;
    for (int j = 0; j < kQK8_0 / 2; ++j) {
      y[j] = d * static_cast<float>((b[i].qs[j] & 0xF) - 8);
      y[j + 16] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void q4_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    float* y = dst + i * kQK_K;
    const uint8_t* q = b[i].qs;
    for (int k = 0; k < 4; ++k) {  // pairs of sub-blocks: 64 elements
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(2 * k, b[i].scales, &sc0, &m0);
      unpack_scale_min_k4(2 * k + 1, b[i].scales, &sc1, &m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) y[64 * k + l] = d0 * static_cast<float>(q[32 * k + l] & 0xF) - mm0;
      for (int l = 0; l < 32; ++l) y[64 * k + 32 + l] = d1 * static_cast<float>(q[32 * k + l] >> 4) - mm1;
    }
  }
}

void q5_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    float* y = dst + i * kQK_K;
    const uint8_t* q = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int k = 0; k < 4; ++k) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(2 * k, b[i].scales, &sc0, &m0);
      unpack_scale_min_k4(2 * k + 1, b[i].scales, &sc1, &m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        const int v = (q[32 * k + l] & 0xF) | (((qh[l] >> (2 * k)) & 1) << 4);
        y[64 * k + l] = d0 * static_cast<float>(v) - mm0;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[32 * k + l] >> 4) | (((qh[l] >> (2 * k + 1)) & 1) << 4);
        y[64 * k + 32 + l] = d1 * static_cast<float>(v) - mm1;
      }
    }
  }
}

// The 6-bit value of element e (0..255) of a Q6_K block, without the -32.
inline int q6_k_value(const BlockQ6_K& b, int e) {
  const int h = e / 128, r = e % 128, part = r / 32, l = r % 32;
  const uint8_t* ql = b.ql + 64 * h;
  const uint8_t hi = static_cast<uint8_t>((b.qh[32 * h + l] >> (2 * part)) & 3);
  const uint8_t lo = (part & 1) ? ql[l + 32] : ql[l];
  return ((part < 2) ? (lo & 0xF) : (lo >> 4)) | (hi << 4);
}

void q6_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int e = 0; e < kQK_K; ++e)
      dst[i * kQK_K + e] = d * static_cast<float>(b[i].scales[e / 16]) * static_cast<float>(q6_k_value(b[i], e) - 32);
  }
}

void q8_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i)
    for (int j = 0; j < kQK_K; ++j) dst[i * kQK_K + j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

// ---- activation quantizers -----------------------------------------------------
// Round to nearest even (the SIMD conversions' mode), so every target
// produces the same bytes.

void quantize_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

// F16 / BF16 activations (paired with F16 / BF16 weights): each float rounded
// to nearest even by the platform conversions; NaN stays NaN (quiet, sign
// kept), overflow goes to Inf, F16 keeps its subnormals.
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
}

inline int8_t round_q8(float v) {
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(r > 127.f ? 127.f : (r < -127.f ? -127.f : r));
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + i * kQK8_0;
    float amax = 0.f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // Multiplier 127 / amax (not 1 / d), as the reference engine computes it.
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) b[i].qs[j] = round_q8(x[j] * id);
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    float amax = 0.f;
    for (int j = 0; j < kQK_K; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // Multiplier 127 / amax and scale 1 / multiplier, as the reference engine.
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    b[i].d = id != 0.f ? 1.f / id : 0.f;
    for (int j = 0; j < kQK_K; ++j) b[i].qs[j] = round_q8(x[j] * id);
    for (int g = 0; g < kQK_K / 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += b[i].qs[16 * g + j];
      b[i].bsums[g] = static_cast<int16_t>(s);
    }
  }
}

// ---- dot products ----------------------------------------------------------------

void dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  *out = s;
}

// F16 x F16 and BF16 x BF16: both operands widened to float (exactly), the
// products (exact in float for both formats, barring overflow) summed in float.
void dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]);
  *out = s;
}

void dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]);
  *out = s;
}

void dot_q8_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK8_0; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    s += static_cast<float>(sumi) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
  }
  *out = s;
}

void dot_q4_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK8_0 / 2; ++j) {
      sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    }
    s += static_cast<float>(sumi) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
  }
  *out = s;
}

// Q4_K / Q5_K: sum_j sc[j] * dot(q, a) over sub-block j gives the scale part
// and sum_j m[j] * sum(a) (from the Q8_K bsums) the min part, both exact
// integers per super-block.
void dot_q4_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_scale_min_k4(j, x[i].scales, &sc, &m);
      const int k = j / 2, shift = (j & 1) * 4;
      int dot = 0;
      for (int l = 0; l < 32; ++l) dot += ((x[i].qs[32 * k + l] >> shift) & 0xF) * y[i].qs[32 * j + l];
      sumi += sc * dot;
      summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d, dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
  }
  *out = s;
}

void dot_q5_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_scale_min_k4(j, x[i].scales, &sc, &m);
      const int k = j / 2, shift = (j & 1) * 4;
      int dot = 0;
      for (int l = 0; l < 32; ++l) {
        const int v = ((x[i].qs[32 * k + l] >> shift) & 0xF) | (((x[i].qh[l] >> j) & 1) << 4);
        dot += v * y[i].qs[32 * j + l];
      }
      sumi += sc * dot;
      summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d, dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
  }
  *out = s;
}

void dot_q6_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0;
    for (int g = 0; g < 16; ++g) {
      int dot = 0;
      for (int l = 0; l < 16; ++l) dot += (q6_k_value(x[i], 16 * g + l) - 32) * y[i].qs[16 * g + l];
      sumi += x[i].scales[g] * dot;
    }
    s += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(sumi);
  }
  *out = s;
}

void dot_q8_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK_K; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    s += x[i].d * y[i].d * static_cast<float>(sumi);
  }
  *out = s;
}

}  // namespace

FormatTable scalar_format_table() {
  using D = DType;
  FormatTable t{{
      {D::kF32, D::kF32, f32_to_float, quantize_f32, dot_f32},
      {D::kF16, D::kF16, f16_to_float, quantize_f16, dot_f16},
      {D::kBF16, D::kBF16, bf16_to_float, quantize_bf16, dot_bf16},
      {D::kQ8_0, D::kQ8_0, q8_0_to_float, quantize_q8_0, dot_q8_0},
      {D::kQ4_0, D::kQ8_0, q4_0_to_float, quantize_q8_0, dot_q4_0},
      {D::kQ4_K, D::kQ8_K, q4_k_to_float, quantize_q8_k, dot_q4_k},
      {D::kQ5_K, D::kQ8_K, q5_k_to_float, quantize_q8_k, dot_q5_k},
      {D::kQ6_K, D::kQ8_K, q6_k_to_float, quantize_q8_k, dot_q6_k},
      {D::kQ8_K, D::kQ8_K, q8_k_to_float, quantize_q8_k, dot_q8_k},
  }};
  scalar_lowbit_rows(t);
  return t;
}

}  // namespace ebb
