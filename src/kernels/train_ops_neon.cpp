// aarch64 NEON training kernels, checked against train_ops_scalar.cpp; the
// structure of train_ops_avx2.cpp in groups of four. Rows whose length is
// not a multiple of 4 end in a scalar loop (head_dim) or in a group padded
// through a small buffer (the elementwise kernels, the exp of a row), so
// any n and head_dim are served. Arm builds use -ffp-contract=off: the
// multiply-adds fused here are the vfmaq_f32 spelled out.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ops_internal.h"
#include "kernels/ops_neon.h"
#include "kernels/train_ops_internal.h"

namespace ebb::detail {
namespace {

constexpr int64_t kBlock = 64;  // positions per block of the forward's scores (a multiple of 4)

using neon::exp_ps;  // kernels/ops_neon.h

// A group of four of p starting at element i, padded with `pad` past n.
inline float32x4_t load_part(const float* p, int64_t i, int64_t n, float pad = 0.0f) {
  if (i + 4 <= n) return vld1q_f32(p + i);
  float t[4] = {pad, pad, pad, pad};
  std::memcpy(t, p + i, (n - i) * sizeof(float));
  return vld1q_f32(t);
}
// Stores the elements of v that lie before n.
inline void store_part(float* p, float32x4_t v, int64_t i, int64_t n) {
  if (i + 4 <= n) return vst1q_f32(p + i, v);
  float t[4];
  vst1q_f32(t, v);
  std::memcpy(p + i, t, (n - i) * sizeof(float));
}

void rmsnorm_backward_neon(const float* x, const float* w, const float* dy, float* dx, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares rounded to float, summed in double, as the forward (rms_scale).
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = vdupq_n_f64(0.0);
  float32x4_t wdx = vdupq_n_f32(0.0f);  // sum w dy x (padding is 0)
  for (int64_t i = 0; i < n; i += 4) {
    const float32x4_t a = load_part(x, i, n), sq = vmulq_f32(a, a);
    s0 = vaddq_f64(s0, vcvt_f64_f32(vget_low_f32(sq)));
    s1 = vaddq_f64(s1, vcvt_high_f64_f32(sq));
    wdx = vfmaq_f32(wdx, vmulq_f32(load_part(w, i, n), load_part(dy, i, n)), a);
  }
  const float r = rms_scale(vaddvq_f64(vaddq_f64(s0, s1)), n, eps);
  const float32x4_t vc = vdupq_n_f32(r * r * (vaddvq_f32(wdx) / static_cast<float>(n)));
  for (int64_t i = 0; i < n; i += 4) {
    const float32x4_t wd = vmulq_f32(load_part(w, i, n), load_part(dy, i, n));
    const float32x4_t t = vmulq_n_f32(vfmsq_f32(wd, load_part(x, i, n), vc), r);
    store_part(dx, vaddq_f32(load_part(dx, i, n), t), i, n);
  }
}

void swiglu_backward_neon(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  for (int64_t i = 0; i < n; i += 4) {
    const float32x4_t gv = load_part(g, i, n), hv = load_part(dh, i, n);
    // sigmoid; g -> -inf: e^-g = inf, s = 0.
    const float32x4_t s = vdivq_f32(one, vaddq_f32(one, exp_ps(vnegq_f32(gv))));
    const float32x4_t ds = vfmaq_f32(one, gv, vsubq_f32(one, s));  // 1 + g (1 - s)
    store_part(dg, vmulq_f32(vmulq_f32(vmulq_f32(hv, load_part(u, i, n)), s), ds), i, n);
    store_part(du, vmulq_f32(hv, vmulq_f32(gv, s)), i, n);
  }
}

// out[t] = a . rows[t * stride] for t < nr (rows of hd floats).
void dots(const float* a, const float* rows, int64_t stride, int64_t nr, int64_t hd, float* out) {
  const int64_t hv = hd & ~int64_t{3};
  int64_t t = 0;
  for (; t + 4 <= nr; t += 4) {
    const float* r = rows + t * stride;
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t d = 0; d < hv; d += 4) {
      const float32x4_t av = vld1q_f32(a + d);
      for (int u = 0; u < 4; ++u) acc[u] = vfmaq_f32(acc[u], av, vld1q_f32(r + u * stride + d));
    }
    float s[4];
    vst1q_f32(s, vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3])));
    for (int64_t d = hv; d < hd; ++d)
      for (int u = 0; u < 4; ++u) s[u] += a[d] * r[u * stride + d];
    std::memcpy(out + t, s, sizeof s);
  }
  for (; t < nr; ++t) {
    const float* r = rows + t * stride;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t d = 0; d < hv; d += 4) acc = vfmaq_f32(acc, vld1q_f32(a + d), vld1q_f32(r + d));
    float s = vaddvq_f32(acc);
    for (int64_t d = hv; d < hd; ++d) s += a[d] * r[d];
    out[t] = s;
  }
}

