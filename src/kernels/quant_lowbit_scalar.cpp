// Scalar reference kernels of the formats llama.cpp's quantizer mixes in
// beside the Q4_0 / K-quant families: Q4_1, Q5_0, Q5_1 (32-blocks), Q2_K,
// Q3_K (256 super-blocks), IQ4_NL and IQ4_XS (the non-linear 4-bit
// codebook), and the Q8_1 activations Q4_1 / Q5_1 pair with. The definition
// of correct for these rows; the SIMD files are tested against them.
//
// Pairings (FormatKernels::act):
//   Q5_0, IQ4_NL  -> Q8_0   (32-blocks, symmetric: d_w * d_a * isum)
//   Q4_1, Q5_1    -> Q8_1   (Q8_0 plus the block's sum s, for the offset m:
//                            d_w * d_a * isum + m * s)
//   Q2_K, Q3_K,   -> Q8_K   (super-blocks; Q2_K's min part from bsums)
//   IQ4_XS
#include <cmath>
#include <cstring>

#include "kernels/quant_blocks.h"
#include "kernels/quant_lowbit.h"
#include "platform/fp16.h"

namespace ebb {

// ---- element values (shared with the other targets' scalar fallbacks) -------------

int q5_high_bit(const uint8_t* qh, int e) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return static_cast<int>((h >> e) & 1);
}

void q4_1_values(const BlockQ4_1& b, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = b.qs[j] & 15;
    q[j + 16] = b.qs[j] >> 4;
  }
}

void q5_0_values(const BlockQ5_0& b, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = ((b.qs[j] & 15) | (q5_high_bit(b.qh, j) << 4)) - 16;
    q[j + 16] = ((b.qs[j] >> 4) | (q5_high_bit(b.qh, j + 16) << 4)) - 16;
  }
}

void q5_1_values(const BlockQ5_1& b, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = (b.qs[j] & 15) | (q5_high_bit(b.qh, j) << 4);
    q[j + 16] = (b.qs[j] >> 4) | (q5_high_bit(b.qh, j + 16) << 4);
  }
}

void iq4_nl_values(const uint8_t* qs, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4nlValues[qs[j] & 15];
    q[j + 16] = kIq4nlValues[qs[j] >> 4];
  }
}

void q2_k_values(const BlockQ2_K& b, int* q) {
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * s + l] = (b.qs[32 * h + l] >> (2 * s)) & 3;
}

void q3_k_values(const BlockQ3_K& b, int* q) {
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int lo = (b.qs[32 * h + l] >> (2 * s)) & 3;
        const int hi = (b.hmask[l] >> (4 * h + s)) & 1;
        q[128 * h + 32 * s + l] = lo - (hi ? 0 : 4);
      }
}

namespace {

// ---- conversions to float ------------------------------------------------------------

void q4_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    int q[32];
    q4_1_values(b[i], q);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(q[j]) + m;
  }
}

void q5_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    int q[32];
    q5_0_values(b[i], q);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(q[j]);
  }
}

void q5_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    int q[32];
    q5_1_values(b[i], q);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(q[j]) + m;
  }
}

void q8_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void iq4_nl_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    int q[32];
    iq4_nl_values(b[i].qs, q);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(q[j]);
  }
}

void iq4_xs_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(iq4_xs_scale(b[i], j) - 32);
      int q[32];
      iq4_nl_values(b[i].qs + 16 * j, q);
      for (int l = 0; l < 32; ++l) dst[i * kQK_K + 32 * j + l] = dl * static_cast<float>(q[l]);
    }
  }
}

void q2_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    int q[kQK_K];
    q2_k_values(b[i], q);
    for (int e = 0; e < kQK_K; ++e) {
      const int sc = b[i].scales[e / 16];
      dst[i * kQK_K + e] = d * static_cast<float>(sc & 15) * static_cast<float>(q[e]) - dmin * static_cast<float>(sc >> 4);
    }
  }
}

void q3_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    int q[kQK_K];
    q3_k_values(b[i], q);
    for (int e = 0; e < kQK_K; ++e)
      dst[i * kQK_K + e] = d * static_cast<float>(q3_k_scale(b[i].scales, e / 16) - 32) * static_cast<float>(q[e]);
  }
}

// ---- dot products --------------------------------------------------------------------

int dot32(const int* q, const int8_t* y) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += q[j] * y[j];
  return s;
}

