// The ref-engine target's kernels (see quant_ref_engine.cpp) for Q4_1, Q5_0,
// Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS: scalar code summing in the order of
// the reference engine's x86 build. Its kernels for these formats keep 8
// float lanes per row, lane l taking the integer products of the elements e
// with (e mod 32) / 4 == l (times their sub-block scale), one fused
// multiply-add per lane per block, and end with the same 8-lane reduction
// (hsum8):
//   Q5_0        acc = fma(dx * dy, isum, acc) per 32-block.
//   Q4_1, Q5_1  the same, plus one chain for the offsets:
//               summs = fma(m_x, s_y, summs); hsum8(acc) + summs.
//   IQ4_NL      one token: two lane accumulators, even blocks into the first,
//               odd into the second, added lane-wise before hsum8; a last odd
//               block in scalar: sum = fma(dy * dx, float(isum), sum).
//               A batch (its blocked GEMM): one accumulator, as Q5_0.
//   Q2_K        per super-block first the min part, lane l holding m[2l]
//               bsums[2l] + m[2l+1] bsums[2l+1]: acc = fma(-dy * dmin_x,
//               float(mins), acc); then acc = fma(dy * dx, isum, acc).
//   Q3_K,       acc = fma(d, float(isum), acc) per super-block, d = dy * dx
//   IQ4_XS      (IQ4_XS: dx * dy).
#include <math.h>

#include "kernels/quant_blocks.h"
#include "kernels/quant_lowbit.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

// 8 lanes: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)).
float hsum8(const float* x) {
  float t[4];
  for (int i = 0; i < 4; ++i) t[i] = x[4 + i] + x[i];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// isum[l] += scale * (products of q[e] * y[e], e = 4l .. 4l + 3) over one
// 32-element piece; lanes 0-3 take scale_lo, 4-7 scale_hi.
void lanes8_piece(const int* q, const int8_t* y, int scale_lo, int scale_hi, int32_t* isum) {
  for (int l = 0; l < 8; ++l) {
    int s = 0;
    for (int e = 4 * l; e < 4 * l + 4; ++e) s += q[e] * y[e];
    isum[l] += (l < 4 ? scale_lo : scale_hi) * s;
  }
}

void lanes8_fma(float d, const int32_t* isum, float* acc) {
  for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, static_cast<float>(isum[l]), acc[l]);
}

void q5_0_block_values(const BlockQ5_0& b, int* q) { q5_0_values(b, q); }
void iq4_nl_block_values(const BlockIQ4_NL& b, int* q) { iq4_nl_values(b.qs, q); }

// Q5_0, and IQ4_NL in a batch: one lane accumulator.
template <class Block, void (*Values)(const Block&, int*)>
void dot_sym32_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int q[32];
    Values(x[b], q);
    int32_t isum[8] = {};
    lanes8_piece(q, y[b].qs, 1, 1, isum);
    lanes8_fma(fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), isum, acc);
  }
  *out = hsum8(acc);
}

// Q4_1, Q5_1 against Q8_1.
template <class Block, void (*Values)(const Block&, int*)>
void dot_offset32_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float acc[8] = {}, summs = 0.f;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    summs = fmaf(fp16_to_fp32(x[b].m), fp16_to_fp32(y[b].s), summs);
    int q[32];
    Values(x[b], q);
    int32_t isum[8] = {};
    lanes8_piece(q, y[b].qs, 1, 1, isum);
    lanes8_fma(fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), isum, acc);
  }
  *out = hsum8(acc) + summs;
}

