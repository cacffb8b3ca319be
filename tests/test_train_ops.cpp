// Training kernels (kernels/train_ops.h). The scalar reference is checked
// against double precision: every backward against central differences of
// the loss L = sum dy . y, y computed by a double-precision forward written
// here (the real check of a gradient), attention's forward and the
// cross-entropy's loss and gradient against direct double formulas. Every
// supported target is then checked against the scalar reference within a
// tolerance relative to the magnitudes of the terms involved. Outputs said
// to be written start as NaN (so a skipped element shows), those said to
// accumulate start from random values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/train_ops.h"

namespace ebb {
namespace {

const int64_t kSizes[] = {1, 7, 33, 260};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

template <typename T>
double max_abs(const std::vector<T>& v) {
  double m = 0.0;
  for (T e : v) m = std::max(m, std::fabs(static_cast<double>(e)));
  return m;
}

// |got[i] - want[i]| <= tol[i] for every i (tol per element).
template <typename W>
void expect_close(const std::vector<float>& got, const std::vector<W>& want, const std::vector<double>& tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = static_cast<double>(want[i]);
    ASSERT_FALSE(std::isnan(g)) << what << " at " << i << " (not written)";
    ASSERT_LE(std::fabs(g - w), tol[i]) << what << " at " << i << ": " << g << " vs " << w;
  }
}
// The same tolerance everywhere.
template <typename W>
void expect_close(const std::vector<float>& got, const std::vector<W>& want, double tol, const std::string& what) {
  expect_close(got, want, std::vector<double>(got.size(), tol), what);
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Central difference of f at x[e] (x restored after).
template <typename F>
double central_difference(std::vector<double>& x, size_t e, double h, F f) {
  const double x0 = x[e];
  x[e] = x0 + h;
  const double lp = f();
  x[e] = x0 - h;
  const double lm = f();
  x[e] = x0;
  return (lp - lm) / (2.0 * h);
}

// ---------------------------------------------------------------- RMSNorm

const float kEps = 1e-5f;

// L = sum dy . (x r w), r = 1 / sqrt(mean(x^2) + eps).
double rmsnorm_loss(const std::vector<double>& x, const std::vector<float>& w, const std::vector<float>& dy) {
  double ss = 0.0;
  for (double e : x) ss += e * e;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + kEps);
  double l = 0.0;
  for (size_t i = 0; i < x.size(); ++i) l += dy[i] * x[i] * r * w[i];
  return l;
}

// Per element: the magnitudes of the terms of dx, r |w dy| + r^3 |x| mean|w dy x|.
std::vector<double> rmsnorm_term_scale(const std::vector<float>& x, const std::vector<float>& w,
                                       const std::vector<float>& dy) {
  const size_t n = x.size();
  double ss = 0.0, m = 0.0;
  for (size_t i = 0; i < n; ++i) {
    ss += double(x[i]) * x[i];
    m += std::fabs(double(w[i]) * dy[i] * x[i]);
  }
  const double r = 1.0 / std::sqrt(ss / n + kEps);
  std::vector<double> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = r * std::fabs(double(w[i]) * dy[i]) + r * r * r * std::fabs(x[i]) * m / n;
  return s;
}

struct RmsCase {
  std::vector<float> x, w, dy, dx0;
};
RmsCase rms_case(int64_t n, uint32_t seed) {
  return {uniform(n, -3, 3, seed), uniform(n, 0.5f, 1.5f, seed + 1), uniform(n, -1, 1, seed + 2),
          uniform(n, -1, 1, seed + 3)};
}

TEST(TrainOpsScalar, RmsnormBackwardMatchesFiniteDifferences) {
  const TrainOpsKernels& k = train_ops_kernels(Isa::kScalar);
  for (int64_t n : kSizes) {
    const RmsCase c = rms_case(n, 10 + n);
    std::vector<float> dx = c.dx0;
    k.rmsnorm_backward(c.x.data(), c.w.data(), c.dy.data(), dx.data(), n, kEps);
    std::vector<double> xd = to_double(c.x), fd(n);
    for (int64_t e = 0; e < n; ++e)
      fd[e] = central_difference(xd, e, 1e-4, [&] { return rmsnorm_loss(xd, c.w, c.dy); });
    std::vector<double> tol = rmsnorm_term_scale(c.x, c.w, c.dy);
    for (auto& t : tol) t = 2e-5 * t + 1e-6;  // + the rounding of dx0 + dx
    expect_close(minus(dx, c.dx0), fd, tol, "rmsnorm_backward n=" + std::to_string(n));
  }
}

// ---------------------------------------------------------------- SwiGLU

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// g and u with ordinary values and both ends of the sigmoid.
std::vector<float> swiglu_gates(int64_t n, uint32_t seed) {
  std::vector<float> g = uniform(n, -8, 8, seed);
  const float ends[] = {-100.0f, -30.0f, 30.0f, 100.0f, 0.0f};
  for (int64_t i = 0; i < n && i < 5; ++i) g[i * 7 % n] = ends[i];
  return g;
}

TEST(TrainOpsScalar, SwigluBackwardMatchesFiniteDifferences) {
  const TrainOpsKernels& k = train_ops_kernels(Isa::kScalar);
  for (int64_t n : kSizes) {
    const std::vector<float> g = swiglu_gates(n, 20 + n), u = uniform(n, -2, 2, 21 + n), dh = uniform(n, -1, 1, 22 + n);
    std::vector<float> dg(n, kNaN), du(n, kNaN);
    k.swiglu_backward(g.data(), u.data(), dh.data(), dg.data(), du.data(), n);
    // L = sum dh silu(g) u; elementwise, so one element's difference is its own term.
    std::vector<double> gd = to_double(g), ud = to_double(u), fdg(n), fdu(n), tg(n), tu(n);
    for (int64_t e = 0; e < n; ++e) {
      const auto term = [&] { return dh[e] * gd[e] * sigmoid(gd[e]) * ud[e]; };
      fdg[e] = central_difference(gd, e, 1e-4, term);
      fdu[e] = central_difference(ud, e, 1e-4, term);
      const double s = sigmoid(g[e]);
      tg[e] = 1e-5 * std::fabs(double(dh[e]) * u[e]) * s * (1.0 + std::fabs(g[e]) * (1.0 - s)) + 1e-9;
      tu[e] = 1e-5 * std::fabs(double(dh[e]) * g[e] * s) + 1e-9;
    }
    expect_close(dg, fdg, tg, "swiglu_backward dg n=" + std::to_string(n));
    expect_close(du, fdu, tu, "swiglu_backward du n=" + std::to_string(n));
  }
}

// ---------------------------------------------------------------- attention

struct AttnShape {
  int64_t T, n_heads, n_kv_heads, head_dim;
  float q_range;  // q in [-q_range, q_range]: larger is a sharper softmax
  std::string str() const {
    return "T=" + std::to_string(T) + " heads=" + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
           " hd=" + std::to_string(head_dim) + " q=" + std::to_string(q_range);
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
  size_t q_size() const { return T * n_heads * head_dim; }
  size_t kv_size() const { return T * n_kv_heads * head_dim; }
};

// The shapes the brief of the kernel names: GQA groups of 2 and 4 (and
// plain multi-head), head_dim 8, 16, 64, T from one row to a few blocks.
std::vector<AttnShape> attn_shapes() {
  std::vector<AttnShape> v;
  for (int64_t kvh : {4, 2, 1})
    for (int64_t hd : {8, 16, 64})
      for (int64_t T : {1, 3, 17, 40}) v.push_back({T, 4, kvh, hd, 1.0f});
  v.push_back({17, 4, 2, 16, 6.0f});  // sharp: scores up to ~ 36 sqrt(hd)
  return v;
}
// More for the targets against scalar: head_dim with tails past groups of
// 4, 8 and 16 lanes (6, 10, 12, 20), a large head_dim, and T past several of
// the forward's blocks of positions.
std::vector<AttnShape> attn_target_shapes() {
  std::vector<AttnShape> v = attn_shapes();
  v.push_back({9, 4, 2, 6, 1.0f});
  v.push_back({17, 2, 1, 10, 2.0f});
  v.push_back({9, 4, 2, 12, 1.0f});
  v.push_back({9, 2, 1, 20, 2.0f});
  v.push_back({33, 4, 1, 128, 1.0f});
  v.push_back({150, 2, 1, 64, 3.0f});
  return v;
}

struct AttnCase {
  AttnShape sh;
  std::vector<float> q, k, v, dout;
};
AttnCase attn_case(const AttnShape& sh, uint32_t seed) {
  return {sh, uniform(sh.q_size(), -sh.q_range, sh.q_range, seed), uniform(sh.kv_size(), -1, 1, seed + 1),
          uniform(sh.kv_size(), -1, 1, seed + 2), uniform(sh.q_size(), -1, 1, seed + 3)};
}

// Double forward of query row i of head h: its output into o[hd], returns its lse.
double attn_row(const AttnShape& sh, const std::vector<double>& q, const std::vector<double>& k,
                const std::vector<double>& v, int64_t h, int64_t i, double* o) {
  const int64_t hd = sh.head_dim, g = h / (sh.n_heads / sh.n_kv_heads);
  const double* qi = &q[(i * sh.n_heads + h) * hd];
  std::vector<double> s(i + 1);
  double m = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    const double* kj = &k[(j * sh.n_kv_heads + g) * hd];
    double d = 0.0;
    for (int64_t e = 0; e < hd; ++e) d += qi[e] * kj[e];
    s[j] = d * static_cast<double>(sh.scale());
    m = std::max(m, s[j]);
  }
  double sum = 0.0;
  for (int64_t e = 0; e < hd; ++e) o[e] = 0.0;
  for (int64_t j = 0; j <= i; ++j) {
    const double p = std::exp(s[j] - m);
    sum += p;
    const double* vj = &v[(j * sh.n_kv_heads + g) * hd];
    for (int64_t e = 0; e < hd; ++e) o[e] += p * vj[e];
  }
  for (int64_t e = 0; e < hd; ++e) o[e] /= sum;
  return m + std::log(sum);
}

// sum over heads [h0, h1) and rows [i0, T) of dout . out.
double attn_loss(const AttnCase& c, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, int64_t h0, int64_t h1, int64_t i0) {
  const int64_t hd = c.sh.head_dim;
  std::vector<double> o(hd);
  double l = 0.0;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t i = i0; i < c.sh.T; ++i) {
      attn_row(c.sh, q, k, v, h, i, o.data());
      const float* d = &c.dout[(i * c.sh.n_heads + h) * hd];
      for (int64_t e = 0; e < hd; ++e) l += d[e] * o[e];
    }
  return l;
}

