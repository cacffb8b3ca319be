// AVX-512 training kernels, checked against train_ops_scalar.cpp; mirrors
// train_ops_avx2.cpp with 16 lanes and k-masks for the tails (any n and
// head_dim; a head_dim of 8 is one masked group). The dots of four positions
// are halved to 8 lanes and summed across as AVX2 does (hsum4_ps).
// GCC 12's avx512fintrin.h seeds several intrinsics with _mm512_undefined_ps()
// and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <math.h>

#include <algorithm>

#include "kernels/ops_avx2.h"
#include "kernels/ops_avx512.h"
#include "kernels/ops_internal.h"
#include "kernels/train_ops_internal.h"

namespace ebb::detail {
namespace {

using avx512::exp_ps;
using avx512::tail_mask;

constexpr int64_t kBlock = 64;  // positions per block of the forward's scores (a multiple of 16)

// A group of 16 at p: whole, or the lanes of mask m (the rest read as 0).
static inline __m512 ld(const float* p, bool full, __mmask16 m) {
  return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
static inline void st(float* p, __m512 v, bool full, __mmask16 m) {
  if (full)
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, m, v);
}
// f(d, full, mask) for each group of 16 of [0, n); the last may be partial.
template <typename F>
static inline void for_groups(int64_t n, F&& f) {
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) f(d, true, static_cast<__mmask16>(0xFFFF));
  if (d < n) f(d, false, tail_mask(n - d));
}
static inline float hsum_ps(__m512 v) { return _mm512_reduce_add_ps(v); }
// 16 lanes to 8: the upper half added to the lower.
static inline __m256 halve(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

void rmsnorm_backward_avx512(const float* x, const float* w, const float* dy, float* dx, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares rounded to float, summed in double, as the forward (rms_scale).
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  __m512 wdx = _mm512_setzero_ps();  // sum w dy x
  for_groups(n, [&](int64_t i, bool full, __mmask16 m) {
    const __m512 a = ld(x + i, full, m), sq = _mm512_mul_ps(a, a);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    wdx = _mm512_fmadd_ps(_mm512_mul_ps(ld(w + i, full, m), ld(dy + i, full, m)), a, wdx);
  });
  const float r = rms_scale(_mm512_reduce_add_pd(_mm512_add_pd(s0, s1)), n, eps);
  const __m512 vr = _mm512_set1_ps(r), vc = _mm512_set1_ps(r * r * (hsum_ps(wdx) / static_cast<float>(n)));
  for_groups(n, [&](int64_t i, bool full, __mmask16 m) {
    const __m512 wd = _mm512_mul_ps(ld(w + i, full, m), ld(dy + i, full, m));
    const __m512 t = _mm512_mul_ps(vr, _mm512_fnmadd_ps(ld(x + i, full, m), vc, wd));
    st(dx + i, _mm512_add_ps(ld(dx + i, full, m), t), full, m);
  });
}

void swiglu_backward_avx512(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for_groups(n, [&](int64_t i, bool full, __mmask16 m) {
    const __m512 gv = ld(g + i, full, m), hv = ld(dh + i, full, m);
    // sigmoid; g -> -inf: e^-g = inf, s = 0.
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    const __m512 ds = _mm512_fmadd_ps(gv, _mm512_sub_ps(one, s), one);  // 1 + g (1 - s)
    st(dg + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(hv, ld(u + i, full, m)), s), ds), full, m);
    st(du + i, _mm512_mul_ps(hv, _mm512_mul_ps(gv, s)), full, m);
  });
}

// out[t] = a . rows[t * stride] for t < nr (rows of hd floats).
static void dots(const float* a, const float* rows, int64_t stride, int64_t nr, int64_t hd, float* out) {
  int64_t t = 0;
  for (; t + 4 <= nr; t += 4) {
    const float* r = rows + t * stride;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for_groups(hd, [&](int64_t d, bool full, __mmask16 m) {
      const __m512 av = ld(a + d, full, m);
      for (int u = 0; u < 4; ++u) acc[u] = _mm512_fmadd_ps(av, ld(r + u * stride + d, full, m), acc[u]);
    });
    _mm_storeu_ps(out + t, avx2::hsum4_ps(halve(acc[0]), halve(acc[1]), halve(acc[2]), halve(acc[3])));
  }
  for (; t < nr; ++t) {
    const float* r = rows + t * stride;
    __m512 acc = _mm512_setzero_ps();
    for_groups(hd, [&](int64_t d, bool full, __mmask16 m) {
      acc = _mm512_fmadd_ps(ld(a + d, full, m), ld(r + d, full, m), acc);
    });
    out[t] = hsum_ps(acc);
  }
}

