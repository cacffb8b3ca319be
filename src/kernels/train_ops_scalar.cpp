// Scalar reference of the training kernels (STYLE habit 2): plain loops in
// the order the formulas of train_ops.h read, sums in float except where the
// forward sums in double (RMSNorm's squares, so r is the forward's r) and
// cross-entropy's log-sum-exp (a vocabulary of 1e5 terms). Attention is done
// the obvious way: scores, their max, exp, sum; the forward has no scratch,
// so it computes each row's scores twice (once for the max, once for the
// weights) rather than keep them.
#include <cmath>
#include <limits>

#include "kernels/ops_internal.h"
#include "kernels/train_ops_internal.h"

namespace ebb::detail {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

void rmsnorm_backward_scalar(const float* x, const float* w, const float* dy, float* dx, int64_t n, float eps) {
  if (n <= 0) return;
  double ss = 0.0;  // as the forward (rmsnorm_scalar): squares rounded to float, added in double
  for (int64_t i = 0; i < n; ++i) {
    const float sq = x[i] * x[i];
    ss += static_cast<double>(sq);
  }
  const float r = rms_scale(ss, n, eps);
  float wdx = 0.0f;  // sum_j w[j] dy[j] x[j]
  for (int64_t i = 0; i < n; ++i) wdx += w[i] * dy[i] * x[i];
  const float c = r * r * (wdx / static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) dx[i] += r * (w[i] * dy[i] - x[i] * c);
}

void swiglu_backward_scalar(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));  // sigmoid; g -> -inf: e^-g = inf, s = 0
    dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    du[i] = dh[i] * (g[i] * s);
  }
}

void attention_forward_scalar(const float* q, const float* k, const float* v, int64_t T, int64_t n_heads,
                              int64_t n_kv_heads, int64_t head_dim, float scale, float* out, float* lse) {
  const int64_t group = attention_group(n_heads, n_kv_heads), hd = head_dim;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qi = q + (i * n_heads + h) * hd;  // [hd]
      const float* kh = k + (h / group) * hd;        // row j at kh + j * n_kv_heads * hd
      const float* vh = v + (h / group) * hd;
      float* oi = out + (i * n_heads + h) * hd;  // [hd]
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= i; ++j) m = std::fmax(m, scale * dot(qi, kh + j * n_kv_heads * hd, hd));
      for (int64_t d = 0; d < hd; ++d) oi[d] = 0.0f;
      float sum = 0.0f;
      for (int64_t j = 0; j <= i; ++j) {
        const float p = std::exp(scale * dot(qi, kh + j * n_kv_heads * hd, hd) - m);
        sum += p;
        const float* vj = vh + j * n_kv_heads * hd;
        for (int64_t d = 0; d < hd; ++d) oi[d] += p * vj[d];
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < hd; ++d) oi[d] *= inv;
      lse[i * n_heads + h] = m + std::log(sum);
    }
}

void attention_backward_scalar(const float* q, const float* k, const float* v, const float* out, const float* dout,
                               const float* lse, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                               float scale, float* dq, float* dk, float* dv, float* scratch) {
  const int64_t group = attention_group(n_heads, n_kv_heads), hd = head_dim, kvs = n_kv_heads * hd;
  for (int64_t e = 0; e < T * n_heads * hd; ++e) dq[e] = 0.0f;
  for (int64_t e = 0; e < T * kvs; ++e) dk[e] = dv[e] = 0.0f;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t row = (i * n_heads + h) * hd;
      const float *qi = q + row, *oi = out + row, *doi = dout + row;  // [hd]
      float* dqi = dq + row;
      const float Di = dot(doi, oi, hd), li = lse[i * n_heads + h];
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t kv = j * kvs + (h / group) * hd;
        const float *kj = k + kv, *vj = v + kv;  // [hd]
        float *dkj = dk + kv, *dvj = dv + kv;
        const float p = std::exp(scale * dot(qi, kj, hd) - li);
        const float ds = p * (dot(doi, vj, hd) - Di);
        for (int64_t d = 0; d < hd; ++d) {
          dqi[d] += scale * ds * kj[d];
          dkj[d] += scale * ds * qi[d];
          dvj[d] += p * doi[d];
        }
      }
    }
}

double cross_entropy_scalar(float* z, int64_t n_vocab, int32_t target, float weight) {
  check_target(n_vocab, target);
  if (weight == 0.0f) {
    for (int64_t i = 0; i < n_vocab; ++i) z[i] = 0.0f;
    return 0.0;
  }
  const float zt = z[target];
  float m = z[0];
  for (int64_t i = 1; i < n_vocab; ++i) m = std::fmax(m, z[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    z[i] = std::exp(z[i] - m);
    sum += static_cast<double>(z[i]);
  }
  const float c = static_cast<float>(static_cast<double>(weight) / sum);
  for (int64_t i = 0; i < n_vocab; ++i) z[i] *= c;
  z[target] -= weight;
  return static_cast<double>(weight) * (std::log(sum) + static_cast<double>(m) - static_cast<double>(zt));
}

}  // namespace

void fill_train_ops_scalar(TrainOpsKernels& k) {
  k.rmsnorm_backward = rmsnorm_backward_scalar;
  k.swiglu_backward = swiglu_backward_scalar;
  k.attention_forward = attention_forward_scalar;
  k.attention_backward = attention_backward_scalar;
  k.cross_entropy = cross_entropy_scalar;
}

}  // namespace ebb::detail