struct AttnForward {
  std::vector<float> out, lse;
};
AttnForward run_forward(const TrainOpsKernels& k, const AttnCase& c) {
  const AttnShape& sh = c.sh;
  AttnForward f{std::vector<float>(sh.q_size(), kNaN), std::vector<float>(sh.T * sh.n_heads, kNaN)};
  k.attention_forward(c.q.data(), c.k.data(), c.v.data(), sh.T, sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.scale(),
                      f.out.data(), f.lse.data());
  return f;
}

struct AttnGrads {
  std::vector<float> dq, dk, dv;
};
AttnGrads run_backward(const TrainOpsKernels& k, const AttnCase& c, const AttnForward& f) {
  const AttnShape& sh = c.sh;
  AttnGrads g{std::vector<float>(sh.q_size(), kNaN), std::vector<float>(sh.kv_size(), kNaN),
              std::vector<float>(sh.kv_size(), kNaN)};
  std::vector<float> scratch(sh.T, kNaN);
  k.attention_backward(c.q.data(), c.k.data(), c.v.data(), f.out.data(), c.dout.data(), f.lse.data(), sh.T,
                       sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.scale(), g.dq.data(), g.dk.data(), g.dv.data(),
                       scratch.data());
  return g;
}

// Tolerances: out by the magnitude of v (a weighted mean of its rows), lse
// by the magnitude of the scores; every gradient by the largest of the
// three (dv = sum p do alone is of the order of do, while dq and dk vanish
// where a row sees one position and hold only rounding).
double out_tol(const AttnCase& c, double rel) { return rel * max_abs(c.v); }
std::vector<double> lse_tol(const std::vector<float>& lse, double rel) {
  std::vector<double> t(lse.size());
  for (size_t i = 0; i < lse.size(); ++i) t[i] = rel * (1.0 + std::fabs(lse[i]));
  return t;
}
double grad_tol(const AttnGrads& g, double rel) {
  return rel * std::max({max_abs(g.dq), max_abs(g.dk), max_abs(g.dv)}) + 1e-7;
}