// IQ4_NL, one token: blocks in pairs into two accumulators, a last odd block
// in scalar.
void dot_iq4_nl_pairs(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_NL*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK8_0;
  float acc1[8] = {}, acc2[8] = {};
  int64_t b = 0;
  for (; b + 1 < nb; b += 2)
    for (int k = 0; k < 2; ++k) {
      int q[32];
      iq4_nl_values(x[b + k].qs, q);
      int32_t isum[8] = {};
      lanes8_piece(q, y[b + k].qs, 1, 1, isum);
      lanes8_fma(fp16_to_fp32(y[b + k].d) * fp16_to_fp32(x[b + k].d), isum, k == 0 ? acc1 : acc2);
    }
  float sum8[8];
  for (int l = 0; l < 8; ++l) sum8[l] = acc1[l] + acc2[l];
  float sum = hsum8(sum8);
  for (; b < nb; ++b) {
    int q[32], isum = 0;
    iq4_nl_values(x[b].qs, q);
    for (int e = 0; e < 32; ++e) isum += q[e] * y[b].qs[e];
    sum = fmaf(fp16_to_fp32(y[b].d) * fp16_to_fp32(x[b].d), static_cast<float>(isum), sum);
  }
  *out = sum;
}

void dot_q2_k_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = y[b].d * fp16_to_fp32(x[b].d);
    const float dmin = -y[b].d * fp16_to_fp32(x[b].dmin);
    int32_t mins[8];
    for (int l = 0; l < 8; ++l)
      mins[l] = (x[b].scales[2 * l] >> 4) * y[b].bsums[2 * l] + (x[b].scales[2 * l + 1] >> 4) * y[b].bsums[2 * l + 1];
    lanes8_fma(dmin, mins, acc);
    int q[kQK_K];
    q2_k_values(x[b], q);
    int32_t isum[8] = {};
    for (int p = 0; p < 8; ++p)
      lanes8_piece(q + 32 * p, y[b].qs + 32 * p, x[b].scales[2 * p] & 15, x[b].scales[2 * p + 1] & 15, isum);
    lanes8_fma(d, isum, acc);
  }
  *out = hsum8(acc);
}

void dot_q3_k_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int q[kQK_K];
    q3_k_values(x[b], q);
    int32_t isum[8] = {};
    for (int p = 0; p < 8; ++p)
      lanes8_piece(q + 32 * p, y[b].qs + 32 * p, q3_k_scale(x[b].scales, 2 * p) - 32,
                   q3_k_scale(x[b].scales, 2 * p + 1) - 32, isum);
    lanes8_fma(y[b].d * fp16_to_fp32(x[b].d), isum, acc);
  }
  *out = hsum8(acc);
}

void dot_iq4_xs_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t isum[8] = {};
    for (int j = 0; j < 8; ++j) {
      int q[32];
      iq4_nl_values(x[b].qs + 16 * j, q);
      const int ls = iq4_xs_scale(x[b], j) - 32;
      lanes8_piece(q, y[b].qs + 32 * j, ls, ls, isum);
    }
    lanes8_fma(fp16_to_fp32(x[b].d) * y[b].d, isum, acc);
  }
  *out = hsum8(acc);
}

}  // namespace

void ref_engine_lowbit_rows(FormatTable& t) {
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  row(DType::kQ5_0).vec_dot = row(DType::kQ5_0).tile_dot = dot_sym32_lanes<BlockQ5_0, q5_0_block_values>;
  row(DType::kQ4_1).vec_dot = row(DType::kQ4_1).tile_dot = dot_offset32_lanes<BlockQ4_1, q4_1_values>;
  row(DType::kQ5_1).vec_dot = row(DType::kQ5_1).tile_dot = dot_offset32_lanes<BlockQ5_1, q5_1_values>;
  row(DType::kIQ4_NL).vec_dot = dot_iq4_nl_pairs;
  row(DType::kIQ4_NL).tile_dot = dot_sym32_lanes<BlockIQ4_NL, iq4_nl_block_values>;
  row(DType::kQ2_K).vec_dot = row(DType::kQ2_K).tile_dot = dot_q2_k_lanes;
  row(DType::kQ3_K).vec_dot = row(DType::kQ3_K).tile_dot = dot_q3_k_lanes;
  row(DType::kIQ4_XS).vec_dot = row(DType::kIQ4_XS).tile_dot = dot_iq4_xs_lanes;
}

}  // namespace ebb
