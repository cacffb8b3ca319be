// Matrix-product kernels of the ref-engine target (Isa::kRefEngine): scalar
// code that sums in the order of the reference engine's x86 AVX-512 build,
// so that ebb reproduces its logits to print precision. Each integer partial
// sum is exact, so only which float lane it lands in, and the order of the
// float operations, matter; those are reproduced here.
//
// One token (vec_dot) and a batch of two or more (tile_dot, vec_dot_tile)
// can be distinct paths in that engine, and are distinct here:
//   F32, F16,    one token: its vector dot product; a batch: its blocked
//   BF16         GEMM (16 lanes per output, no double).
//   Q8_0, Q5_K,  8 float lanes per row, one super-block (Q8_0: block) at a
//   Q6_K         time; Q5_K's min part in one more chain.
//   Q4_0         its interleaved 8-row layout: one float chain per row.
//   Q4_K         interleaved too: one chain per row for the scale part and
//                one for the min part, advancing a super-block at a time for
//                one token, a sub-block pair at a time in groups of 4 tokens.
// Activation formats and their quantizers are the scalar target's, which
// already round as that engine does.
#include <math.h>

#include <cstring>

#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

// ---- float lane reductions

// Halves 16 lanes down to one: lane l += lane l + w for w = 8, 4, 2, 1.
float halve16(float* x) {
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) x[l] = x[l + w] + x[l];
  return x[0];
}

// 8 lanes: (x0 + x4) + (x2 + x6) + ((x1 + x5) + (x3 + x7)), as
// ((t0 + t2) + (t1 + t3)) with t_i = x_(i+4) + x_i.
float hsum8(const float* x) {
  float t[4];
  for (int i = 0; i < 4; ++i) t[i] = x[4 + i] + x[i];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

float bf16_value(uint16_t h) { return bf16_to_fp32(h); }
float f16_value(uint16_t h) { return fp16_to_fp32(h); }

// ---- F32, F16 and BF16

// The one-token product's lanes for F32 and F16: 4 accumulators of 16 lanes,
// steps of 64 elements (element 64 i + 16 j + l fused into lane l of
// accumulator j) over the first `whole` elements; then (acc0 + acc2) +
// (acc1 + acc3), halved to one lane.
template <class T, float (*Value)(T)>
float lanes_4x16(int64_t whole, const T* x, const T* y) {
  float acc[4][16] = {};
  for (int64_t i = 0; i < whole; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 16; ++l) acc[j][l] = fmaf(Value(x[i + 16 * j + l]), Value(y[i + 16 * j + l]), acc[j][l]);
  float r[16];
  for (int l = 0; l < 16; ++l) r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  return halve16(r);
}

// A batch, F32 and F16: 16 lanes; element 16 c + l fused into lane l, c in
// order; halved to one lane. Only for n a multiple of 16: that engine's GEMM
// declines other lengths and its one-token product serves the batch.
template <class T, float (*Value)(T)>
float dot16_lanes(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const T*>(w);
  const auto* y = static_cast<const T*>(a);
  float acc[16] = {};
  for (int64_t i = 0; i < n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] = fmaf(Value(x[i + l]), Value(y[i + l]), acc[l]);
  return halve16(acc);
}

float f32_value(float v) { return v; }

// One token, F32: lanes_4x16, then the elements past the last step added to
// that float one by one, unfused.
void vec_dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  const int64_t whole = n / 64 * 64;
  float sum = lanes_4x16<float, f32_value>(whole, x, y);
  for (int64_t i = whole; i < n; ++i) {
    const float p = x[i] * y[i];
    sum += p;
  }
  *out = sum;
}

void batch_dot_f32(int64_t n, const void* w, const void* a, float* out) {
  if (n % 16 != 0) return vec_dot_f32(n, w, a, out);
  *out = dot16_lanes<float, f32_value>(n, w, a);
}

// One token, F16: lanes_4x16 widened to double, the elements past the last
// step added in double, each product rounded to float first; the sum rounded
// to float.
void vec_dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  const int64_t whole = n / 64 * 64;
  double sum = lanes_4x16<uint16_t, f16_value>(whole, x, y);
  for (int64_t i = whole; i < n; ++i) {
    const float p = f16_value(x[i]) * f16_value(y[i]);
    sum += static_cast<double>(p);
  }
  *out = static_cast<float>(sum);
}

void batch_dot_f16(int64_t n, const void* w, const void* a, float* out) {
  if (n % 16 != 0) return vec_dot_f16(n, w, a, out);
  *out = dot16_lanes<uint16_t, f16_value>(n, w, a);
}

// The BF16 pair step of one lane: the odd element's product added, then the
// even one's, each rounded (the products of two BF16 values are exact).
inline float bf16_pair(float acc, const uint16_t* x, const uint16_t* y) {
  acc = fmaf(bf16_value(x[1]), bf16_value(y[1]), acc);
  return fmaf(bf16_value(x[0]), bf16_value(y[0]), acc);
}