// The whole forward in double.
struct AttnForwardDouble {
  std::vector<double> out, lse;
};
AttnForwardDouble double_forward(const AttnCase& c) {
  const AttnShape& sh = c.sh;
  const std::vector<double> q = to_double(c.q), k = to_double(c.k), v = to_double(c.v);
  AttnForwardDouble f{std::vector<double>(sh.q_size()), std::vector<double>(sh.T * sh.n_heads)};
  for (int64_t i = 0; i < sh.T; ++i)
    for (int64_t h = 0; h < sh.n_heads; ++h)
      f.lse[i * sh.n_heads + h] = attn_row(sh, q, k, v, h, i, &f.out[(i * sh.n_heads + h) * sh.head_dim]);
  return f;
}

TEST(TrainOpsScalar, AttentionForwardMatchesDouble) {
  const TrainOpsKernels& k = train_ops_kernels(Isa::kScalar);
  uint32_t seed = 100;
  for (const AttnShape& sh : attn_target_shapes()) {
    const AttnCase c = attn_case(sh, seed += 4);
    const AttnForward f = run_forward(k, c);
    const AttnForwardDouble want = double_forward(c);
    expect_close(f.out, want.out, out_tol(c, 1e-5), "attention_forward out " + sh.str());
    expect_close(f.lse, want.lse, lse_tol(f.lse, 1e-5), "attention_forward lse " + sh.str());
  }
}