// p[t] = e^(a s[t] - b) in place for t < n.
static void exp_affine(float* p, int64_t n, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for_groups(n, [&](int64_t t, bool full, __mmask16 m) {
    st(p + t, exp_ps(_mm512_fmsub_ps(va, ld(p + t, full, m), vb)), full, m);
  });
}

void attention_forward_avx512(const float* q, const float* k, const float* v, int64_t T, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float scale, float* out, float* lse) {
  const int64_t group = attention_group(n_heads, n_kv_heads), hd = head_dim, kvs = n_kv_heads * hd;
  alignas(64) float s[kBlock];  // scores, then weights, of one block of positions
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qi = q + (i * n_heads + h) * hd;  // [hd]
      const float* kh = k + (h / group) * hd;        // position j at kh + j * kvs
      const float* vh = v + (h / group) * hd;
      float* oi = out + (i * n_heads + h) * hd;  // [hd], the running sum of p v
      for_groups(hd, [&](int64_t d, bool full, __mmask16 msk) { st(oi + d, _mm512_setzero_ps(), full, msk); });
      float m = -__builtin_inff(), l = 0.0f;  // running max and sum of weights
      for (int64_t j0 = 0; j0 <= i; j0 += kBlock) {
        const int64_t nb = std::min(kBlock, i + 1 - j0);
        dots(qi, kh + j0 * kvs, kvs, nb, hd, s);
        float bm = -__builtin_inff();
        for (int64_t t = 0; t < nb; ++t) bm = std::max(bm, scale * s[t]);
        if (bm > m) {  // rescale what the row holds to the new max (nothing, the first time)
          const float corr = expf(m - bm);
          const __m512 vc = _mm512_set1_ps(corr);
          for_groups(hd, [&](int64_t d, bool full, __mmask16 msk) {
            st(oi + d, _mm512_mul_ps(ld(oi + d, full, msk), vc), full, msk);
          });
          l *= corr;
          m = bm;
        }
        exp_affine(s, nb, scale, m);
        __m512 ls = _mm512_setzero_ps();
        for_groups(nb, [&](int64_t t, bool full, __mmask16 msk) { ls = _mm512_add_ps(ls, ld(s + t, full, msk)); });
        l += hsum_ps(ls);
        // oi += sum_t s[t] v[j0 + t], four positions per pass over the row.
        const float* vb = vh + j0 * kvs;
        int64_t t = 0;
        for (; t + 4 <= nb; t += 4) {
          const __m512 p0 = _mm512_set1_ps(s[t]), p1 = _mm512_set1_ps(s[t + 1]), p2 = _mm512_set1_ps(s[t + 2]),
                       p3 = _mm512_set1_ps(s[t + 3]);
          const float* r = vb + t * kvs;
          for_groups(hd, [&](int64_t d, bool full, __mmask16 msk) {
            __m512 o = ld(oi + d, full, msk);
            o = _mm512_fmadd_ps(p0, ld(r + d, full, msk), o);
            o = _mm512_fmadd_ps(p1, ld(r + kvs + d, full, msk), o);
            o = _mm512_fmadd_ps(p2, ld(r + 2 * kvs + d, full, msk), o);
            o = _mm512_fmadd_ps(p3, ld(r + 3 * kvs + d, full, msk), o);
            st(oi + d, o, full, msk);
          });
        }
        for (; t < nb; ++t) {
          const __m512 p = _mm512_set1_ps(s[t]);
          const float* r = vb + t * kvs;
          for_groups(hd, [&](int64_t d, bool full, __mmask16 msk) {
            st(oi + d, _mm512_fmadd_ps(p, ld(r + d, full, msk), ld(oi + d, full, msk)), full, msk);
          });
        }
      }
      const __m512 inv = _mm512_set1_ps(1.0f / l);
      for_groups(hd, [&](int64_t d, bool full, __mmask16 msk) {
        st(oi + d, _mm512_mul_ps(ld(oi + d, full, msk), inv), full, msk);
      });
      lse[i * n_heads + h] = m + logf(l);
    }
}

