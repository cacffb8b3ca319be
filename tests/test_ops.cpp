// Row operations: every supported target against the scalar reference, and
// the scalar reference against direct double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace ebb {
namespace {

const int64_t kSizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 257, 1000, 4096};

std::vector<float> random_vec(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// |a - b| <= rel * |b| + abs, element by element.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel, double abs,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i])) {
      EXPECT_TRUE(std::isnan(a[i])) << what << " at " << i;
      continue;
    }
    if (a[i] == b[i]) continue;  // also equal infinities
    ASSERT_LE(std::fabs(static_cast<double>(a[i]) - b[i]), rel * std::fabs(b[i]) + abs)
        << what << " at " << i << ": " << a[i] << " vs " << b[i];
  }
}

std::string tag(Isa isa, int64_t n) { return std::string(isa_name(isa)) + " n=" + std::to_string(n); }

TEST(OpsTest, ScalarIsAlwaysSupported) {
  const auto isas = supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  for (Isa isa : isas) {
    const OpsKernels& k = ops_kernels(isa);
    EXPECT_TRUE(k.rmsnorm && k.swiglu && k.add && k.softmax && k.rope) << isa_name(isa);
  }
}

TEST(OpsTest, RmsnormScalarMatchesDouble) {
  for (int64_t n : kSizes) {
    const auto x = random_vec(n, -3, 3, 1 + n), w = random_vec(n, 0.5f, 1.5f, 2 + n);
    std::vector<float> y(n);
    ops_kernels(Isa::kScalar).rmsnorm(x.data(), w.data(), y.data(), n, 1e-5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double s = 1.0 / std::sqrt(ss / n + 1e-5);
    std::vector<float> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = static_cast<float>(x[i] * s * w[i]);
    expect_close(y, ref, 3e-7, 0, "n=" + std::to_string(n));
  }
}

TEST(OpsTest, RmsnormMatchesScalar) {
  for (Isa isa : supported_isas()) {
    for (int64_t n : kSizes) {
      const auto x = random_vec(n, -3, 3, 10 + n), w = random_vec(n, 0.5f, 1.5f, 20 + n);
      std::vector<float> ref(n), y(n);
      ops_kernels(Isa::kScalar).rmsnorm(x.data(), w.data(), ref.data(), n, 1e-6f);
      ops_kernels(isa).rmsnorm(x.data(), w.data(), y.data(), n, 1e-6f);
      expect_close(y, ref, 2e-6, 0, tag(isa, n));
      // In place.
      std::vector<float> z = x;
      ops_kernels(isa).rmsnorm(z.data(), w.data(), z.data(), n, 1e-6f);
      expect_close(z, y, 0, 0, tag(isa, n) + " in place");
    }
  }
}

TEST(OpsTest, SwigluMatchesScalar) {
  for (Isa isa : supported_isas()) {
    for (int64_t n : kSizes) {
      auto g = random_vec(n, -12, 12, 30 + n);
      const auto u = random_vec(n, -2, 2, 40 + n);
      // Extremes: exp overflow / underflow inside silu.
      const float special[] = {0.0f, -0.0f, -100.0f, 100.0f, -88.0f, 88.0f, -87.0f, 1e-20f, -200.0f};
      for (size_t i = 0; i < std::size(special) && i < size_t(n); ++i) g[(i * 7) % n] = special[i];
      std::vector<float> ref(n), y(n);
      ops_kernels(Isa::kScalar).swiglu(g.data(), u.data(), ref.data(), n);
      ops_kernels(isa).swiglu(g.data(), u.data(), y.data(), n);
      expect_close(y, ref, 2e-6, 1e-37, tag(isa, n));
      std::vector<float> z = g;  // y may alias gate
      ops_kernels(isa).swiglu(z.data(), u.data(), z.data(), n);
      expect_close(z, y, 0, 0, tag(isa, n) + " in place");
    }
  }
}

TEST(OpsTest, SwigluScalarMatchesDouble) {
  const auto g = random_vec(1000, -20, 20, 5), u = random_vec(1000, -2, 2, 6);
  std::vector<float> y(1000), ref(1000);
  ops_kernels(Isa::kScalar).swiglu(g.data(), u.data(), y.data(), 1000);
  for (int i = 0; i < 1000; ++i) ref[i] = static_cast<float>(double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i]);
  expect_close(y, ref, 1e-6, 1e-37, "scalar");
}