// Which elements of a tensor of n to check by differences: all of a small
// one, else both ends and a random sample.
std::vector<size_t> fd_elements(size_t n, uint32_t seed) {
  std::vector<size_t> e;
  if (n <= 128) {
    for (size_t i = 0; i < n; ++i) e.push_back(i);
    return e;
  }
  e = {0, n - 1};
  std::mt19937 rng(seed);
  for (int i = 0; i < 24; ++i) e.push_back(rng() % n);
  return e;
}

TEST(TrainOpsScalar, AttentionBackwardMatchesFiniteDifferences) {
  const TrainOpsKernels& k = train_ops_kernels(Isa::kScalar);
  uint32_t seed = 200;
  for (const AttnShape& sh : attn_shapes()) {
    const AttnCase c = attn_case(sh, seed += 4);
    const AttnGrads g = run_backward(k, c, run_forward(k, c));
    std::vector<double> q = to_double(c.q), kk = to_double(c.k), v = to_double(c.v);
    const int64_t hd = sh.head_dim, group = sh.n_heads / sh.n_kv_heads;
    const double tol = grad_tol(g, 1e-4);
    // Only the rows an element reaches change L: q of (i, h) reaches row i of
    // head h; k and v of (j, kv head) reach rows j.. of the heads of its group.
    for (size_t e : fd_elements(q.size(), seed)) {
      const int64_t i = e / (sh.n_heads * hd), h = e / hd % sh.n_heads;
      const double fd = central_difference(q, e, 1e-3, [&] { return attn_loss(c, q, kk, v, h, h + 1, i); });
      ASSERT_NEAR(g.dq[e], fd, tol) << "dq " << sh.str() << " at " << e;
    }
    for (int which = 0; which < 2; ++which) {
      std::vector<double>& x = which == 0 ? kk : v;
      const std::vector<float>& gx = which == 0 ? g.dk : g.dv;
      for (size_t e : fd_elements(x.size(), seed + 1 + which)) {
        const int64_t j = e / (sh.n_kv_heads * hd), kvh = e / hd % sh.n_kv_heads;
        const double fd = central_difference(
            x, e, 1e-3, [&] { return attn_loss(c, q, kk, v, kvh * group, (kvh + 1) * group, j); });
        ASSERT_NEAR(gx[e], fd, tol) << (which == 0 ? "dk " : "dv ") << sh.str() << " at " << e;
      }
    }
  }
}

// ---------------------------------------------------------------- cross-entropy

struct CeCase {
  std::vector<float> z;
  int32_t target;
  float weight;
  std::string str() const {
    return "n_vocab=" + std::to_string(z.size()) + " target=" + std::to_string(target) +
           " weight=" + std::to_string(weight);
  }
};

