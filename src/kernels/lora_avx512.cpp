// AVX-512 LoRA products. down: four rows of a per pass over x, sharing its
// loads, two accumulators per row (two rows of x per pass in a batch, sharing
// the weight loads); up: column blocks of up to 128 held in
// registers across the rank sum. Tails use k-masks, so the last columns and
// elements go through the same arithmetic as the body. The F16 variants are
// the same code with weights widened (vcvtph2ps, exact) as they are loaded,
// their tails by masked 16-bit loads.
// GCC 12's avx512fintrin.h seeds several intrinsics with _mm512_undefined_ps()
// and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/lora_internal.h"
#include "kernels/ops_avx512.h"

namespace ebb {
namespace {

using avx512::tail_mask;

// Sixteen weights from p as floats, only the lanes of m read (others 0).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// out[q] = Σ_k a[q, k] · x[k] for q < R: R rows of a (row stride n_in)
// against one row of x, every load of x shared by the R rows.
template <int R, typename W>
inline void dot_rows(const W* a, int64_t n_in, const float* x, float* out) {
  __m512 acc0[R], acc1[R];
  for (int q = 0; q < R; ++q) acc0[q] = acc1[q] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n_in; k += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
    for (int q = 0; q < R; ++q) {
      acc0[q] = _mm512_fmadd_ps(load16(a + q * n_in + k), x0, acc0[q]);
      acc1[q] = _mm512_fmadd_ps(load16(a + q * n_in + k + 16), x1, acc1[q]);
    }
  }
  for (; k < n_in; k += 16) {
    const __mmask16 m = n_in - k >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n_in - k);
    const __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);
    for (int q = 0; q < R; ++q) acc0[q] = _mm512_fmadd_ps(load16(a + q * n_in + k, m), x0, acc0[q]);
  }
  for (int q = 0; q < R; ++q) out[q] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[q], acc1[q]));
}

// dot_rows for two rows of x (xa, xb) in one pass over the R rows of a:
// each weight vector loaded (and widened) once for both. Per (row, x) the
// arithmetic is dot_rows' exactly, so results do not depend on how rows of
// x are paired.
template <int R, typename W>
inline void dot_rows2(const W* a, int64_t n_in, const float* xa, const float* xb, float* outa, float* outb) {
  __m512 acc0[2][R], acc1[2][R];
  for (int q = 0; q < R; ++q) acc0[0][q] = acc1[0][q] = acc0[1][q] = acc1[1][q] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n_in; k += 32) {
    const __m512 xa0 = _mm512_loadu_ps(xa + k), xa1 = _mm512_loadu_ps(xa + k + 16);
    const __m512 xb0 = _mm512_loadu_ps(xb + k), xb1 = _mm512_loadu_ps(xb + k + 16);
    for (int q = 0; q < R; ++q) {
      const __m512 w0 = load16(a + q * n_in + k), w1 = load16(a + q * n_in + k + 16);
      acc0[0][q] = _mm512_fmadd_ps(w0, xa0, acc0[0][q]);
      acc1[0][q] = _mm512_fmadd_ps(w1, xa1, acc1[0][q]);
      acc0[1][q] = _mm512_fmadd_ps(w0, xb0, acc0[1][q]);
      acc1[1][q] = _mm512_fmadd_ps(w1, xb1, acc1[1][q]);
    }
  }
  for (; k < n_in; k += 16) {
    const __mmask16 m = n_in - k >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n_in - k);
    const __m512 xa0 = _mm512_maskz_loadu_ps(m, xa + k), xb0 = _mm512_maskz_loadu_ps(m, xb + k);
    for (int q = 0; q < R; ++q) {
      const __m512 w0 = load16(a + q * n_in + k, m);
      acc0[0][q] = _mm512_fmadd_ps(w0, xa0, acc0[0][q]);
      acc0[1][q] = _mm512_fmadd_ps(w0, xb0, acc0[1][q]);
    }
  }
  for (int q = 0; q < R; ++q) {
    outa[q] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[0][q], acc1[0][q]));
    outb[q] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[1][q], acc1[1][q]));
  }
}

template <typename W>
void down_avx512(const W* a,      // [r, n_in]
                 const float* x,  // [n, x_stride]
                 int64_t x_stride, int64_t n, int64_t r, int64_t n_in,
                 float* t) {  // [n, r]
  int64_t i = 0;
  // Prefill: two rows of x per pass over a (half the weight loads and
  // widenings per product).
  for (; i + 2 <= n; i += 2) {
    const float* xi = x + i * x_stride;
    float* ti = t + i * r;
    int64_t j = 0;
    for (; j + 4 <= r; j += 4) dot_rows2<4>(a + j * n_in, n_in, xi, xi + x_stride, ti + j, ti + r + j);
    for (; j < r; ++j) dot_rows2<1>(a + j * n_in, n_in, xi, xi + x_stride, ti + j, ti + r + j);
  }
  for (; i < n; ++i) {
    const float* xi = x + i * x_stride;
    int64_t j = 0;
    for (; j + 4 <= r; j += 4) dot_rows<4>(a + j * n_in, n_in, xi, t + i * r + j);
    for (; j < r; ++j) dot_rows<1>(a + j * n_in, n_in, xi, t + i * r + j);
  }
}

