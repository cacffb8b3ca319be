// Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS and the Q8_1 activations:
// hand-built blocks decode to the values the GGUF layout defines; every
// target's kernels against the scalar reference (the x86 ones bit for bit
// against the ref-engine target, whose order they share); matmul() against a
// double-precision product on every target.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/quantize.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

const DType kNew[] = {DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K,
                      DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS};

const FormatKernels& fk_of(Isa isa, DType t) { return *kernel_set(isa).format(t); }

std::vector<float> dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(n);
  fk_of(Isa::kScalar, t).to_float(src, out.data(), n);
  return out;
}

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void put16(void* p, float f) {
  const uint16_t h = fp32_to_fp16(f);
  std::memcpy(p, &h, 2);
}

// ---- layouts, decoded by hand from the GGUF definitions --------------------------------

TEST(LowbitLayout, Q4_1) {
  BlockQ4_1 b{};
  put16(&b.d, 0.5f);
  put16(&b.m, -2.f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::kQ4_1, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 2.f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j) - 2.f) << j;
  }
}

// Element e's high bit is bit e of qh read as a little-endian word.
TEST(LowbitLayout, Q5_0AndQ5_1HighBits) {
  const uint32_t qh = 0x8421F0A5u;
  BlockQ5_0 b0{};
  BlockQ5_1 b1{};
  put16(&b0.d, 0.25f);
  put16(&b1.d, 0.25f);
  put16(&b1.m, 1.f);
  std::memcpy(b0.qh, &qh, 4);
  std::memcpy(b1.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b0.qs[j] = b1.qs[j] = static_cast<uint8_t>(((j * 5) & 15) | (((j * 3 + 1) & 15) << 4));
  const auto y0 = dequant(DType::kQ5_0, &b0, 32);
  const auto y1 = dequant(DType::kQ5_1, &b1, 32);
  for (int e = 0; e < 32; ++e) {
    const int lo = e < 16 ? (e * 5) & 15 : ((e - 16) * 3 + 1) & 15;
    const int q = lo | static_cast<int>((qh >> e) & 1) << 4;
    EXPECT_EQ(y0[e], 0.25f * (q - 16)) << e;
    EXPECT_EQ(y1[e], 0.25f * q + 1.f) << e;
  }
}

TEST(LowbitLayout, IQ4_NLCodebook) {
  const int book[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  BlockIQ4_NL b{};
  put16(&b.d, 0.125f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (((j + 7) & 15) << 4));
  const auto y = dequant(DType::kIQ4_NL, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.125f * book[j]) << j;
    EXPECT_EQ(y[j + 16], 0.125f * book[(j + 7) & 15]) << j;
  }
}

// Sub-block j's scale: low 4 bits from nibble j % 2 of scales_l[j / 2], high
// 2 from bits 2j of scales_h; minus 32.
TEST(LowbitLayout, IQ4_XSScales) {
  const int book[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  BlockIQ4_XS b{};
  put16(&b.d, 0.5f);
  const int ls[8] = {0, 63, 32, 31, 17, 48, 5, 40};
  for (int j = 0; j < 8; ++j) {
    b.scales_l[j / 2] |= static_cast<uint8_t>((ls[j] & 15) << (4 * (j % 2)));
    b.scales_h |= static_cast<uint16_t>((ls[j] >> 4) << (2 * j));
  }
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>(i * 37 + 5);
  const auto y = dequant(DType::kIQ4_XS, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    const uint8_t byte = static_cast<uint8_t>((16 * j + l % 16) * 37 + 5);
    const int idx = l < 16 ? byte & 15 : byte >> 4;
    EXPECT_EQ(y[e], 0.5f * (ls[j] - 32) * book[idx]) << e;
  }
}

// Element 128h + 32s + l: bits 2s of qs[32h + l], sub-block (e / 16) with
// scale (low nibble) and min (high nibble).
TEST(LowbitLayout, Q2_KPlanesScalesMins) {
  BlockQ2_K b{};
  put16(&b.d, 0.5f);
  put16(&b.dmin, 0.25f);
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>(((g * 7 + 1) & 15) | (((g * 5 + 3) & 15) << 4));
  for (int i = 0; i < 64; ++i) b.qs[i] = static_cast<uint8_t>(i * 29 + 11);
  const auto y = dequant(DType::kQ2_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32, g = e / 16;
    const int q = (static_cast<uint8_t>((32 * h + l) * 29 + 11) >> (2 * s)) & 3;
    EXPECT_EQ(y[e], 0.5f * ((g * 7 + 1) & 15) * q - 0.25f * ((g * 5 + 3) & 15)) << e;
  }
}

// Scale g: low 4 bits from byte g (g < 8) or the high nibble of byte g - 8,
// high 2 bits from bits 2 (g / 4) of byte 8 + g % 4; value (low 2 bits) - 4
// unless bit 4h + s of hmask[l] is set.
TEST(LowbitLayout, Q3_KScalesAndHighBits) {
  BlockQ3_K b{};
  put16(&b.d, 0.25f);
  int sc[16];
  for (int g = 0; g < 16; ++g) {
    sc[g] = (g * 11 + 7) & 63;
    if (g < 8) {
      b.scales[g] |= static_cast<uint8_t>(sc[g] & 15);
    } else {
      b.scales[g - 8] |= static_cast<uint8_t>((sc[g] & 15) << 4);
    }
    b.scales[8 + g % 4] |= static_cast<uint8_t>((sc[g] >> 4) << (2 * (g / 4)));
  }
  for (int i = 0; i < 64; ++i) b.qs[i] = static_cast<uint8_t>(i * 53 + 9);
  for (int i = 0; i < 32; ++i) b.hmask[i] = static_cast<uint8_t>(i * 71 + 3);
  const auto y = dequant(DType::kQ3_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const int lo = (static_cast<uint8_t>((32 * h + l) * 53 + 9) >> (2 * s)) & 3;
    const int hi = (static_cast<uint8_t>(l * 71 + 3) >> (4 * h + s)) & 1;
    EXPECT_EQ(y[e], 0.25f * (sc[e / 16] - 32) * (lo - (hi ? 0 : 4))) << e;
  }
}

// Q8_1: Q8_0's bytes and scale, and s = fp16(unrounded d * sum of the bytes).
TEST(LowbitLayout, Q8_1CarriesTheBlockSum) {
  const int64_t n = 256;
  const auto x = normal(n, 3, 2.f);
  std::vector<BlockQ8_1> a(n / 32);
  std::vector<BlockQ8_0> q(n / 32);
  fk_of(Isa::kScalar, DType::kQ8_1).quantize_act(x.data(), a.data(), n);
  fk_of(Isa::kScalar, DType::kQ8_0).quantize_act(x.data(), q.data(), n);
  for (int64_t i = 0; i < n / 32; ++i) {
    EXPECT_EQ(a[i].d, q[i].d);
    EXPECT_EQ(0, std::memcmp(a[i].qs, q[i].qs, 32));
    float amax = 0.f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      amax = std::fmax(amax, std::fabs(x[32 * i + j]));
      sum += a[i].qs[j];
    }
    EXPECT_EQ(a[i].s, fp32_to_fp16(amax / 127.f * static_cast<float>(sum))) << i;
  }
}

// ---- kernels on every target ----------------------------------------------------------

// Random valid blocks: random bytes, the scale fields made modest.
std::vector<uint8_t> random_blocks(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(-0.05f, 0.05f);
  std::vector<uint8_t> v(row_bytes(t, n));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  const TypeInfo& ti = type_info(t);
  for (int64_t i = 0; i < n / ti.block_size; ++i) {
    uint8_t* o = v.data() + i * ti.block_bytes;
    switch (t) {
      case DType::kQ4_1:
      case DType::kQ5_1: put16(o, ud(rng)), put16(o + 2, ud(rng)); break;
      case DType::kQ5_0:
      case DType::kIQ4_NL:
      case DType::kIQ4_XS: put16(o, ud(rng)); break;
      case DType::kQ2_K: put16(o + 80, ud(rng)), put16(o + 82, ud(rng)); break;
      case DType::kQ3_K: put16(o + 108, ud(rng)); break;
      default: ADD_FAILURE() << "no generator for " << dtype_name(t);
    }
  }
  return v;
}

class LowbitKernels : public ::testing::TestWithParam<std::tuple<Isa, DType>> {};

// to_float and quantize_act: bit for bit the scalar's on every target.
TEST_P(LowbitKernels, ConversionsMatchScalarExactly) {
  const auto [isa, t] = GetParam();
  const FormatKernels& fk = fk_of(isa, t);
  const FormatKernels& ref = fk_of(Isa::kScalar, t);
  ASSERT_EQ(fk.weight, t);
  ASSERT_EQ(fk.act, ref.act);
  const int64_t n = 7 * type_info(t).block_size;
  const auto w = random_blocks(t, n, 11);
  std::vector<float> a(n), b(n);
  fk.to_float(w.data(), a.data(), n);
  ref.to_float(w.data(), b.data(), n);
  EXPECT_EQ(a, b);
  const int64_t na = 4 * 256;
  const auto x = normal(na, 12, 3.f);
  std::vector<uint8_t> qa(row_bytes(ref.act, na)), qb(row_bytes(ref.act, na));
  fk.quantize_act(x.data(), qa.data(), na);
  ref.quantize_act(x.data(), qb.data(), na);
  EXPECT_EQ(qa, qb);
}

// vec_dot and tile_dot within float rounding of the scalar reference; on
// x86 bit for bit the ref-engine target's (the same lanes, the same order).
TEST_P(LowbitKernels, DotsMatchScalar) {
  const auto [isa, t] = GetParam();
  const FormatKernels& fk = fk_of(isa, t);
  const FormatKernels& ref = fk_of(Isa::kScalar, t);
  const FormatKernels& eng = fk_of(Isa::kRefEngine, t);
  for (int64_t blocks : {1, 2, 3, 5, 8, 13}) {
    const int64_t n = blocks * type_info(t).block_size;
    if (n % type_info(ref.act).block_size) continue;
    for (uint32_t seed = 0; seed < 4; ++seed) {
      const auto w = random_blocks(t, n, 100 + seed);
      const auto x = normal(n, 200 + seed, 2.f);
      std::vector<uint8_t> act(row_bytes(ref.act, n));
      ref.quantize_act(x.data(), act.data(), n);
      // Tolerance: float rounding of the block terms.
      const auto wf = dequant(t, w.data(), n);
      std::vector<float> af(n);
      fk_of(Isa::kScalar, ref.act).to_float(act.data(), af.data(), n);
      double abs_sum = 0;
      for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(double(wf[i]) * af[i]);
      // Q4_1 / Q5_1: the offsets' part comes from fp16 s, which scalar and
      // SIMD share exactly, so the same bound holds.
      const double tol = 1e-5 * abs_sum + 1e-6;
      float want = 0.f, got = 0.f, tile = 0.f;
      ref.vec_dot(n, w.data(), act.data(), &want);
      fk.vec_dot(n, w.data(), act.data(), &got);
      (fk.tile_dot ? fk.tile_dot : fk.vec_dot)(n, w.data(), act.data(), &tile);
      EXPECT_NEAR(got, want, tol) << "vec_dot n=" << n;
      EXPECT_NEAR(tile, want, tol) << "tile_dot n=" << n;
      if (isa == Isa::kAvx2 || isa == Isa::kAvx512 || isa == Isa::kRefEngine) {
        float e1 = 0.f, e2 = 0.f;
        eng.vec_dot(n, w.data(), act.data(), &e1);
        (eng.tile_dot ? eng.tile_dot : eng.vec_dot)(n, w.data(), act.data(), &e2);
        EXPECT_EQ(got, e1) << "vec_dot not the ref-engine's bits, n=" << n;
        EXPECT_EQ(tile, e2) << "tile_dot not the ref-engine's bits, n=" << n;
      }
    }
  }
}

std::string param_name(const testing::TestParamInfo<std::tuple<Isa, DType>>& p) {
  std::string s = std::string(isa_name(std::get<0>(p.param))) + "_" + std::string(dtype_name(std::get<1>(p.param)));
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(All, LowbitKernels,
                         ::testing::Combine(::testing::ValuesIn(supported_isas()), ::testing::ValuesIn(kNew)),
                         param_name);

// ---- matmul() ---------------------------------------------------------------------------

ThreadPool& pool() {
  static ThreadPool* p = [] {
    auto* tp = new ThreadPool(ThreadPoolOptions{2, 1000});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // see test_matmul.cpp's test_pool
    return tp;
  }();
  return *p;
}

// One token and a batch through matmul() (activation scratch, the batch's
// blocks of rows) against a double product of the dequantized weights and
// the float activations: within the 8-bit activation rounding; and the batch
// gives each token what a one-token product gives, within float rounding.
TEST(LowbitMatmul, MatchesDoubleReferenceOnEveryTarget) {
  for (DType t : kNew) {
    const int64_t cols = 512, rows = 37, n_tok = 6;
    std::vector<uint8_t> wq(row_bytes(t, cols) * rows);
    const auto wf = normal(cols * rows, 5, 0.05f);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(t, wf.data() + r * cols, wq.data() + r * row_bytes(t, cols), cols);
    const auto wd = dequant(t, wq.data(), cols * rows);
    const auto x = normal(cols * n_tok, 6);
    WeightView w;
    w.type = t;
    w.cols = cols;
    w.rows = rows;
    w.data = wq.data();
    w.row_stride = row_bytes(t, cols);
    for (Isa isa : supported_isas()) {
      const KernelSet& ks = kernel_set(isa);
      std::vector<uint8_t> scratch(matmul_scratch_bytes(t, cols, n_tok) + 64);
      void* sp = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
      std::vector<float> y(rows * n_tok), y1(rows);
      matmul(ks, {&w, x.data(), cols, n_tok, y.data(), rows, sp}, pool());
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        matmul(ks, {&w, x.data() + tk * cols, cols, 1, y1.data(), rows, sp}, pool());
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0, abs_s = 0;
          for (int64_t c = 0; c < cols; ++c) {
            s += double(wd[r * cols + c]) * x[tk * cols + c];
            abs_s += std::fabs(double(wd[r * cols + c]) * x[tk * cols + c]);
          }
          // 8-bit activations: each off by at most half a step of 1/127 of its block's max.
          EXPECT_NEAR(y[tk * rows + r], s, 0.02 * abs_s) << isa_name(isa) << " " << dtype_name(t) << " r=" << r;
          EXPECT_NEAR(y1[r], y[tk * rows + r], 1e-5 * abs_s + 1e-6)
              << isa_name(isa) << " " << dtype_name(t) << " one token against the batch, r=" << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ebb
