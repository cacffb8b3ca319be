// AVX2 + FMA LoRA products; lora_avx512.cpp at half the width. down: four
// rows of a per pass over x, sharing its loads, two accumulators per row;
// up: column blocks of up to 64 held in registers across the rank sum. Tails
// use masked loads and stores, so they go through the same arithmetic as the
// body. The F16 variants are the same code with weights widened by F16C
// (vcvtph2ps, exact) as they are loaded; their tails are copied to a zeroed
// block first (AVX2 has no masked 16-bit load).
#include <immintrin.h>

#include <cstring>

#include "kernels/lora_internal.h"
#include "kernels/ops_avx2.h"

namespace ebb {
namespace {

using avx2::hsum_ps;
using avx2::tail_mask;

// Eight weights from p as floats; the masked form reads only the first
// `len` (< 8) of them, the other lanes 0.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_tail(const float* p, int64_t, __m256i m) { return _mm256_maskload_ps(p, m); }
inline __m256 load8_tail(const uint16_t* p, int64_t len, __m256i) {
  alignas(16) uint16_t tmp[8] = {};
  std::memcpy(tmp, p, static_cast<size_t>(len) * sizeof(uint16_t));
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

// out[q] = Σ_k a[q, k] · x[k] for q < R: R rows of a (row stride n_in)
// against one row of x, every load of x shared by the R rows.
template <int R, typename W>
inline void dot_rows(const W* a, int64_t n_in, const float* x, float* out) {
  __m256 acc0[R], acc1[R];
  for (int q = 0; q < R; ++q) acc0[q] = acc1[q] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n_in; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int q = 0; q < R; ++q) {
      acc0[q] = _mm256_fmadd_ps(load8(a + q * n_in + k), x0, acc0[q]);
      acc1[q] = _mm256_fmadd_ps(load8(a + q * n_in + k + 8), x1, acc1[q]);
    }
  }
  if (k + 8 <= n_in) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    for (int q = 0; q < R; ++q) acc0[q] = _mm256_fmadd_ps(load8(a + q * n_in + k), x0, acc0[q]);
    k += 8;
  }
  if (k < n_in) {
    const __m256i m = tail_mask(n_in - k);
    const __m256 x0 = _mm256_maskload_ps(x + k, m);
    for (int q = 0; q < R; ++q) acc1[q] = _mm256_fmadd_ps(load8_tail(a + q * n_in + k, n_in - k, m), x0, acc1[q]);
  }
  for (int q = 0; q < R; ++q) out[q] = hsum_ps(_mm256_add_ps(acc0[q], acc1[q]));
}

template <typename W>
void down_avx2(const W* a,       // [r, n_in]
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

// y[c .. c + 8V) += s · Σ_j t[j] · bt[j, c .. c + 8V), the V vectors of sums
// in registers across j. V == 1 with kMasked: only the first len lanes (m).
template <int V, bool kMasked, typename W>
inline void up_block(const W* bt, int64_t n_out, const float* t, int64_t r, __m256 s, int64_t c, int64_t len,
                     __m256i m, float* y) {
  static_assert(!kMasked || V == 1);
  __m256 acc[V];
  for (int v = 0; v < V; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < r; ++j) {
    const __m256 tj = _mm256_broadcast_ss(t + j);
    const W* b = bt + j * n_out + c;
    if constexpr (kMasked) {
      acc[0] = _mm256_fmadd_ps(tj, load8_tail(b, len, m), acc[0]);
    } else {
      for (int v = 0; v < V; ++v) acc[v] = _mm256_fmadd_ps(tj, load8(b + 8 * v), acc[v]);
    }
  }
  if constexpr (kMasked) {
    _mm256_maskstore_ps(y + c, m, _mm256_add_ps(_mm256_maskload_ps(y + c, m), _mm256_mul_ps(s, acc[0])));
  } else {
    for (int v = 0; v < V; ++v)
      _mm256_storeu_ps(y + c + 8 * v, _mm256_add_ps(_mm256_loadu_ps(y + c + 8 * v), _mm256_mul_ps(s, acc[v])));
  }
}

template <typename W>
void up_avx2(const W* bt,       // [r, n_out]
             const float* t,   // [n, r]
             float s, int64_t n, int64_t r, int64_t n_out, int64_t c0, int64_t c1,
             float* y,  // [n, y_stride]
             int64_t y_stride) {
  const __m256 vs = _mm256_set1_ps(s);
  const __m256i none = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; ++i) {
    const float* ti = t + i * r;
    float* yi = y + i * y_stride;
    int64_t c = c0;
    // Eight vectors: enough independent sums to hide the FMA latency.
    for (; c + 64 <= c1; c += 64) up_block<8, false>(bt, n_out, ti, r, vs, c, 8, none, yi);
    if (c + 32 <= c1) {
      up_block<4, false>(bt, n_out, ti, r, vs, c, 8, none, yi);
      c += 32;
    }
    for (; c + 8 <= c1; c += 8) up_block<1, false>(bt, n_out, ti, r, vs, c, 8, none, yi);
    if (c < c1) up_block<1, true>(bt, n_out, ti, r, vs, c, c1 - c, tail_mask(c1 - c), yi);
  }
}

}  // namespace

namespace detail {
const LoraKernels& lora_kernels_avx2() {
  static const LoraKernels k{down_avx2<float>, up_avx2<float>, down_avx2<uint16_t>, up_avx2<uint16_t>};
  return k;
}
}  // namespace detail

}  // namespace ebb