// For NJ positions j (rows kj, dkj, dvj, kvs floats apart), with c[u] =
// scale ds_j and p[u] = p_j: dqi += sum c k_j, dk_j += c qi, dv_j += p doi.
template <int NJ>
static inline void backward_rows(const float* qi, const float* doi, float* dqi, const float* kj, float* dkj,
                                 float* dvj, int64_t kvs, const float* c, const float* p, int64_t hd) {
  __m512 vc[NJ], vp[NJ];
  for (int u = 0; u < NJ; ++u) {
    vc[u] = _mm512_set1_ps(c[u]);
    vp[u] = _mm512_set1_ps(p[u]);
  }
  for_groups(hd, [&](int64_t d, bool full, __mmask16 m) {
    const __m512 qv = ld(qi + d, full, m), dov = ld(doi + d, full, m);
    __m512 dqv = ld(dqi + d, full, m);
    for (int u = 0; u < NJ; ++u) {
      const int64_t o = u * kvs + d;
      dqv = _mm512_fmadd_ps(vc[u], ld(kj + o, full, m), dqv);
      st(dkj + o, _mm512_fmadd_ps(vc[u], qv, ld(dkj + o, full, m)), full, m);
      st(dvj + o, _mm512_fmadd_ps(vp[u], dov, ld(dvj + o, full, m)), full, m);
    }
    st(dqi + d, dqv, full, m);
  });
}

void attention_backward_avx512(const float* q, const float* k, const float* v, const float* out, const float* dout,
                             const float* lse, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, float* dq, float* dk, float* dv, float* scratch) {
  const int64_t group = attention_group(n_heads, n_kv_heads), hd = head_dim, kvs = n_kv_heads * hd;
  std::fill(dq, dq + T * n_heads * hd, 0.0f);
  std::fill(dk, dk + T * kvs, 0.0f);
  std::fill(dv, dv + T * kvs, 0.0f);
  float* p = scratch;  // [T]: the row's probabilities
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t row = (i * n_heads + h) * hd, kv0 = (h / group) * hd;
      const float *qi = q + row, *doi = dout + row;  // [hd]
      float Di;
      dots(doi, out + row, 0, 1, hd, &Di);
      dots(qi, k + kv0, kvs, i + 1, hd, p);
      exp_affine(p, i + 1, scale, lse[i * n_heads + h]);
      float dp[4], c[4];
      int64_t j = 0;
      for (; j + 4 <= i + 1; j += 4) {
        const int64_t kv = j * kvs + kv0;
        dots(doi, v + kv, kvs, 4, hd, dp);
        for (int u = 0; u < 4; ++u) c[u] = scale * (p[j + u] * (dp[u] - Di));
        backward_rows<4>(qi, doi, dq + row, k + kv, dk + kv, dv + kv, kvs, c, p + j, hd);
      }
      for (; j <= i; ++j) {
        const int64_t kv = j * kvs + kv0;
        dots(doi, v + kv, kvs, 1, hd, dp);
        c[0] = scale * (p[j] * (dp[0] - Di));
        backward_rows<1>(qi, doi, dq + row, k + kv, dk + kv, dv + kv, kvs, c, p + j, hd);
      }
    }
}

double cross_entropy_avx512(float* z, int64_t n_vocab, int32_t target, float weight) {
  check_target(n_vocab, target);
  if (weight == 0.0f) {
    std::fill(z, z + n_vocab, 0.0f);
    return 0.0;
  }
  const float zt = z[target];
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = ninf;
  // Lanes past the row read as -inf: they change neither the max nor the sum.
  for_groups(n_vocab, [&](int64_t i, bool full, __mmask16 m) {
    mx = _mm512_max_ps(mx, full ? _mm512_loadu_ps(z + i) : _mm512_mask_loadu_ps(ninf, m, z + i));
  });
  const float mxs = _mm512_reduce_max_ps(mx);
  const __m512 vm = _mm512_set1_ps(mxs);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();  // the sum in double, as the reference
  for_groups(n_vocab, [&](int64_t i, bool full, __mmask16 m) {
    const __m512 x = full ? _mm512_loadu_ps(z + i) : _mm512_mask_loadu_ps(ninf, m, z + i);
    const __m512 e = exp_ps(_mm512_sub_ps(x, vm));
    st(z + i, e, full, m);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  });
  const double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const __m512 c = _mm512_set1_ps(static_cast<float>(static_cast<double>(weight) / sum));
  for_groups(n_vocab,
             [&](int64_t i, bool full, __mmask16 m) { st(z + i, _mm512_mul_ps(ld(z + i, full, m), c), full, m); });
  z[target] -= weight;
  return static_cast<double>(weight) * (log(sum) + static_cast<double>(mxs) - static_cast<double>(zt));
}

}  // namespace

void fill_train_ops_avx512(TrainOpsKernels& k) {
  k.rmsnorm_backward = rmsnorm_backward_avx512;
  k.swiglu_backward = swiglu_backward_avx512;
  k.attention_forward = attention_forward_avx512;
  k.attention_backward = attention_backward_avx512;
  k.cross_entropy = cross_entropy_avx512;
}

}  // namespace ebb::detail