// Symmetric 32-blocks against Q8_0: sum_b d_w * d_a * isum_b.
template <class Block, void (*Values)(const Block&, int*)>
void dot_sym32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int q[32];
    Values(x[i], q);
    s += static_cast<float>(dot32(q, y[i].qs)) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
  }
  *out = s;
}

void iq4_nl_block_values(const BlockIQ4_NL& b, int* q) { iq4_nl_values(b.qs, q); }

// Offset 32-blocks against Q8_1: sum_b (d_w * d_a * isum_b + m_w * s_a).
template <class Block, void (*Values)(const Block&, int*)>
void dot_offset32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int q[32];
    Values(x[i], q);
    s += static_cast<float>(dot32(q, y[i].qs)) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) +
         fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  *out = s;
}

void dot_q8_1(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    s += static_cast<float>(sumi) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
  }
  *out = s;
}

int dot16(const int* q, const int8_t* y) {
  int s = 0;
  for (int j = 0; j < 16; ++j) s += q[j] * y[j];
  return s;
}

// Q2_K: the scale part sum_g sc[g] * dot_g and the min part sum_g m[g] *
// bsums[g], both exact integers per super-block.
void dot_q2_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int q[kQK_K];
    q2_k_values(x[i], q);
    int sumi = 0, summ = 0;
    for (int g = 0; g < 16; ++g) {
      sumi += (x[i].scales[g] & 15) * dot16(q + 16 * g, y[i].qs + 16 * g);
      summ += (x[i].scales[g] >> 4) * y[i].bsums[g];
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d, dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
  }
  *out = s;
}

void dot_q3_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int q[kQK_K];
    q3_k_values(x[i], q);
    int sumi = 0;
    for (int g = 0; g < 16; ++g) sumi += (q3_k_scale(x[i].scales, g) - 32) * dot16(q + 16 * g, y[i].qs + 16 * g);
    s += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(sumi);
  }
  *out = s;
}

void dot_iq4_xs(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float s = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0;
    for (int j = 0; j < 8; ++j) {
      int q[32];
      iq4_nl_values(x[i].qs + 16 * j, q);
      sumi += (iq4_xs_scale(x[i], j) - 32) * dot32(q, y[i].qs + 32 * j);
    }
    s += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(sumi);
  }
  *out = s;
}

}  // namespace

// ---- Q8_1 activations --------------------------------------------------------------------

// Q8_0's bytes and scale (the same rounding), and s = fp16(d * sum qs).
void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + i * kQK8_0;
    float amax = 0.f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < kQK8_0; ++j) {
      const float r = std::nearbyint(x[j] * id);
      b[i].qs[j] = static_cast<int8_t>(r > 127.f ? 127.f : (r < -127.f ? -127.f : r));
      sum += b[i].qs[j];
    }
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void scalar_lowbit_rows(FormatTable& t) {
  using D = DType;
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  const FormatKernels& q8_0 = row(D::kQ8_0);
  const FormatKernels& q8_k = row(D::kQ8_K);
  row(D::kQ4_1) = {D::kQ4_1, D::kQ8_1, q4_1_to_float, quantize_q8_1, dot_offset32<BlockQ4_1, q4_1_values>};
  row(D::kQ5_0) = {D::kQ5_0, D::kQ8_0, q5_0_to_float, q8_0.quantize_act, dot_sym32<BlockQ5_0, q5_0_values>};
  row(D::kQ5_1) = {D::kQ5_1, D::kQ8_1, q5_1_to_float, quantize_q8_1, dot_offset32<BlockQ5_1, q5_1_values>};
  row(D::kQ8_1) = {D::kQ8_1, D::kQ8_1, q8_1_to_float, quantize_q8_1, dot_q8_1};
  row(D::kIQ4_NL) = {D::kIQ4_NL, D::kQ8_0, iq4_nl_to_float, q8_0.quantize_act,
                     dot_sym32<BlockIQ4_NL, iq4_nl_block_values>};
  row(D::kQ2_K) = {D::kQ2_K, D::kQ8_K, q2_k_to_float, q8_k.quantize_act, dot_q2_k};
  row(D::kQ3_K) = {D::kQ3_K, D::kQ8_K, q3_k_to_float, q8_k.quantize_act, dot_q3_k};
  row(D::kIQ4_XS) = {D::kIQ4_XS, D::kQ8_K, iq4_xs_to_float, q8_k.quantize_act, dot_iq4_xs};
}

}  // namespace ebb
