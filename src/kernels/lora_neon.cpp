// aarch64 NEON LoRA products; lora_avx2.cpp at half the width. down: four
// rows of a per pass over x, sharing its loads, two accumulators per row;
// up: column blocks of up to 32 held in registers across the rank sum. The
// last n_in % 4 elements and n_out % 4 columns are summed in scalar code, in
// index order as the reference does. The F16 variants are the same code with
// weights widened (fcvtl, exact; base ARMv8, no FP16 arithmetic needed) as
// they are loaded.
#include <arm_neon.h>

#include "kernels/lora_internal.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

// Four weights from p as floats.
inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float weight(float w) { return w; }
inline float weight(uint16_t w) { return fp16_to_fp32(w); }

// out[q] = Σ_k a[q, k] · x[k] for q < R: R rows of a (row stride n_in)
// against one row of x, every load of x shared by the R rows.
template <int R, typename W>
inline void dot_rows(const W* a, int64_t n_in, const float* x, float* out) {
  float32x4_t acc0[R], acc1[R];
  for (int q = 0; q < R; ++q) acc0[q] = acc1[q] = vdupq_n_f32(0.0f);
  int64_t k = 0;
  for (; k + 8 <= n_in; k += 8) {
    const float32x4_t x0 = vld1q_f32(x + k), x1 = vld1q_f32(x + k + 4);
    for (int q = 0; q < R; ++q) {
      acc0[q] = vfmaq_f32(acc0[q], load4(a + q * n_in + k), x0);
      acc1[q] = vfmaq_f32(acc1[q], load4(a + q * n_in + k + 4), x1);
    }
  }
  if (k + 4 <= n_in) {
    const float32x4_t x0 = vld1q_f32(x + k);
    for (int q = 0; q < R; ++q) acc0[q] = vfmaq_f32(acc0[q], load4(a + q * n_in + k), x0);
    k += 4;
  }
  for (int q = 0; q < R; ++q) {
    float tail = 0.0f;
    for (int64_t l = k; l < n_in; ++l) tail += weight(a[q * n_in + l]) * x[l];
    out[q] = vaddvq_f32(vaddq_f32(acc0[q], acc1[q])) + tail;
  }
}

template <typename W>
void down_neon(const W* a,      // [r, n_in]
               const float* x,  // [n, x_stride]
               int64_t x_stride, int64_t n, int64_t r, int64_t n_in,
               float* t) {  // [n, r]
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    int64_t j = 0;
    for (; j + 4 <= r; j += 4) dot_rows<4>(a + j * n_in, n_in, xi, t + i * r + j);
    for (; j < r; ++j) dot_rows<1>(a + j * n_in, n_in, xi, t + i * r + j);
  }
}

// y[c .. c + 4V) += s · Σ_j t[j] · bt[j, c .. c + 4V), the V vectors of sums
// in registers across j.
template <int V, typename W>
inline void up_block(const W* bt, int64_t n_out, const float* t, int64_t r, float32x4_t s, int64_t c, float* y) {
  float32x4_t acc[V];
  for (int v = 0; v < V; ++v) acc[v] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < r; ++j) {
    const float32x4_t tj = vdupq_n_f32(t[j]);
    const W* b = bt + j * n_out + c;
    for (int v = 0; v < V; ++v) acc[v] = vfmaq_f32(acc[v], tj, load4(b + 4 * v));
  }
  for (int v = 0; v < V; ++v) vst1q_f32(y + c + 4 * v, vaddq_f32(vld1q_f32(y + c + 4 * v), vmulq_f32(s, acc[v])));
}

template <typename W>
void up_neon(const W* bt,      // [r, n_out]
             const float* t,   // [n, r]
             float s, int64_t n, int64_t r, int64_t n_out, int64_t c0, int64_t c1,
             float* y,  // [n, y_stride]
             int64_t y_stride) {
  const float32x4_t vs = vdupq_n_f32(s);
  for (int64_t i = 0; i < n; ++i) {
    const float* ti = t + i * r;
    float* yi = y + i * y_stride;
    int64_t c = c0;
    // Eight vectors: enough independent sums to hide the FMA latency.
    for (; c + 32 <= c1; c += 32) up_block<8>(bt, n_out, ti, r, vs, c, yi);
    if (c + 16 <= c1) {
      up_block<4>(bt, n_out, ti, r, vs, c, yi);
      c += 16;
    }
    for (; c + 4 <= c1; c += 4) up_block<1>(bt, n_out, ti, r, vs, c, yi);
    for (; c < c1; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < r; ++j) acc += ti[j] * weight(bt[j * n_out + c]);
      yi[c] += s * acc;
    }
  }
}

}  // namespace

namespace detail {
const LoraKernels& lora_kernels_neon() {
  static const LoraKernels k{down_neon<float>, up_neon<float>, down_neon<uint16_t>, up_neon<uint16_t>};
  return k;
}
}  // namespace detail

}  // namespace ebb