// Logits of n_vocab: ordinary (in [-5, 5]) or large (each +-80 or in between).
std::vector<float> logits(int64_t n, bool large, uint32_t seed) {
  std::vector<float> z = uniform(n, large ? -80 : -5, large ? 80 : 5, seed);
  if (large)
    for (int64_t i = 0; i < n; i += 3) z[i] = i % 2 ? -80.0f : 80.0f;
  return z;
}

std::vector<CeCase> ce_cases(const std::vector<int64_t>& sizes) {
  std::vector<CeCase> v;
  uint32_t seed = 300;
  for (int64_t n : sizes)
    for (bool large : {false, true})
      for (int32_t t : {int32_t{0}, static_cast<int32_t>(n / 2), static_cast<int32_t>(n - 1)})
        for (float w : {1.0f, -0.5f, 0.0f}) v.push_back({logits(n, large, ++seed), t, w});
  return v;
}

// weight (lse(z) - z[t]) in double.
double ce_loss(const std::vector<double>& z, int32_t t, double w) {
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0.0;
  for (double e : z) s += std::exp(e - m);
  return w * (m + std::log(s) - z[t]);
}

TEST(TrainOpsScalar, CrossEntropyMatchesDouble) {
  const TrainOpsKernels& k = train_ops_kernels(Isa::kScalar);
  for (const CeCase& c : ce_cases({1, 7, 33, 260, 5000})) {
    std::vector<float> dz = c.z;
    const double loss = k.cross_entropy(dz.data(), dz.size(), c.target, c.weight);
    std::vector<double> z = to_double(c.z), want(z.size());
    const double m = *std::max_element(z.begin(), z.end());
    double s = 0.0;
    for (double e : z) s += std::exp(e - m);
    for (size_t i = 0; i < z.size(); ++i) want[i] = c.weight * (std::exp(z[i] - m) / s - (i == size_t(c.target)));
    const double aw = std::fabs(c.weight);
    EXPECT_NEAR(loss, ce_loss(z, c.target, c.weight), 1e-6 * aw * (1.0 + std::fabs(m))) << c.str();
    expect_close(dz, want, 1e-6 * aw, "cross_entropy dz " + c.str());
    if (c.weight == 0.0f) {
      EXPECT_EQ(loss, 0.0) << c.str();
      for (float e : dz) ASSERT_EQ(e, 0.0f) << c.str();
    }
    if (z.size() > 260) continue;  // the differences: small vocabularies suffice
    std::vector<double> fd(z.size());
    for (size_t e = 0; e < z.size(); ++e)
      fd[e] = central_difference(z, e, 1e-3, [&] { return ce_loss(z, c.target, c.weight); });
    expect_close(dz, fd, 1e-6 * aw + 1e-9, "cross_entropy dz vs differences " + c.str());
  }
}

// ---------------------------------------------------------------- every target against scalar

std::string param_name(const ::testing::TestParamInfo<Isa>& info) {
  std::string s(isa_name(info.param));
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

class TrainOpsTarget : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    isa_ = GetParam();
    if (!isa_supported(isa_)) GTEST_SKIP() << isa_name(isa_) << " not supported on this machine";
  }
  const TrainOpsKernels& k() const { return train_ops_kernels(isa_); }
  const TrainOpsKernels& ref() const { return train_ops_kernels(Isa::kScalar); }
  std::string tag(const std::string& s) const { return std::string(isa_name(isa_)) + " " + s; }
  Isa isa_ = Isa::kScalar;
};

TEST_P(TrainOpsTarget, TableHasTheseKernels) {
  EXPECT_TRUE(k().rmsnorm_backward && k().swiglu_backward && k().attention_forward && k().attention_backward &&
              k().cross_entropy);
}

const int64_t kTargetSizes[] = {1, 7, 8, 15, 16, 17, 33, 260, 4099};

TEST_P(TrainOpsTarget, RmsnormBackwardMatchesScalar) {
  for (int64_t n : kTargetSizes) {
    const RmsCase c = rms_case(n, 40 + n);
    std::vector<float> dx = c.dx0, want = c.dx0;
    k().rmsnorm_backward(c.x.data(), c.w.data(), c.dy.data(), dx.data(), n, kEps);
    ref().rmsnorm_backward(c.x.data(), c.w.data(), c.dy.data(), want.data(), n, kEps);
    std::vector<double> tol = rmsnorm_term_scale(c.x, c.w, c.dy);
    for (auto& t : tol) t = 2e-5 * t + 1e-6;
    expect_close(dx, want, tol, tag("rmsnorm_backward n=" + std::to_string(n)));
  }
}

