// LoRA products (kernels/lora.h): every supported target against the scalar
// reference, within a tolerance relative to the sum of the magnitudes of the
// terms (random data) and bit for bit (small integers, where every sum is
// exact); the scalar reference against a double-precision product. Padding
// of strided rows holds NaN (never read) or sentinels (never written), and
// columns outside [c0, c1) must stay as they were. The F16-weight variants:
// against the scalar F16 reference, and bit for bit against the same
// target's F32 variant on the same (F16-exact) values, since widening F16 is
// exact and the arithmetic is meant to be the same.
#include <gtest/gtest.h>

#include <cmath>
#include <cctype>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/lora.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

const int64_t kRanks[] = {1, 4, 5, 8, 16, 64};  // 5: a block of four rows and one left over
const int64_t kWidths[] = {1, 7, 33, 260, 896, 1000};
const int64_t kRows[] = {1, 5, 9};
const int64_t kPads[] = {0, 3};  // stride - width
const float kScales[] = {0.5f, -0.7f};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kSentinel = 12345.0f;

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

// Nonzero integers in [-m, m], so a dropped or doubled term always shows.
std::vector<float> small_ints(size_t n, int m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(1, m);
  std::vector<float> v(n);
  for (auto& e : v) e = static_cast<float>(rng() & 1 ? d(rng) : -d(rng));
  return v;
}

// Rows of `width` values out of v, at `stride`, the rest of each row `pad`.
std::vector<float> strided(const std::vector<float>& v, int64_t n, int64_t width, int64_t stride, float pad) {
  std::vector<float> out(n * stride, pad);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < width; ++k) out[i * stride + k] = v[i * width + k];
  return out;
}

// v rounded to F16: the bits, and v replaced by the values they hold.
std::vector<uint16_t> to_half(std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    h[i] = fp32_to_fp16(v[i]);
    v[i] = fp16_to_fp32(h[i]);
  }
  return h;
}

// One shape of the down product.
struct DownShape {
  int64_t r, n_in, n, x_stride;
  std::string str() const {
    return "r=" + std::to_string(r) + " n_in=" + std::to_string(n_in) + " n=" + std::to_string(n) +
           " x_stride=" + std::to_string(x_stride);
  }
};
std::vector<DownShape> down_shapes() {
  std::vector<DownShape> v;
  for (int64_t r : kRanks)
    for (int64_t n_in : kWidths)
      for (int64_t n : kRows)
        for (int64_t pad : kPads) v.push_back({r, n_in, n, n_in + pad});
  return v;
}

// One shape of the up product, with its column range.
struct UpShape {
  int64_t r, n_out, n, y_stride, c0, c1;
  float s;
  std::string str() const {
    return "r=" + std::to_string(r) + " n_out=" + std::to_string(n_out) + " n=" + std::to_string(n) +
           " y_stride=" + std::to_string(y_stride) + " c=[" + std::to_string(c0) + "," + std::to_string(c1) +
           ") s=" + std::to_string(s);
  }
};
std::vector<UpShape> up_shapes() {
  std::vector<UpShape> v;
  for (int64_t r : kRanks)
    for (int64_t n_out : kWidths)
      for (int64_t n : kRows)
        for (int64_t pad : kPads)
          for (float s : kScales) {
            v.push_back({r, n_out, n, n_out + pad, 0, n_out, s});
            // Unaligned bounds on both sides, and an empty range.
            const int64_t c0 = n_out / 3 | 1, c1 = n_out - n_out / 4 - (n_out > 4 ? 1 : 0);
            if (c0 < c1) v.push_back({r, n_out, n, n_out + pad, c0, c1, s});
            v.push_back({r, n_out, n, n_out + pad, n_out / 2, n_out / 2, s});
          }
  return v;
}

// The inputs of one up product: bt [r, n_out], t [n, r], y [n, y_stride]
// (padding and columns outside the range are sentinels as well as values).
struct UpData {
  std::vector<float> bt, t, y;
};
UpData up_data(const UpShape& sh, bool ints, uint32_t seed) {
  UpData d;
  d.bt = ints ? small_ints(sh.r * sh.n_out, 4, seed) : uniform(sh.r * sh.n_out, -1, 1, seed);
  d.t = ints ? small_ints(sh.n * sh.r, 8, seed + 1) : uniform(sh.n * sh.r, -1, 1, seed + 1);
  const auto y = ints ? small_ints(sh.n * sh.n_out, 16, seed + 2) : uniform(sh.n * sh.n_out, -1, 1, seed + 2);
  d.y = strided(y, sh.n, sh.n_out, sh.y_stride, kSentinel);
  return d;
}