TEST(OpsTest, AddIsExact) {
  for (Isa isa : supported_isas()) {
    for (int64_t n : kSizes) {
      const auto x = random_vec(n, -5, 5, 50 + n), y0 = random_vec(n, -5, 5, 60 + n);
      std::vector<float> ref = y0, y = y0;
      for (int64_t i = 0; i < n; ++i) ref[i] += x[i];
      ops_kernels(isa).add(y.data(), x.data(), n);
      expect_close(y, ref, 0, 0, tag(isa, n));
    }
  }
}

TEST(OpsTest, SoftmaxMatchesScalar) {
  for (Isa isa : supported_isas()) {
    for (int64_t n : kSizes) {
      auto x = random_vec(n, -30, 30, 70 + n);
      if (n > 3) x[n / 2] = -std::numeric_limits<float>::infinity();  // a masked entry
      std::vector<float> ref = x, y = x;
      ops_kernels(Isa::kScalar).softmax(ref.data(), n);
      ops_kernels(isa).softmax(y.data(), n);
      expect_close(y, ref, 2e-6, 1e-30, tag(isa, n));
      double sum = 0;
      for (float v : y) sum += v;
      EXPECT_NEAR(sum, 1.0, 2e-6) << tag(isa, n);
      if (n > 3) {
        EXPECT_EQ(y[n / 2], 0.0f) << tag(isa, n);
      }
    }
  }
}

TEST(OpsTest, SoftmaxScalarMatchesDouble) {
  for (int64_t n : kSizes) {
    const auto x = random_vec(n, -30, 30, 80 + n);
    std::vector<float> y = x, ref(n);
    ops_kernels(Isa::kScalar).softmax(y.data(), n);
    double mx = -1e300, sum = 0;
    for (float v : x) mx = std::max(mx, double(v));
    for (float v : x) sum += std::exp(v - mx);
    for (int64_t i = 0; i < n; ++i) ref[i] = static_cast<float>(std::exp(x[i] - mx) / sum);
    // x - max is rounded to float (ulp(60) ~ 4e-6), which alone moves e^(x - max)
    // by up to ~2e-6 relative; the largest entries are far more accurate.
    expect_close(y, ref, 4e-6, 1e-38, "n=" + std::to_string(n));
  }
}

TEST(OpsTest, RopeCosSinMatchesDouble) {
  for (float base : {10000.0f, 500000.0f, 1000000.0f}) {
    for (float fs : {1.0f, 0.25f}) {
      for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{32768}, int64_t{131071}}) {
        for (int64_t rot : {int64_t{64}, int64_t{128}, int64_t{20}}) {
          std::vector<float> cs(rot);
          rope_cos_sin(pos, rot, base, fs, cs.data());
          for (int64_t i = 0; i < rot / 2; ++i) {
            const double th = double(pos) * double(fs) * std::pow(double(base), -2.0 * double(i) / double(rot));
            ASSERT_NEAR(cs[2 * i], std::cos(th), 1.2e-7) << "pos " << pos << " i " << i;
            ASSERT_NEAR(cs[2 * i + 1], std::sin(th), 1.2e-7) << "pos " << pos << " i " << i;
          }
        }
      }
    }
  }
}

// Llama 3.1+ frequency factors divide each frequency's angle.
TEST(OpsTest, RopeCosSinDividesByFrequencyFactors) {
  const int64_t rot = 64;
  std::vector<float> factors(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i) factors[i] = 1.0f + 31.0f * static_cast<float>(i) / (rot / 2 - 1);
  for (int64_t pos : {int64_t{0}, int64_t{7}, int64_t{8191}, int64_t{100000}}) {
    std::vector<float> cs(rot), plain(rot);
    rope_cos_sin(pos, rot, 500000.0f, 1.0f, cs.data(), factors.data());
    rope_cos_sin(pos, rot, 500000.0f, 1.0f, plain.data());
    for (int64_t i = 0; i < rot / 2; ++i) {
      const double th = double(pos) * std::pow(500000.0, -2.0 * double(i) / double(rot)) / factors[i];
      ASSERT_NEAR(cs[2 * i], std::cos(th), 1.2e-7) << "pos " << pos << " i " << i;
      ASSERT_NEAR(cs[2 * i + 1], std::sin(th), 1.2e-7) << "pos " << pos << " i " << i;
      if (i == 0) {  // factor 1: the plain angle
        ASSERT_EQ(cs[0], plain[0]);
        ASSERT_EQ(cs[1], plain[1]);
      }
    }
  }
}

