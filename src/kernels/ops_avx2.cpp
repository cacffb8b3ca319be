// AVX2 + FMA row operations. Tails use masked loads and stores, so every
// element goes through the same arithmetic as the body.
#include <math.h>

#include "kernels/ops_avx2.h"
#include "kernels/ops_internal.h"

namespace ebb {
namespace {

using avx2::exp_ps;
using avx2::tail_mask;

void rmsnorm_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares rounded to float, summed in double (see rms_scale).
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i), sq = _mm256_mul_ps(a, a);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  if (i < n) {
    const __m256 a = _mm256_maskload_ps(x + i, tail_mask(n - i)), sq = _mm256_mul_ps(a, a);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  const double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  const __m256 scale = _mm256_set1_ps(detail::rms_scale(ss, n, eps));
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale), _mm256_loadu_ps(w + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m,
                        _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), scale), _mm256_maskload_ps(w + i, m)));
  }
}

static inline __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void swiglu_avx2(const float* gate, const float* up, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, swiglu8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
  }
}

void add_avx2(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_add_ps(_mm256_maskload_ps(y + i, m), _mm256_maskload_ps(x + i, m)));
  }
}

void softmax_avx2(float* x, int64_t n) {
  if (n <= 0) return;
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx = ninf;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  const __m256i mt = tail_mask(n - i);
  const int64_t nb = i;
  if (nb < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + nb, mt), _mm256_castsi256_ps(mt)));
  const __m256 m = _mm256_set1_ps(avx2::hmax_ps(mx));
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i < nb; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (nb < n) {
    const __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + nb, mt), _mm256_castsi256_ps(mt));
    const __m256 e = exp_ps(_mm256_sub_ps(v, m));
    _mm256_maskstore_ps(x + nb, mt, e);
    sum = _mm256_add_ps(sum, e);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / avx2::hsum_ps(sum));
  for (i = 0; i < nb; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  if (nb < n) _mm256_maskstore_ps(x + nb, mt, _mm256_mul_ps(_mm256_maskload_ps(x + nb, mt), inv));
}

void rope_avx2(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_sin,
               RopeStyle style) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    int64_t i = 0;
    if (style == RopeStyle::kNorm) {
      // 4 pairs per vector: x = [a0 b0 a1 b1 ...], cs = [c0 s0 c1 s1 ...].
      for (; i + 4 <= half; i += 4) {
        const __m256 xv = _mm256_loadu_ps(v + 2 * i), cs = _mm256_loadu_ps(cos_sin + 2 * i);
        const __m256 c = _mm256_moveldup_ps(cs), s = _mm256_movehdup_ps(cs);
        const __m256 sw = _mm256_permute_ps(xv, 0xB1);  // [b0 a0 b1 a1 ...]
        // even lanes: a c - b s; odd lanes: b c + a s
        _mm256_storeu_ps(v + 2 * i, _mm256_fmaddsub_ps(xv, c, _mm256_mul_ps(sw, s)));
      }
      for (; i < half; ++i) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1], a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
      }
    } else {
      for (; i + 8 <= half; i += 8) {
        const __m256 cs0 = _mm256_loadu_ps(cos_sin + 2 * i), cs1 = _mm256_loadu_ps(cos_sin + 2 * i + 8);
        // De-interleave (c, s) pairs; the shuffle works per 128-bit lane, the
        // permute puts the 64-bit groups back in order.
        const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(cs0, cs1, 0x88)), 0xD8));
        const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(cs0, cs1, 0xDD)), 0xD8));
        const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c)));
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
const OpsKernels& ops_kernels_avx2() {
  static const OpsKernels k{rmsnorm_avx2, swiglu_avx2, add_avx2, softmax_avx2, rope_avx2, rope_cos_sin};
  return k;
}
}  // namespace detail

}  // namespace ebb
