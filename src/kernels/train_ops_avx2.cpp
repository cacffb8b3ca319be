// AVX2 + FMA training kernels, checked against train_ops_scalar.cpp. Tails
// (of a row, of a head) use masked loads and stores, so any n and head_dim
// go through the vector code. Attention is vectorized over head_dim, with
// the dots of four positions summed across lanes together (hsum4_ps); the
// forward, which has no scratch, keeps one block of kBlock scores on the
// stack and folds the blocks into the row by the running max (the row is
// rescaled when a block raises it), so each score is computed once.
#include <math.h>

#include <algorithm>

#include "kernels/ops_avx2.h"
#include "kernels/ops_internal.h"
#include "kernels/train_ops_internal.h"

namespace ebb::detail {
namespace {

using avx2::exp_ps;
using avx2::hsum_ps;
using avx2::tail_mask;

constexpr int64_t kBlock = 64;  // positions per block of the forward's scores (a multiple of 8)

// A group of 8 at p: whole, or the lanes of mask m (the rest read as 0).
static inline __m256 ld(const float* p, bool full, __m256i m) {
  return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}
static inline void st(float* p, __m256 v, bool full, __m256i m) {
  if (full)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, m, v);
}
// f(d, full, mask) for each group of 8 of [0, n); the last may be partial.
template <typename F>
static inline void for_groups(int64_t n, F&& f) {
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) f(d, true, _mm256_setzero_si256());
  if (d < n) f(d, false, tail_mask(n - d));
}

void rmsnorm_backward_avx2(const float* x, const float* w, const float* dy, float* dx, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares rounded to float, summed in double, as the forward (rms_scale).
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  __m256 wdx = _mm256_setzero_ps();  // sum w dy x
  for_groups(n, [&](int64_t i, bool full, __m256i m) {
    const __m256 a = ld(x + i, full, m), sq = _mm256_mul_ps(a, a);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    wdx = _mm256_fmadd_ps(_mm256_mul_ps(ld(w + i, full, m), ld(dy + i, full, m)), a, wdx);
  });
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  const float r = rms_scale(_mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h))), n, eps);
  const __m256 vr = _mm256_set1_ps(r), vc = _mm256_set1_ps(r * r * (hsum_ps(wdx) / static_cast<float>(n)));
  for_groups(n, [&](int64_t i, bool full, __m256i m) {
    const __m256 wd = _mm256_mul_ps(ld(w + i, full, m), ld(dy + i, full, m));
    const __m256 t = _mm256_mul_ps(vr, _mm256_fnmadd_ps(ld(x + i, full, m), vc, wd));
    st(dx + i, _mm256_add_ps(ld(dx + i, full, m), t), full, m);
  });
}

void swiglu_backward_avx2(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for_groups(n, [&](int64_t i, bool full, __m256i m) {
    const __m256 gv = ld(g + i, full, m), hv = ld(dh + i, full, m);
    // sigmoid; g -> -inf: e^-g = inf, s = 0.
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    const __m256 ds = _mm256_fmadd_ps(gv, _mm256_sub_ps(one, s), one);  // 1 + g (1 - s)
    st(dg + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(hv, ld(u + i, full, m)), s), ds), full, m);
    st(du + i, _mm256_mul_ps(hv, _mm256_mul_ps(gv, s)), full, m);
  });
}

// out[t] = a . rows[t * stride] for t < nr (rows of hd floats).
static void dots(const float* a, const float* rows, int64_t stride, int64_t nr, int64_t hd, float* out) {
  int64_t t = 0;
  for (; t + 4 <= nr; t += 4) {
    const float* r = rows + t * stride;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for_groups(hd, [&](int64_t d, bool full, __m256i m) {
      const __m256 av = ld(a + d, full, m);
      for (int u = 0; u < 4; ++u) acc[u] = _mm256_fmadd_ps(av, ld(r + u * stride + d, full, m), acc[u]);
    });
    _mm_storeu_ps(out + t, avx2::hsum4_ps(acc[0], acc[1], acc[2], acc[3]));
  }
  for (; t < nr; ++t) {
    const float* r = rows + t * stride;
    __m256 acc = _mm256_setzero_ps();
    for_groups(hd, [&](int64_t d, bool full, __m256i m) {
      acc = _mm256_fmadd_ps(ld(a + d, full, m), ld(r + d, full, m), acc);
    });
    out[t] = hsum_ps(acc);
  }
}