// Rotates with the direct double formula.
std::vector<float> rope_ref(const std::vector<float>& x, int64_t n_heads, int64_t hd, int64_t rot, int64_t pos,
                            double base, RopeStyle style) {
  std::vector<float> y = x;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < rot / 2; ++i) {
      const double th = double(pos) * std::pow(base, -2.0 * double(i) / double(rot));
      const int64_t a = h * hd + (style == RopeStyle::kNorm ? 2 * i : i);
      const int64_t b = h * hd + (style == RopeStyle::kNorm ? 2 * i + 1 : i + rot / 2);
      const double x0 = x[a], x1 = x[b];
      y[a] = static_cast<float>(x0 * std::cos(th) - x1 * std::sin(th));
      y[b] = static_cast<float>(x0 * std::sin(th) + x1 * std::cos(th));
    }
  return y;
}

TEST(OpsTest, RopeMatchesDoubleFormulaAndScalar) {
  struct Shape {
    int64_t hd, rot;
  };
  const Shape shapes[] = {{64, 64}, {128, 128}, {128, 64}, {64, 32}, {80, 80}, {80, 24}, {20, 20}, {6, 4}, {2, 2}};
  for (Isa isa : supported_isas()) {
    for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
      for (const Shape& s : shapes) {
        for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{4095}, int64_t{131071}}) {
          const int64_t n_heads = 3;
          const auto x = random_vec(n_heads * s.hd, -2, 2, static_cast<uint32_t>(s.hd * 131 + s.rot + pos));
          std::vector<float> cs(s.rot);
          rope_cos_sin(pos, s.rot, 10000.0f, 1.0f, cs.data());
          std::vector<float> y = x, ys = x;
          ops_kernels(isa).rope(y.data(), n_heads, s.hd, s.rot, cs.data(), style);
          ops_kernels(Isa::kScalar).rope(ys.data(), n_heads, s.hd, s.rot, cs.data(), style);
          const std::string what = std::string(isa_name(isa)) + (style == RopeStyle::kNorm ? " norm" : " neox") +
                                   " hd=" + std::to_string(s.hd) + " rot=" + std::to_string(s.rot) +
                                   " pos=" + std::to_string(pos);
          expect_close(y, rope_ref(x, n_heads, s.hd, s.rot, pos, 10000.0, style), 0, 1e-6, what);
          expect_close(y, ys, 0, 5e-7, what + " vs scalar");
          for (int64_t h = 0; h < n_heads; ++h)
            for (int64_t i = s.rot; i < s.hd; ++i) ASSERT_EQ(y[h * s.hd + i], x[h * s.hd + i]) << what << " tail";
        }
      }
    }
  }
}

TEST(OpsTest, RopeStylesPairDifferentElements) {
  // Position 1, one pair rotated by a quarter turn makes the pairing visible.
  const int64_t hd = 8;
  std::vector<float> cs = {0.0f, 1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f};  // only pair 0 rotates by 90 deg
  for (Isa isa : supported_isas()) {
    std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = a;
    ops_kernels(isa).rope(a.data(), 1, hd, hd, cs.data(), RopeStyle::kNorm);
    ops_kernels(isa).rope(b.data(), 1, hd, hd, cs.data(), RopeStyle::kNeox);
    EXPECT_EQ(a, (std::vector<float>{-2, 1, 3, 4, 5, 6, 7, 8})) << isa_name(isa);
    EXPECT_EQ(b, (std::vector<float>{-5, 2, 3, 4, 1, 6, 7, 8})) << isa_name(isa);
  }
}

}  // namespace
}  // namespace ebb