void run_down(Isa isa, const DownShape& sh, const std::vector<float>& a, const std::vector<float>& x,
              std::vector<float>& t) {
  t.assign(sh.n * sh.r, kNaN);
  lora_kernels(isa).down(a.data(), x.data(), sh.x_stride, sh.n, sh.r, sh.n_in, t.data());
}

void run_up(Isa isa, const UpShape& sh, const UpData& d, std::vector<float>& y) {
  y = d.y;
  lora_kernels(isa).up(d.bt.data(), d.t.data(), sh.s, sh.n, sh.r, sh.n_out, sh.c0, sh.c1, y.data(), sh.y_stride);
}

void run_down_f16(Isa isa, const DownShape& sh, const std::vector<uint16_t>& a, const std::vector<float>& x,
                  std::vector<float>& t) {
  t.assign(sh.n * sh.r, kNaN);
  lora_kernels(isa).down_f16(a.data(), x.data(), sh.x_stride, sh.n, sh.r, sh.n_in, t.data());
}

void run_up_f16(Isa isa, const UpShape& sh, const std::vector<uint16_t>& bt, const UpData& d, std::vector<float>& y) {
  y = d.y;
  lora_kernels(isa).up_f16(bt.data(), d.t.data(), sh.s, sh.n, sh.r, sh.n_out, sh.c0, sh.c1, y.data(), sh.y_stride);
}

// Σ_k |a[j, k] · x[i, k]|: the scale of the rounding errors of t[i, j].
double down_magnitude(const DownShape& sh, const std::vector<float>& a, const std::vector<float>& x, int64_t i,
                      int64_t j) {
  double m = 0;
  for (int64_t k = 0; k < sh.n_in; ++k) m += std::fabs(double(a[j * sh.n_in + k]) * x[i * sh.x_stride + k]);
  return m;
}

// |y0| + |s| Σ_j |t[i, j] · bt[j, c]|: the scale of the rounding errors of y[i, c].
double up_magnitude(const UpShape& sh, const UpData& d, int64_t i, int64_t c) {
  double m = 0;
  for (int64_t j = 0; j < sh.r; ++j) m += std::fabs(double(d.t[i * sh.r + j]) * d.bt[j * sh.n_out + c]);
  return std::fabs(d.y[i * sh.y_stride + c]) + std::fabs(sh.s) * m;
}

// Outside [c0, c1) (padding included) y must hold the bits it had.
void expect_outside_untouched(const UpShape& sh, const UpData& d, const std::vector<float>& y, const std::string& what) {
  for (int64_t i = 0; i < sh.n; ++i)
    for (int64_t c = 0; c < sh.y_stride; ++c) {
      if (c >= sh.c0 && c < sh.c1) continue;
      const size_t e = i * sh.y_stride + c;
      ASSERT_EQ(std::memcmp(&y[e], &d.y[e], sizeof(float)), 0) << what << " wrote row " << i << " column " << c;
    }
}

std::string param_name(const ::testing::TestParamInfo<Isa>& info) {
  std::string s(isa_name(info.param));
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

class LoraKernelsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    isa_ = GetParam();
    if (!isa_supported(isa_)) GTEST_SKIP() << isa_name(isa_) << " not supported on this machine";
  }
  std::string tag(const std::string& shape) const { return std::string(isa_name(isa_)) + " " + shape; }
  Isa isa_ = Isa::kScalar;
};

TEST_P(LoraKernelsTest, TableIsComplete) {
  const LoraKernels& k = lora_kernels(isa_);
  EXPECT_TRUE(k.down && k.up && k.down_f16 && k.up_f16);
}