// p[t] = e^(a s[t] - b) in place for t < n.
static void exp_affine(float* p, int64_t n, float a, float b) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for_groups(n, [&](int64_t t, bool full, __m256i m) {
    st(p + t, exp_ps(_mm256_fmsub_ps(va, ld(p + t, full, m), vb)), full, m);
  });
}

void attention_forward_avx2(const float* q, const float* k, const float* v, int64_t T, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float scale, float* out, float* lse) {
  const int64_t group = attention_group(n_heads, n_kv_heads), hd = head_dim, kvs = n_kv_heads * hd;
  alignas(32) float s[kBlock];  // scores, then weights, of one block of positions
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qi = q + (i * n_heads + h) * hd;  // [hd]
      const float* kh = k + (h / group) * hd;        // position j at kh + j * kvs
      const float* vh = v + (h / group) * hd;
      float* oi = out + (i * n_heads + h) * hd;  // [hd], the running sum of p v
      for_groups(hd, [&](int64_t d, bool full, __m256i msk) { st(oi + d, _mm256_setzero_ps(), full, msk); });
      float m = -__builtin_inff(), l = 0.0f;  // running max and sum of weights
      for (int64_t j0 = 0; j0 <= i; j0 += kBlock) {
        const int64_t nb = std::min(kBlock, i + 1 - j0);
        dots(qi, kh + j0 * kvs, kvs, nb, hd, s);
        float bm = -__builtin_inff();
        for (int64_t t = 0; t < nb; ++t) bm = std::max(bm, scale * s[t]);
        if (bm > m) {  // rescale what the row holds to the new max (nothing, the first time)
          const float corr = expf(m - bm);
          const __m256 vc = _mm256_set1_ps(corr);
          for_groups(hd, [&](int64_t d, bool full, __m256i msk) {
            st(oi + d, _mm256_mul_ps(ld(oi + d, full, msk), vc), full, msk);
          });
          l *= corr;
          m = bm;
        }
        exp_affine(s, nb, scale, m);
        __m256 ls = _mm256_setzero_ps();
        for_groups(nb, [&](int64_t t, bool full, __m256i msk) { ls = _mm256_add_ps(ls, ld(s + t, full, msk)); });
        l += hsum_ps(ls);
        // oi += sum_t s[t] v[j0 + t], four positions per pass over the row.
        const float* vb = vh + j0 * kvs;
        int64_t t = 0;
        for (; t + 4 <= nb; t += 4) {
          const __m256 p0 = _mm256_set1_ps(s[t]), p1 = _mm256_set1_ps(s[t + 1]), p2 = _mm256_set1_ps(s[t + 2]),
                       p3 = _mm256_set1_ps(s[t + 3]);
          const float* r = vb + t * kvs;
          for_groups(hd, [&](int64_t d, bool full, __m256i msk) {
            __m256 o = ld(oi + d, full, msk);
            o = _mm256_fmadd_ps(p0, ld(r + d, full, msk), o);
            o = _mm256_fmadd_ps(p1, ld(r + kvs + d, full, msk), o);
            o = _mm256_fmadd_ps(p2, ld(r + 2 * kvs + d, full, msk), o);
            o = _mm256_fmadd_ps(p3, ld(r + 3 * kvs + d, full, msk), o);
            st(oi + d, o, full, msk);
          });
        }
        for (; t < nb; ++t) {
          const __m256 p = _mm256_set1_ps(s[t]);
          const float* r = vb + t * kvs;
          for_groups(hd, [&](int64_t d, bool full, __m256i msk) {
            st(oi + d, _mm256_fmadd_ps(p, ld(r + d, full, msk), ld(oi + d, full, msk)), full, msk);
          });
        }
      }
      const __m256 inv = _mm256_set1_ps(1.0f / l);
      for_groups(hd, [&](int64_t d, bool full, __m256i msk) {
        st(oi + d, _mm256_mul_ps(ld(oi + d, full, msk), inv), full, msk);
      });
      lse[i * n_heads + h] = m + logf(l);
    }
}

