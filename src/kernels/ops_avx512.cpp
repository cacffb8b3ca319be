// AVX-512 row operations. Tails use k-masks, so every element goes through
// the same arithmetic as the body; mirrors ops_avx2.cpp lane for lane.
// GCC 12's avx512fintrin.h seeds several intrinsics (moveldup, permute, ...)
// with _mm512_undefined_ps() and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <math.h>

#include "kernels/ops_avx512.h"
#include "kernels/ops_internal.h"

namespace ebb {
namespace {

void rmsnorm_avx512(const float* x, const float* w, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares rounded to float, summed in double (see rms_scale).
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i < n; i += 16) {
    const __m512 a = i + 16 <= n ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(avx512::tail_mask(n - i), x + i);
    const __m512 sq = _mm512_mul_ps(a, a);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
  }
  const double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const __m512 scale = _mm512_set1_ps(detail::rms_scale(ss, n, eps));
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), scale), _mm512_loadu_ps(w + i)));
  if (i < n) {
    const __mmask16 m = avx512::tail_mask(n - i);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale), _mm512_maskz_loadu_ps(m, w + i)));
  }
}

static inline __m512 swiglu16(__m512 g, __m512 u) {
  const __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void swiglu_avx512(const float* gate, const float* up, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, swiglu16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = avx512::tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, swiglu16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void add_avx512(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = avx512::tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void softmax_avx512(float* x, int64_t n) {
  if (n <= 0) return;
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = ninf;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
  const int64_t nb = i;
  const __mmask16 mt = avx512::tail_mask(n - nb);
  if (nb < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, mt, x + nb));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i < nb; i += 16) {
    const __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (nb < n) {
    const __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, mt, x + nb), m));
    _mm512_mask_storeu_ps(x + nb, mt, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (i = 0; i < nb; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (nb < n) _mm512_mask_storeu_ps(x + nb, mt, _mm512_mul_ps(_mm512_maskz_loadu_ps(mt, x + nb), inv));
}

void rope_avx512(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_sin,
                 RopeStyle style) {
  const int64_t half = rot_dim / 2;
  // Gather indices that de-interleave (c, s) pairs from two vectors.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    int64_t i = 0;
    if (style == RopeStyle::kNorm) {
      for (; i + 8 <= half; i += 8) {  // 8 pairs per vector
        const __m512 xv = _mm512_loadu_ps(v + 2 * i), cs = _mm512_loadu_ps(cos_sin + 2 * i);
        const __m512 c = _mm512_moveldup_ps(cs), s = _mm512_movehdup_ps(cs);
        const __m512 sw = _mm512_permute_ps(xv, 0xB1);
        _mm512_storeu_ps(v + 2 * i, _mm512_fmaddsub_ps(xv, c, _mm512_mul_ps(sw, s)));
      }
      for (; i < half; ++i) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1], a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
      }
    } else {
      for (; i + 16 <= half; i += 16) {
        const __m512 cs0 = _mm512_loadu_ps(cos_sin + 2 * i), cs1 = _mm512_loadu_ps(cos_sin + 2 * i + 16);
        const __m512 c = _mm512_permutex2var_ps(cs0, even, cs1), s = _mm512_permutex2var_ps(cs0, odd, cs1);
        const __m512 a = _mm512_loadu_ps(v + i), b = _mm512_loadu_ps(v + i + half);
        _mm512_storeu_ps(v + i, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
        _mm512_storeu_ps(v + i + half, _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c)));
      }
      for (; i < half; ++i) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1], a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
    }
  }
}

}  // namespace

namespace detail {
const OpsKernels& ops_kernels_avx512() {
  static const OpsKernels k{rmsnorm_avx512, swiglu_avx512, add_avx512, softmax_avx512, rope_avx512, rope_cos_sin};
  return k;
}
}  // namespace detail

}  // namespace ebb