TEST_P(LoraKernelsTest, F16DownMatchesScalarAndF32) {
  uint32_t seed = 600;
  for (const DownShape& sh : down_shapes()) {
    auto a = uniform(sh.r * sh.n_in, -1, 1, ++seed);
    const std::vector<uint16_t> ah = to_half(a);
    const auto x = strided(uniform(sh.n * sh.n_in, -2, 2, ++seed), sh.n, sh.n_in, sh.x_stride, kNaN);
    std::vector<float> ref, t, t32;
    run_down_f16(Isa::kScalar, sh, ah, x, ref);
    run_down_f16(isa_, sh, ah, x, t);
    run_down(isa_, sh, a, x, t32);
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t j = 0; j < sh.r; ++j) {
        const size_t e = i * sh.r + j;
        ASSERT_LE(std::fabs(double(t[e]) - ref[e]), 1e-5 * down_magnitude(sh, a, x, i, j) + 1e-30)
            << tag(sh.str()) << " at t[" << i << "," << j << "]: " << t[e] << " vs " << ref[e];
        ASSERT_EQ(std::memcmp(&t[e], &t32[e], sizeof(float)), 0)
            << tag(sh.str()) << " F16 vs F32 at t[" << i << "," << j << "]: " << t[e] << " vs " << t32[e];
      }
  }
}

TEST_P(LoraKernelsTest, F16UpMatchesScalarAndF32) {
  uint32_t seed = 700;
  for (const UpShape& sh : up_shapes()) {
    UpData d = up_data(sh, false, seed += 3);
    const std::vector<uint16_t> bth = to_half(d.bt);
    std::vector<float> ref, y, y32;
    run_up_f16(Isa::kScalar, sh, bth, d, ref);
    run_up_f16(isa_, sh, bth, d, y);
    run_up(isa_, sh, d, y32);
    expect_outside_untouched(sh, d, y, tag(sh.str()));
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t c = sh.c0; c < sh.c1; ++c) {
        const size_t e = i * sh.y_stride + c;
        ASSERT_LE(std::fabs(double(y[e]) - ref[e]), 1e-5 * up_magnitude(sh, d, i, c) + 1e-30)
            << tag(sh.str()) << " at y[" << i << "," << c << "]: " << y[e] << " vs " << ref[e];
        ASSERT_EQ(std::memcmp(&y[e], &y32[e], sizeof(float)), 0)
            << tag(sh.str()) << " F16 vs F32 at y[" << i << "," << c << "]: " << y[e] << " vs " << y32[e];
      }
  }
}

// Small integers are exact in F16 too: every target's F16 variant gives the
// integer sums.
TEST_P(LoraKernelsTest, F16ExactIntegersBitForBit) {
  uint32_t seed = 800;
  for (const DownShape& sh : down_shapes()) {
    auto a = small_ints(sh.r * sh.n_in, 4, ++seed);
    const std::vector<uint16_t> ah = to_half(a);
    const auto x = strided(small_ints(sh.n * sh.n_in, 4, ++seed), sh.n, sh.n_in, sh.x_stride, kNaN);
    std::vector<float> t;
    run_down_f16(isa_, sh, ah, x, t);
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t j = 0; j < sh.r; ++j) {
        int64_t exact = 0;
        for (int64_t k = 0; k < sh.n_in; ++k)
          exact += static_cast<int64_t>(a[j * sh.n_in + k]) * static_cast<int64_t>(x[i * sh.x_stride + k]);
        ASSERT_EQ(t[i * sh.r + j], static_cast<float>(exact)) << tag(sh.str()) << " at t[" << i << "," << j << "]";
      }
  }
  for (UpShape sh : up_shapes()) {
    if (sh.s != kScales[0]) continue;  // 0.5
    UpData d = up_data(sh, true, seed += 3);
    const std::vector<uint16_t> bth = to_half(d.bt);
    std::vector<float> y;
    run_up_f16(isa_, sh, bth, d, y);
    expect_outside_untouched(sh, d, y, tag(sh.str()));
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t c = sh.c0; c < sh.c1; ++c) {
        const size_t e = i * sh.y_stride + c;
        int64_t exact = 0;
        for (int64_t j = 0; j < sh.r; ++j)
          exact += static_cast<int64_t>(d.t[i * sh.r + j]) * static_cast<int64_t>(d.bt[j * sh.n_out + c]);
        ASSERT_EQ(y[e], d.y[e] + 0.5f * static_cast<float>(exact)) << tag(sh.str()) << " at y[" << i << "," << c << "]";
      }
  }
}