// For NJ positions j (rows kj, dkj, dvj, kvs floats apart), with c[u] =
// scale ds_j and p[u] = p_j: dqi += sum c k_j, dk_j += c qi, dv_j += p doi.
template <int NJ>
static inline void backward_rows(const float* qi, const float* doi, float* dqi, const float* kj, float* dkj,
                                 float* dvj, int64_t kvs, const float* c, const float* p, int64_t hd) {
  __m256 vc[NJ], vp[NJ];
  for (int u = 0; u < NJ; ++u) {
    vc[u] = _mm256_set1_ps(c[u]);
    vp[u] = _mm256_set1_ps(p[u]);
  }
  for_groups(hd, [&](int64_t d, bool full, __m256i m) {
    const __m256 qv = ld(qi + d, full, m), dov = ld(doi + d, full, m);
    __m256 dqv = ld(dqi + d, full, m);
    for (int u = 0; u < NJ; ++u) {
      const int64_t o = u * kvs + d;
      dqv = _mm256_fmadd_ps(vc[u], ld(kj + o, full, m), dqv);
      st(dkj + o, _mm256_fmadd_ps(vc[u], qv, ld(dkj + o, full, m)), full, m);
      st(dvj + o, _mm256_fmadd_ps(vp[u], dov, ld(dvj + o, full, m)), full, m);
    }
    st(dqi + d, dqv, full, m);
  });
}

void attention_backward_avx2(const float* q, const float* k, const float* v, const float* out, const float* dout,
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

double cross_entropy_avx2(float* z, int64_t n_vocab, int32_t target, float weight) {
  check_target(n_vocab, target);
  if (weight == 0.0f) {
    std::fill(z, z + n_vocab, 0.0f);
    return 0.0;
  }
  const float zt = z[target];
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  // Lanes past the row read as -inf: they change neither the max nor the sum.
  const auto load = [&](int64_t i, bool full, __m256i m) {
    return full ? _mm256_loadu_ps(z + i) : _mm256_blendv_ps(ninf, ld(z + i, false, m), _mm256_castsi256_ps(m));
  };
  __m256 mx = ninf;
  for_groups(n_vocab, [&](int64_t i, bool full, __m256i m) { mx = _mm256_max_ps(mx, load(i, full, m)); });
  const float mxs = avx2::hmax_ps(mx);
  const __m256 vm = _mm256_set1_ps(mxs);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();  // the sum in double, as the reference
  for_groups(n_vocab, [&](int64_t i, bool full, __m256i m) {
    const __m256 e = exp_ps(_mm256_sub_ps(load(i, full, m), vm));
    st(z + i, e, full, m);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  });
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d hs = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  const double sum = _mm_cvtsd_f64(_mm_add_sd(hs, _mm_unpackhi_pd(hs, hs)));
  const __m256 c = _mm256_set1_ps(static_cast<float>(static_cast<double>(weight) / sum));
  for_groups(n_vocab,
             [&](int64_t i, bool full, __m256i m) { st(z + i, _mm256_mul_ps(ld(z + i, full, m), c), full, m); });
  z[target] -= weight;
  return static_cast<double>(weight) * (log(sum) + static_cast<double>(mxs) - static_cast<double>(zt));
}

}  // namespace

void fill_train_ops_avx2(TrainOpsKernels& k) {
  k.rmsnorm_backward = rmsnorm_backward_avx2;
  k.swiglu_backward = swiglu_backward_avx2;
  k.attention_forward = attention_forward_avx2;
  k.attention_backward = attention_backward_avx2;
  k.cross_entropy = cross_entropy_avx2;
}

}  // namespace ebb::detail