// p[t] = e^(a p[t] - b) in place for t < n.
void exp_affine(float* p, int64_t n, float a, float b) {
  const float32x4_t vb = vdupq_n_f32(b);
  for (int64_t t = 0; t < n; t += 4) store_part(p, exp_ps(vsubq_f32(vmulq_n_f32(load_part(p, t, n), a), vb)), t, n);
}

// y[0, hd) = y * c + sum_u p[u] x[u * stride + .] for NP rows of x (y's own
// factor first: c = 1 adds, c = 0 with NP = 0 clears).
template <int NP>
inline void scale_add_rows(float* y, float c, const float* p, const float* x, int64_t stride, int64_t hd) {
  const int64_t hv = hd & ~int64_t{3};
  for (int64_t d = 0; d < hv; d += 4) {
    float32x4_t o = vmulq_n_f32(vld1q_f32(y + d), c);
    for (int u = 0; u < NP; ++u) o = vfmaq_n_f32(o, vld1q_f32(x + u * stride + d), p[u]);
    vst1q_f32(y + d, o);
  }
  for (int64_t d = hv; d < hd; ++d) {
    float o = y[d] * c;
    for (int u = 0; u < NP; ++u) o += p[u] * x[u * stride + d];
    y[d] = o;
  }
}

void attention_forward_neon(const float* q, const float* k, const float* v, int64_t T, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float scale, float* out, float* lse) {
  const int64_t group = attention_group(n_heads, n_kv_heads), hd = head_dim, kvs = n_kv_heads * hd;
  float s[kBlock];  // scores, then weights, of one block of positions
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qi = q + (i * n_heads + h) * hd;  // [hd]
      const float* kh = k + (h / group) * hd;        // position j at kh + j * kvs
      const float* vh = v + (h / group) * hd;
      float* oi = out + (i * n_heads + h) * hd;  // [hd], the running sum of p v
      std::fill(oi, oi + hd, 0.0f);
      float m = -__builtin_inff(), l = 0.0f;  // running max and sum of weights
      for (int64_t j0 = 0; j0 <= i; j0 += kBlock) {
        const int64_t nb = std::min(kBlock, i + 1 - j0);
        dots(qi, kh + j0 * kvs, kvs, nb, hd, s);
        float bm = -__builtin_inff();
        for (int64_t t = 0; t < nb; ++t) bm = std::max(bm, scale * s[t]);
        if (bm > m) {  // rescale what the row holds to the new max (nothing, the first time)
          const float corr = std::exp(m - bm);
          scale_add_rows<0>(oi, corr, nullptr, nullptr, 0, hd);
          l *= corr;
          m = bm;
        }
        exp_affine(s, nb, scale, m);
        float32x4_t ls = vdupq_n_f32(0.0f);
        for (int64_t t = 0; t < nb; t += 4) ls = vaddq_f32(ls, load_part(s, t, nb));
        l += vaddvq_f32(ls);
        const float* vb = vh + j0 * kvs;
        int64_t t = 0;
        for (; t + 4 <= nb; t += 4) scale_add_rows<4>(oi, 1.0f, s + t, vb + t * kvs, kvs, hd);
        for (; t < nb; ++t) scale_add_rows<1>(oi, 1.0f, s + t, vb + t * kvs, kvs, hd);
      }
      scale_add_rows<0>(oi, 1.0f / l, nullptr, nullptr, 0, hd);
      lse[i * n_heads + h] = m + std::log(l);
    }
}