// One token, BF16: two accumulators of 16 lanes, each step of 64 elements
// giving its first 32 to the first and the rest to the second (pair 2l, 2l+1
// into lane l); each halved to one lane and added in double, first then
// second; the elements past the last step added in double.
void vec_dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  float c1[16] = {}, c2[16] = {};
  const int64_t whole = n / 64 * 64;
  for (int64_t i = 0; i < whole; i += 64)
    for (int l = 0; l < 16; ++l) {
      c1[l] = bf16_pair(c1[l], x + i + 2 * l, y + i + 2 * l);
      c2[l] = bf16_pair(c2[l], x + i + 32 + 2 * l, y + i + 32 + 2 * l);
    }
  double sum = halve16(c1);
  sum += halve16(c2);
  for (int64_t i = whole; i < n; ++i) {
    const float p = bf16_value(x[i]) * bf16_value(y[i]);
    sum += static_cast<double>(p);
  }
  *out = static_cast<float>(sum);
}

// A batch, BF16: 16 lanes, steps of 32 elements, pair 2l, 2l+1 of each step
// into lane l; halved to one lane. For n a multiple of 32 (else as one token,
// see dot16_lanes).
void batch_dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  if (n % 32 != 0) return vec_dot_bf16(n, w, a, out);
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  float acc[16] = {};
  for (int64_t i = 0; i < n; i += 32)
    for (int l = 0; l < 16; ++l) acc[l] = bf16_pair(acc[l], x + i + 2 * l, y + i + 2 * l);
  *out = halve16(acc);
}

// ---- 8-lane integer blocks (Q8_0, Q4_0, K-quants)

// Adds one block's integer lanes into 8 float lanes: acc[l] = fma(d,
// float(isum[l]), acc[l]). isum[l] holds the products of the elements e with
// (e mod 32) / 4 == l, each times its sub-block scale.
inline void lanes8_block(float d, const int32_t* isum, float* acc) {
  for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, static_cast<float>(isum[l]), acc[l]);
}

// isum[l] += scale * sum of q[e] * y[e] over the lane's elements of one
// 32-element piece; lanes 0-3 take scale_lo, lanes 4-7 scale_hi (Q6_K's two
// 16-element sub-blocks; the same scale for the other formats).
inline void lanes8_piece(const int* q, const int8_t* y, int scale_lo, int scale_hi, int32_t* isum) {
  for (int l = 0; l < 8; ++l) {
    int s = 0;
    for (int e = 4 * l; e < 4 * l + 4; ++e) s += q[e] * y[e];
    isum[l] += (l < 4 ? scale_lo : scale_hi) * s;
  }
}

void dot_q8_0_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int q[32];
    for (int e = 0; e < 32; ++e) q[e] = x[b].qs[e];
    int32_t isum[8] = {};
    lanes8_piece(q, y[b].qs, 1, 1, isum);
    lanes8_block(fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), isum, acc);
  }
  *out = hsum8(acc);
}

// Per row, one float chain: acc = fma(float(isum_b), dx_b * dy_b, acc) with
// isum_b the block's whole integer dot (the reference engine's interleaved
// Q4_0 layout).
void dot_q4_0_rowwise(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int32_t s = 0;
    for (int e = 0; e < 16; ++e) s += ((x[b].qs[e] & 0xF) - 8) * y[b].qs[e] + ((x[b].qs[e] >> 4) - 8) * y[b].qs[e + 16];
    acc = fmaf(static_cast<float>(s), fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), acc);
  }
  *out = acc;
}

// ---- K-quants

// The integer parts of one Q4_K super-block against one activation block:
// dot[j] = sum of q * y over sub-block j, sum_a[j] = its activations' sum.
void q4_k_subsums(const BlockQ4_K& x, const BlockQ8_K& y, int32_t* dot, int32_t* sum_a) {
  for (int j = 0; j < 8; ++j) {
    const int k = j / 2, shift = (j & 1) * 4;
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += ((x.qs[32 * k + l] >> shift) & 0xF) * y.qs[32 * j + l];
    dot[j] = s;
    sum_a[j] = y.bsums[2 * j] + y.bsums[2 * j + 1];
  }
}

// Q4_K, the reference engine's interleaved layout, one token (and the tokens
// of a batch past its last group of 4): per row one chain for the scale part
// and one for the min part, a super-block at a time:
//   acc  = fma(float(sum_j sc[j] dot[j]), dx * dy, acc)
//   accm = fma(float(sum_j m[j] sum_a[j]), dmin_x * dy, accm)
// result acc - accm.
void dot_q4_k_rowwise(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float acc = 0.0f, accm = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t dot[8], sum_a[8], is = 0, im = 0;
    q4_k_subsums(x[b], y[b], dot, sum_a);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_scale_min_k4(j, x[b].scales, &sc, &m);
      is += sc * dot[j];
      im += m * sum_a[j];
    }
    acc = fmaf(static_cast<float>(is), fp16_to_fp32(x[b].d) * y[b].d, acc);
    accm = fmaf(static_cast<float>(im), fp16_to_fp32(x[b].dmin) * y[b].d, accm);
  }
  *out = acc - accm;
}