TEST_P(TrainOpsTarget, SwigluBackwardMatchesScalar) {
  for (int64_t n : kTargetSizes) {
    const std::vector<float> g = swiglu_gates(n, 50 + n), u = uniform(n, -2, 2, 51 + n), dh = uniform(n, -1, 1, 52 + n);
    std::vector<float> dg(n, kNaN), du(n, kNaN), wg(n, kNaN), wu(n, kNaN);
    k().swiglu_backward(g.data(), u.data(), dh.data(), dg.data(), du.data(), n);
    ref().swiglu_backward(g.data(), u.data(), dh.data(), wg.data(), wu.data(), n);
    std::vector<double> tg(n), tu(n);
    for (int64_t e = 0; e < n; ++e) {
      const double s = sigmoid(g[e]);
      tg[e] = 1e-5 * std::fabs(double(dh[e]) * u[e]) * s * (1.0 + std::fabs(g[e]) * (1.0 - s)) + 1e-12;
      tu[e] = 1e-5 * std::fabs(double(dh[e]) * g[e] * s) + 1e-12;
    }
    expect_close(dg, wg, tg, tag("swiglu_backward dg n=" + std::to_string(n)));
    expect_close(du, wu, tu, tag("swiglu_backward du n=" + std::to_string(n)));
  }
}

TEST_P(TrainOpsTarget, AttentionForwardMatchesScalar) {
  uint32_t seed = 400;
  for (const AttnShape& sh : attn_target_shapes()) {
    const AttnCase c = attn_case(sh, seed += 4);
    const AttnForward f = run_forward(k(), c), want = run_forward(ref(), c);
    expect_close(f.out, want.out, out_tol(c, 1e-5), tag("attention_forward out " + sh.str()));
    expect_close(f.lse, want.lse, lse_tol(want.lse, 1e-5), tag("attention_forward lse " + sh.str()));
    const AttnForwardDouble exact = double_forward(c);  // and each target against the exact result
    expect_close(f.out, exact.out, out_tol(c, 1e-5), tag("attention_forward out vs double " + sh.str()));
    expect_close(f.lse, exact.lse, lse_tol(f.lse, 1e-5), tag("attention_forward lse vs double " + sh.str()));
  }
}

TEST_P(TrainOpsTarget, AttentionBackwardMatchesScalar) {
  uint32_t seed = 500;
  for (const AttnShape& sh : attn_target_shapes()) {
    const AttnCase c = attn_case(sh, seed += 4);
    const AttnForward f = run_forward(ref(), c);  // the same saved results for both
    const AttnGrads g = run_backward(k(), c, f), want = run_backward(ref(), c, f);
    const double tol = grad_tol(want, 2e-5);
    expect_close(g.dq, want.dq, tol, tag("attention_backward dq " + sh.str()));
    expect_close(g.dk, want.dk, tol, tag("attention_backward dk " + sh.str()));
    expect_close(g.dv, want.dv, tol, tag("attention_backward dv " + sh.str()));
  }
}

TEST_P(TrainOpsTarget, CrossEntropyMatchesScalar) {
  for (const CeCase& c : ce_cases({1, 7, 16, 33, 260, 50001})) {
    std::vector<float> dz = c.z, want = c.z;
    const double loss = k().cross_entropy(dz.data(), dz.size(), c.target, c.weight);
    const double want_loss = ref().cross_entropy(want.data(), want.size(), c.target, c.weight);
    const double aw = std::fabs(c.weight);
    EXPECT_NEAR(loss, want_loss, 1e-6 * aw * (1.0 + std::fabs(want_loss))) << tag(c.str());
    expect_close(dz, want, 1e-6 * aw, tag("cross_entropy dz " + c.str()));
    if (c.weight == 0.0f) {
      EXPECT_EQ(loss, 0.0) << tag(c.str());
      for (float e : dz) ASSERT_EQ(e, 0.0f) << tag(c.str());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, TrainOpsTarget, ::testing::ValuesIn(supported_isas()), param_name);

}  // namespace
}  // namespace ebb