TEST_P(LoraKernelsTest, DownMatchesScalar) {
  uint32_t seed = 100;
  for (const DownShape& sh : down_shapes()) {
    const auto a = uniform(sh.r * sh.n_in, -1, 1, ++seed);
    const auto x = strided(uniform(sh.n * sh.n_in, -2, 2, ++seed), sh.n, sh.n_in, sh.x_stride, kNaN);
    std::vector<float> ref, t;
    run_down(Isa::kScalar, sh, a, x, ref);
    run_down(isa_, sh, a, x, t);
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t j = 0; j < sh.r; ++j) {
        const size_t e = i * sh.r + j;
        ASSERT_LE(std::fabs(double(t[e]) - ref[e]), 1e-5 * down_magnitude(sh, a, x, i, j) + 1e-30)
            << tag(sh.str()) << " at t[" << i << "," << j << "]: " << t[e] << " vs " << ref[e];
      }
  }
}

TEST_P(LoraKernelsTest, UpMatchesScalar) {
  uint32_t seed = 200;
  for (const UpShape& sh : up_shapes()) {
    const UpData d = up_data(sh, false, seed += 3);
    std::vector<float> ref, y;
    run_up(Isa::kScalar, sh, d, ref);
    run_up(isa_, sh, d, y);
    expect_outside_untouched(sh, d, y, tag(sh.str()));
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t c = sh.c0; c < sh.c1; ++c) {
        const size_t e = i * sh.y_stride + c;
        ASSERT_LE(std::fabs(double(y[e]) - ref[e]), 1e-5 * up_magnitude(sh, d, i, c) + 1e-30)
            << tag(sh.str()) << " at y[" << i << "," << c << "]: " << y[e] << " vs " << ref[e];
      }
  }
}

// Targets may group rows (prefill shares B's loads between rows): a row's
// result is the same bits whether it runs with the others or alone.
TEST_P(LoraKernelsTest, UpRowsDoNotDependOnTheirGrouping) {
  uint32_t seed = 900;
  for (const UpShape& sh : up_shapes()) {
    if (sh.n < 2) continue;
    UpData d = up_data(sh, false, seed += 3);
    const std::vector<uint16_t> bth = to_half(d.bt);
    std::vector<float> all = d.y, alone = d.y, all16 = d.y, alone16 = d.y;
    const LoraKernels& k = lora_kernels(isa_);
    k.up(d.bt.data(), d.t.data(), sh.s, sh.n, sh.r, sh.n_out, sh.c0, sh.c1, all.data(), sh.y_stride);
    k.up_f16(bth.data(), d.t.data(), sh.s, sh.n, sh.r, sh.n_out, sh.c0, sh.c1, all16.data(), sh.y_stride);
    for (int64_t i = 0; i < sh.n; ++i) {
      k.up(d.bt.data(), d.t.data() + i * sh.r, sh.s, 1, sh.r, sh.n_out, sh.c0, sh.c1, alone.data() + i * sh.y_stride,
           sh.y_stride);
      k.up_f16(bth.data(), d.t.data() + i * sh.r, sh.s, 1, sh.r, sh.n_out, sh.c0, sh.c1,
               alone16.data() + i * sh.y_stride, sh.y_stride);
    }
    ASSERT_EQ(std::memcmp(all.data(), alone.data(), all.size() * sizeof(float)), 0) << tag(sh.str());
    ASSERT_EQ(std::memcmp(all16.data(), alone16.data(), all16.size() * sizeof(float)), 0) << tag(sh.str()) << " F16";
  }
}