// y[c .. c + 16V) += s · Σ_j t[j] · bt[j, c .. c + 16V), the V vectors of
// sums in registers across j. m masks the lanes of the last vector.
template <int V, typename W>
inline void up_block(const W* bt, int64_t n_out, const float* t, int64_t r, __m512 s, int64_t c, __mmask16 m,
                     float* y) {
  __m512 acc[V];
  for (int v = 0; v < V; ++v) acc[v] = _mm512_setzero_ps();
  for (int64_t j = 0; j < r; ++j) {
    const __m512 tj = _mm512_set1_ps(t[j]);
    const W* b = bt + j * n_out + c;
    for (int v = 0; v < V - 1; ++v) acc[v] = _mm512_fmadd_ps(tj, load16(b + 16 * v), acc[v]);
    acc[V - 1] = _mm512_fmadd_ps(tj, load16(b + 16 * (V - 1), m), acc[V - 1]);
  }
  for (int v = 0; v < V - 1; ++v)
    _mm512_storeu_ps(y + c + 16 * v, _mm512_add_ps(_mm512_loadu_ps(y + c + 16 * v), _mm512_mul_ps(s, acc[v])));
  float* yl = y + c + 16 * (V - 1);
  _mm512_mask_storeu_ps(yl, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yl), _mm512_mul_ps(s, acc[V - 1])));
}

// up_block for four rows of t (row stride r) and y (row stride y_stride):
// each weight vector loaded (and widened) once for the four rows. Per row
// the arithmetic is up_block's exactly, so results do not depend on how
// rows are grouped.
template <int V, typename W>
inline void up_block4(const W* bt, int64_t n_out, const float* t, int64_t r, __m512 s, int64_t c, __mmask16 m,
                      float* y, int64_t y_stride) {
  __m512 acc[4][V];
  for (int q = 0; q < 4; ++q)
    for (int v = 0; v < V; ++v) acc[q][v] = _mm512_setzero_ps();
  for (int64_t j = 0; j < r; ++j) {
    const W* b = bt + j * n_out + c;
    __m512 w[V];
    for (int v = 0; v < V - 1; ++v) w[v] = load16(b + 16 * v);
    w[V - 1] = load16(b + 16 * (V - 1), m);
    for (int q = 0; q < 4; ++q) {
      const __m512 tj = _mm512_set1_ps(t[q * r + j]);
      for (int v = 0; v < V; ++v) acc[q][v] = _mm512_fmadd_ps(tj, w[v], acc[q][v]);
    }
  }
  for (int q = 0; q < 4; ++q) {
    float* yq = y + q * y_stride;
    for (int v = 0; v < V - 1; ++v)
      _mm512_storeu_ps(yq + c + 16 * v, _mm512_add_ps(_mm512_loadu_ps(yq + c + 16 * v), _mm512_mul_ps(s, acc[q][v])));
    float* yl = yq + c + 16 * (V - 1);
    _mm512_mask_storeu_ps(yl, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yl), _mm512_mul_ps(s, acc[q][V - 1])));
  }
}

template <typename W>
void up_avx512(const W* bt,      // [r, n_out]
               const float* t,   // [n, r]
               float s, int64_t n, int64_t r, int64_t n_out, int64_t c0, int64_t c1,
               float* y,  // [n, y_stride]
               int64_t y_stride) {
  const __m512 vs = _mm512_set1_ps(s);
  const __mmask16 full = 0xFFFF;
  int64_t i = 0;
  // Prefill: four rows per pass over B (B is read from cache once per four
  // tokens instead of once per token).
  for (; i + 4 <= n; i += 4) {
    const float* ti = t + i * r;
    float* yi = y + i * y_stride;
    int64_t c = c0;
    for (; c + 64 <= c1; c += 64) up_block4<4>(bt, n_out, ti, r, vs, c, full, yi, y_stride);
    for (; c + 16 <= c1; c += 16) up_block4<1>(bt, n_out, ti, r, vs, c, full, yi, y_stride);
    if (c < c1) up_block4<1>(bt, n_out, ti, r, vs, c, tail_mask(c1 - c), yi, y_stride);
  }
  for (; i < n; ++i) {
    const float* ti = t + i * r;
    float* yi = y + i * y_stride;
    int64_t c = c0;
    // Eight vectors: enough independent sums to hide the FMA latency.
    for (; c + 128 <= c1; c += 128) up_block<8>(bt, n_out, ti, r, vs, c, full, yi);
    if (c + 64 <= c1) {
      up_block<4>(bt, n_out, ti, r, vs, c, full, yi);
      c += 64;
    }
    for (; c + 16 <= c1; c += 16) up_block<1>(bt, n_out, ti, r, vs, c, full, yi);
    if (c < c1) up_block<1>(bt, n_out, ti, r, vs, c, tail_mask(c1 - c), yi);
  }
}

}  // namespace

namespace detail {
const LoraKernels& lora_kernels_avx512() {
  static const LoraKernels k{down_avx512<float>, up_avx512<float>, down_avx512<uint16_t>, up_avx512<uint16_t>};
  return k;
}
}  // namespace detail

}  // namespace ebb