// For NJ positions j (rows kj, dkj, dvj, kvs floats apart), with c[u] =
// scale ds_j and p[u] = p_j: dqi += sum c k_j, dk_j += c qi, dv_j += p doi.
template <int NJ>
inline void backward_rows(const float* qi, const float* doi, float* dqi, const float* kj, float* dkj, float* dvj,
                          int64_t kvs, const float* c, const float* p, int64_t hd) {
  const int64_t hv = hd & ~int64_t{3};
  for (int64_t d = 0; d < hv; d += 4) {
    const float32x4_t qv = vld1q_f32(qi + d), dov = vld1q_f32(doi + d);
    float32x4_t dqv = vld1q_f32(dqi + d);
    for (int u = 0; u < NJ; ++u) {
      const int64_t o = u * kvs + d;
      dqv = vfmaq_n_f32(dqv, vld1q_f32(kj + o), c[u]);
      vst1q_f32(dkj + o, vfmaq_n_f32(vld1q_f32(dkj + o), qv, c[u]));
      vst1q_f32(dvj + o, vfmaq_n_f32(vld1q_f32(dvj + o), dov, p[u]));
    }
    vst1q_f32(dqi + d, dqv);
  }
  for (int64_t d = hv; d < hd; ++d)
    for (int u = 0; u < NJ; ++u) {
      const int64_t o = u * kvs + d;
      dqi[d] += c[u] * kj[o];
      dkj[o] += c[u] * qi[d];
      dvj[o] += p[u] * doi[d];
    }
}

void attention_backward_neon(const float* q, const float* k, const float* v, const float* out, const float* dout,
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

double cross_entropy_neon(float* z, int64_t n_vocab, int32_t target, float weight) {
  check_target(n_vocab, target);
  if (weight == 0.0f) {
    std::fill(z, z + n_vocab, 0.0f);
    return 0.0;
  }
  const float zt = z[target], ninf = -__builtin_inff();
  // Padding is -inf: it changes neither the max nor the sum.
  float32x4_t mx = vdupq_n_f32(ninf);
  for (int64_t i = 0; i < n_vocab; i += 4) mx = vmaxq_f32(mx, load_part(z, i, n_vocab, ninf));
  const float m = vmaxvq_f32(mx);
  const float32x4_t vm = vdupq_n_f32(m);
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = vdupq_n_f64(0.0);  // the sum in double, as the reference
  for (int64_t i = 0; i < n_vocab; i += 4) {
    const float32x4_t e = exp_ps(vsubq_f32(load_part(z, i, n_vocab, ninf), vm));
    store_part(z, e, i, n_vocab);
    s0 = vaddq_f64(s0, vcvt_f64_f32(vget_low_f32(e)));
    s1 = vaddq_f64(s1, vcvt_high_f64_f32(e));
  }
  const double sum = vaddvq_f64(vaddq_f64(s0, s1));
  const float c = static_cast<float>(static_cast<double>(weight) / sum);
  for (int64_t i = 0; i < n_vocab; i += 4) store_part(z, vmulq_n_f32(load_part(z, i, n_vocab), c), i, n_vocab);
  z[target] -= weight;
  return static_cast<double>(weight) * (std::log(sum) + static_cast<double>(m) - static_cast<double>(zt));
}

}  // namespace

void fill_train_ops_neon(TrainOpsKernels& k) {
  k.rmsnorm_backward = rmsnorm_backward_neon;
  k.swiglu_backward = swiglu_backward_neon;
  k.attention_forward = attention_forward_neon;
  k.attention_backward = attention_backward_neon;
  k.cross_entropy = cross_entropy_neon;
}

}  // namespace ebb::detail