// Q4_K in groups of 4 tokens of a batch: as dot_q4_k_rowwise, but the two
// chains advance a pair of sub-blocks at a time (sub-blocks 2p, 2p + 1).
void tile_q4_k_groups(int64_t n, const void* w, size_t, const void* a, size_t a_stride, float* y, int64_t y_stride) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  for (int t = 0; t < 4; ++t) {
    const auto* q = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + t * a_stride);
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
      int32_t dot[8], sum_a[8];
      q4_k_subsums(x[b], q[b], dot, sum_a);
      const float dd = fp16_to_fp32(x[b].d) * q[b].d, dm = fp16_to_fp32(x[b].dmin) * q[b].d;
      for (int p = 0; p < 4; ++p) {
        uint8_t sc0, m0, sc1, m1;
        unpack_scale_min_k4(2 * p, x[b].scales, &sc0, &m0);
        unpack_scale_min_k4(2 * p + 1, x[b].scales, &sc1, &m1);
        acc = fmaf(static_cast<float>(sc0 * dot[2 * p] + sc1 * dot[2 * p + 1]), dd, acc);
        accm = fmaf(static_cast<float>(m0 * sum_a[2 * p] + m1 * sum_a[2 * p + 1]), dm, accm);
      }
    }
    y[t * y_stride] = acc - accm;
  }
}

// Q5_K: the 8 lanes of dot_qk_45, the min part one chain:
// summs = fma(dmin, float(sum_j m[j] sum_a[j]), summs); hsum8(acc) + summs.
void dot_q5_k_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float acc[8] = {}, summs = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = y[b].d * fp16_to_fp32(x[b].d);
    const float dmin = -y[b].d * fp16_to_fp32(x[b].dmin);
    int32_t isum[8] = {}, im = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_scale_min_k4(j, x[b].scales, &sc, &m);
      int q[32];
      const int k = j / 2, shift = (j & 1) * 4;
      for (int l = 0; l < 32; ++l) q[l] = ((x[b].qs[32 * k + l] >> shift) & 0xF) | (((x[b].qh[l] >> j) & 1) << 4);
      lanes8_piece(q, y[b].qs + 32 * j, sc, sc, isum);
      im += m * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    }
    lanes8_block(d, isum, acc);
    summs = fmaf(dmin, static_cast<float>(im), summs);
  }
  *out = hsum8(acc) + summs;
}

// Q6_K: 8 lanes of d * isum, d = dy * dx; hsum8.
void dot_q6_k_lanes(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t isum[8] = {};
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      for (int part = 0; part < 4; ++part) {
        int q[32];
        for (int l = 0; l < 32; ++l) {
          const uint8_t lo = (part & 1) ? ql[l + 32] : ql[l];
          q[l] = (((part < 2) ? (lo & 0xF) : (lo >> 4)) | (((qh[l] >> (2 * part)) & 3) << 4)) - 32;
        }
        const int e0 = 128 * h + 32 * part;
        lanes8_piece(q, y[b].qs + e0, x[b].scales[e0 / 16], x[b].scales[e0 / 16 + 1], isum);
      }
    }
    lanes8_block(y[b].d * fp16_to_fp32(x[b].d), isum, acc);
  }
  *out = hsum8(acc);
}

}  // namespace

FormatTable ref_engine_format_table() {
  FormatTable t = scalar_format_table();
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  row(DType::kF32).vec_dot = vec_dot_f32;
  row(DType::kF32).tile_dot = batch_dot_f32;
  row(DType::kF16).vec_dot = vec_dot_f16;
  row(DType::kF16).tile_dot = batch_dot_f16;
  row(DType::kBF16).vec_dot = vec_dot_bf16;
  row(DType::kBF16).tile_dot = batch_dot_bf16;
  row(DType::kQ8_0).vec_dot = row(DType::kQ8_0).tile_dot = dot_q8_0_lanes;
  row(DType::kQ4_0).vec_dot = row(DType::kQ4_0).tile_dot = dot_q4_0_rowwise;
  // Q4_K: groups of 4 tokens in one arithmetic, the rest (and one token) in
  // the other; a 1 x 4 tile makes matmul split a batch that way.
  row(DType::kQ4_K).vec_dot = row(DType::kQ4_K).tile_dot = dot_q4_k_rowwise;
  row(DType::kQ4_K).vec_dot_tile = tile_q4_k_groups;
  row(DType::kQ4_K).tile_rows = 1;
  row(DType::kQ4_K).tile_tokens = 4;
  row(DType::kQ5_K).vec_dot = row(DType::kQ5_K).tile_dot = dot_q5_k_lanes;
  row(DType::kQ6_K).vec_dot = row(DType::kQ6_K).tile_dot = dot_q6_k_lanes;
  ref_engine_lowbit_rows(t);  // Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS
  return t;
}

}  // namespace ebb