// Integers small enough that every product and partial sum is exact in
// float, and s = 0.5: any order of summation, fused or not, gives the same
// bits, so every target must equal the scalar result (and the integer sum).
TEST_P(LoraKernelsTest, ExactIntegersBitForBit) {
  uint32_t seed = 300;
  for (const DownShape& sh : down_shapes()) {
    const auto a = small_ints(sh.r * sh.n_in, 4, ++seed);
    const auto x = strided(small_ints(sh.n * sh.n_in, 4, ++seed), sh.n, sh.n_in, sh.x_stride, kNaN);
    std::vector<float> ref, t;
    run_down(Isa::kScalar, sh, a, x, ref);
    run_down(isa_, sh, a, x, t);
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t j = 0; j < sh.r; ++j) {
        int64_t exact = 0;
        for (int64_t k = 0; k < sh.n_in; ++k)
          exact += static_cast<int64_t>(a[j * sh.n_in + k]) * static_cast<int64_t>(x[i * sh.x_stride + k]);
        ASSERT_EQ(ref[i * sh.r + j], static_cast<float>(exact)) << "scalar " << sh.str();
        ASSERT_EQ(std::memcmp(&t[i * sh.r + j], &ref[i * sh.r + j], sizeof(float)), 0)
            << tag(sh.str()) << " at t[" << i << "," << j << "]: " << t[i * sh.r + j] << " vs " << ref[i * sh.r + j];
      }
  }
  for (UpShape sh : up_shapes()) {
    if (sh.s != kScales[0]) continue;  // 0.5
    const UpData d = up_data(sh, true, seed += 3);
    std::vector<float> ref, y;
    run_up(Isa::kScalar, sh, d, ref);
    run_up(isa_, sh, d, y);
    expect_outside_untouched(sh, d, y, tag(sh.str()));
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t c = sh.c0; c < sh.c1; ++c) {
        const size_t e = i * sh.y_stride + c;
        int64_t exact = 0;
        for (int64_t j = 0; j < sh.r; ++j)
          exact += static_cast<int64_t>(d.t[i * sh.r + j]) * static_cast<int64_t>(d.bt[j * sh.n_out + c]);
        ASSERT_EQ(ref[e], d.y[e] + 0.5f * static_cast<float>(exact)) << "scalar " << sh.str();
        ASSERT_EQ(std::memcmp(&y[e], &ref[e], sizeof(float)), 0)
            << tag(sh.str()) << " at y[" << i << "," << c << "]: " << y[e] << " vs " << ref[e];
      }
  }
}

INSTANTIATE_TEST_SUITE_P(All, LoraKernelsTest, ::testing::ValuesIn(supported_isas()), param_name);

// ---- the scalar reference against double precision -----------------------------------

TEST(LoraScalarTest, DownMatchesDouble) {
  uint32_t seed = 400;
  for (const DownShape& sh : down_shapes()) {
    const auto a = uniform(sh.r * sh.n_in, -1, 1, ++seed);
    const auto x = strided(uniform(sh.n * sh.n_in, -2, 2, ++seed), sh.n, sh.n_in, sh.x_stride, kNaN);
    std::vector<float> t;
    run_down(Isa::kScalar, sh, a, x, t);
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t j = 0; j < sh.r; ++j) {
        double want = 0;
        for (int64_t k = 0; k < sh.n_in; ++k) want += double(a[j * sh.n_in + k]) * x[i * sh.x_stride + k];
        ASSERT_LE(std::fabs(t[i * sh.r + j] - want), 2e-6 * down_magnitude(sh, a, x, i, j) + 1e-30)
            << sh.str() << " at t[" << i << "," << j << "]: " << t[i * sh.r + j] << " vs " << want;
      }
  }
}

TEST(LoraScalarTest, UpMatchesDouble) {
  uint32_t seed = 500;
  for (const UpShape& sh : up_shapes()) {
    const UpData d = up_data(sh, false, seed += 3);
    std::vector<float> y;
    run_up(Isa::kScalar, sh, d, y);
    expect_outside_untouched(sh, d, y, "scalar " + sh.str());
    for (int64_t i = 0; i < sh.n; ++i)
      for (int64_t c = sh.c0; c < sh.c1; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < sh.r; ++j) sum += double(d.t[i * sh.r + j]) * d.bt[j * sh.n_out + c];
        const size_t e = i * sh.y_stride + c;
        const double want = d.y[e] + double(sh.s) * sum;
        ASSERT_LE(std::fabs(y[e] - want), 2e-6 * up_magnitude(sh, d, i, c) + 1e-30)
            << sh.str() << " at y[" << i << "," << c << "]: " << y[e] << " vs " << want;
      }
  }
}

}  // namespace
}  // namespace ebb
