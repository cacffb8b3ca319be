// Per-format kernels on every target this machine runs, against the scalar
// reference; matmul() against a double-precision reference (F16 / BF16
// weights: with the activations rounded to F16 / BF16).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/lora.h"
#include "kernels/matmul.h"
#include "kernels/packing.h"
#include "kernels/quant_blocks.h"
#include "kernels/quantize.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

const DType kFormats[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                          DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64 + 64))) {
    std::memset(p, 0xA5, (n + 63) / 64 * 64 + 64);
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  uint8_t* p;
};

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.f, float mean = 0.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Pools shared by all tests. ThreadPool (src/platform/thread_pool.cpp) reads
// the job generation when a worker thread starts, so a run() issued before
// the worker has started is missed and both sides wait forever; give the
// workers time to start once, here, until that is fixed there.
ThreadPool& test_pool(int threads) {
  static ThreadPool* pools[3] = {};
  if (!pools[threads]) {
    pools[threads] = new ThreadPool(ThreadPoolOptions{threads, 1000});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return *pools[threads];
}

const FormatKernels& scalar_fk(DType t) { return *kernel_set(Isa::kScalar).format(t); }

// Random bytes, with the fp16 / float scale fields made finite and modest, so
// every bit pattern of the quantized values and packed scales is exercised.
std::vector<uint8_t> random_blocks(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(-0.05f, 0.05f);
  const uint64_t bytes = row_bytes(t, n);
  std::vector<uint8_t> v(bytes);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  auto put16 = [&](uint64_t off, float f) {
    const uint16_t h = t == DType::kBF16 ? fp32_to_bf16(f) : fp32_to_fp16(f);
    std::memcpy(v.data() + off, &h, 2);
  };
  const TypeInfo& ti = type_info(t);
  const int64_t nb = n / ti.block_size;
  for (int64_t i = 0; i < nb; ++i) {
    const uint64_t o = i * ti.block_bytes;
    switch (t) {
      case DType::kF32: {
        const float f = ud(rng) * 40.f;
        std::memcpy(v.data() + o, &f, 4);
        break;
      }
      case DType::kF16:
      case DType::kBF16: put16(o, ud(rng) * 40.f); break;
      case DType::kQ8_0:
      case DType::kQ4_0: put16(o, ud(rng)); break;
      case DType::kQ4_K:
      case DType::kQ5_K:
        put16(o, ud(rng));
        put16(o + 2, ud(rng));
        break;
      case DType::kQ6_K: put16(o + 208, ud(rng)); break;
      case DType::kQ8_K: {
        const float f = std::fabs(ud(rng));
        std::memcpy(v.data() + o, &f, 4);
        // Keep the activation invariants: values in [-127, 127], bsums consistent.
        auto* b = reinterpret_cast<BlockQ8_K*>(v.data() + o);
        for (auto& q : b->qs)
          if (q == -128) q = -127;
        for (int g = 0; g < 16; ++g) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += b->qs[16 * g + l];
          b->bsums[g] = static_cast<int16_t>(s);
        }
        break;
      }
      default: break;
    }
  }
  return v;
}

std::string isa_fmt_name(Isa isa, DType t) {
  std::string s = std::string(isa_name(isa)) + "_" + std::string(dtype_name(t));
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Element counts: 1, 3 and 7 blocks, and for the float formats sizes that
// leave SIMD tails.
std::vector<int64_t> test_sizes(DType t) {
  const int64_t bs = type_info(t).block_size;
  if (bs == 1) return {1, 7, 31, 33, 96, 257, 1000};
  return {bs, 3 * bs, 7 * bs};
}

// ---- kernels vs the scalar reference ------------------------------------------------

class MatmulKernels : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void SetUp() override {
    isa_ = std::get<0>(GetParam());
    type_ = std::get<1>(GetParam());
    if (!isa_supported(isa_)) GTEST_SKIP() << isa_name(isa_) << " not supported on this machine";
    fk_ = kernel_set(isa_).format(type_);
    ASSERT_NE(fk_, nullptr);
    ref_ = &scalar_fk(type_);
    ASSERT_EQ(fk_->act, ref_->act);
  }
  // Quantizes x into the activation format with the target's quantizer.
  std::vector<uint8_t> act_of(const FormatKernels& fk, const std::vector<float>& x) {
    std::vector<uint8_t> a(row_bytes(fk.act, static_cast<int64_t>(x.size())));
    fk.quantize_act(x.data(), a.data(), static_cast<int64_t>(x.size()));
    return a;
  }
  // The activations a batch's kernels (vec_dot_tile, tile_dot) read.
  static bool has_batch_act(const FormatKernels& fk) { return fk.quantize_batch_act != nullptr; }
  static DType batch_act(const FormatKernels& fk) { return has_batch_act(fk) ? fk.batch_act : fk.act; }
  std::vector<uint8_t> batch_act_of(const FormatKernels& fk, const std::vector<float>& x) {
    if (!has_batch_act(fk)) return act_of(fk, x);
    std::vector<uint8_t> a(row_bytes(fk.batch_act, static_cast<int64_t>(x.size())));
    fk.quantize_batch_act(x.data(), a.data(), static_cast<int64_t>(x.size()));
    return a;
  }
  Isa isa_;
  DType type_;
  const FormatKernels* fk_ = nullptr;
  const FormatKernels* ref_ = nullptr;
};

TEST_P(MatmulKernels, ToFloatMatchesScalarExactly) {
  for (int64_t n : test_sizes(type_)) {
    const auto w = random_blocks(type_, n, 11 + static_cast<uint32_t>(n));
    std::vector<float> got(n), want(n);
    fk_->to_float(w.data(), got.data(), n);
    ref_->to_float(w.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "n=" << n << " i=" << i;
  }
}

TEST_P(MatmulKernels, QuantizeActMatchesScalarExactly) {
  const std::vector<std::vector<float>> cases = [&] {
    std::vector<std::vector<float>> c;
    const int64_t bs = std::max<int64_t>(type_info(ref_->act).block_size, type_info(type_).block_size);
    for (int64_t nb : {1, 3, 7}) {
      c.push_back(normal(bs * nb, 100 + static_cast<uint32_t>(nb)));
      c.push_back(std::vector<float>(bs * nb, 0.f));
      c.push_back(std::vector<float>(bs * nb, -2.5f));
      c.push_back(normal(bs * nb, 200 + static_cast<uint32_t>(nb), 3e4f));
      c.push_back(normal(bs * nb, 300 + static_cast<uint32_t>(nb), 1e-3f, 5e-3f));
    }
    // Ties at .5 after scaling: round-to-nearest-even must agree.
    std::vector<float> ties(bs);
    for (int64_t i = 0; i < bs; ++i) ties[i] = static_cast<float>(i % 2 ? 127 : (i % 5) + 0.5);
    c.push_back(ties);
    return c;
  }();
  for (const auto& x : cases) {
    const auto got = act_of(*fk_, x), want = act_of(*ref_, x);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i << " of " << got.size();
  }
}

float from_bits(uint32_t b) { return fp32_from_bits(b); }

// The F16 / BF16 activation rows round each float to nearest even: every
// target gives the scalar reference's bytes on values chosen at the rounding
// edges (ties both ways, overflow to Inf, F16 subnormals, signed zeros, NaN
// payloads, float subnormals) and on random bit patterns, at every length
// that leaves a SIMD tail; and the results are the hand-derived encodings.
class MatmulFloatAct : public MatmulKernels {};  // instantiated for F16 and BF16 only

TEST_P(MatmulFloatAct, RoundingEdgesBitExact) {
  ASSERT_TRUE(ref_->act == DType::kF16 || ref_->act == DType::kBF16);
  ASSERT_EQ(ref_->act, type_);
  const bool f16 = ref_->act == DType::kF16;
  // {float bits, expected encoding}
  std::vector<std::pair<uint32_t, uint16_t>> cases;
  if (f16) {
    cases = {
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // +-0
        {0x3f800000u, 0x3c00}, {0xbf800000u, 0xbc00},  // +-1
        {0x3f801000u, 0x3c00},  // 1 + 2^-11: tie, to even (down)
        {0x3f803000u, 0x3c02},  // 1 + 3 * 2^-11: tie, to even (up)
        {0xbf801000u, 0xbc00}, {0xbf803000u, 0xbc02},
        {0x3f801001u, 0x3c01},  // just above the tie
        {0x3f800fffu, 0x3c00},  // just below
        {0x45001000u, 0x6800},  // 2049: tie between 2048 and 2050 -> 2048
        {0x45003000u, 0x6802},  // 2051 -> 2052
        {0x477fe000u, 0x7bff},  // 65504, the largest half
        {0x477fefffu, 0x7bff},  // just below 65520
        {0x477ff000u, 0x7c00},  // 65520: tie with 2^16 -> Inf
        {0xc77ff000u, 0xfc00},
        {0x47c35000u, 0x7c00},  // 1e5
        {0x7f7fffffu, 0x7c00}, {0xff7fffffu, 0xfc00},  // FLT_MAX
        {0x7f800000u, 0x7c00}, {0xff800000u, 0xfc00},  // +-Inf
        {0x38800000u, 0x0400},  // 2^-14, the smallest normal half
        {0x387fc000u, 0x03ff},  // 1023 * 2^-24, the largest subnormal
        {0x387fe000u, 0x0400},  // 2^-14 - 2^-25: tie between 0x3ff and 0x400 -> even 0x400
        {0x33800000u, 0x0001}, {0xb3800000u, 0x8001},  // 2^-24, the smallest subnormal
        {0x33000000u, 0x0000},  // 2^-25: tie between 0 and 2^-24 -> 0
        {0xb3000000u, 0x8000},
        {0x33000001u, 0x0001},  // just above
        {0x33c00000u, 0x0002},  // 3 * 2^-25: tie -> 2 * 2^-24
        {0x34200000u, 0x0002},  // 5 * 2^-25: tie -> 2 * 2^-24
        {0x32800000u, 0x0000}, {0xb2800000u, 0x8000},  // 2^-26
        {0x00000001u, 0x0000}, {0x807fffffu, 0x8000},  // float subnormals
        {0x7fc00000u, 0x7e00}, {0xffc00000u, 0xfe00},  // quiet NaN
        {0x7f800001u, 0x7e00},  // signalling NaN
        {0x7fa5a5a5u, 0x7e00}, {0xffffffffu, 0xfe00},  // NaN payloads
    };
  } else {
    cases = {
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000},
        {0x3f800000u, 0x3f80}, {0xbf800000u, 0xbf80},
        {0x3f808000u, 0x3f80},  // 1 + 2^-8: tie, to even (down)
        {0x3f818000u, 0x3f82},  // 1 + 3 * 2^-8: tie, to even (up)
        {0xbf808000u, 0xbf80}, {0xbf818000u, 0xbf82},
        {0x3f808001u, 0x3f81}, {0x3f807fffu, 0x3f80},
        {0x3dcccccdu, 0x3dcd},  // 0.1f
        {0x7f7f7fffu, 0x7f7f},  // rounds down to the largest bf16
        {0x7f7f8000u, 0x7f80},  // tie, odd -> up: Inf
        {0x7f7fffffu, 0x7f80}, {0xff7fffffu, 0xff80},  // FLT_MAX -> Inf
        {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
        {0x00800000u, 0x0080},  // FLT_MIN
        {0x00008000u, 0x0000},  // subnormal tie -> even 0
        {0x00018000u, 0x0002},  // subnormal tie -> even 2
        {0x00000001u, 0x0000}, {0x807fffffu, 0x8080},
        {0x7fc00000u, 0x7fc0}, {0xffc00000u, 0xffc0},
        {0x7f800001u, 0x7fc0},  // signalling NaN with a low payload: quiet, not Inf
        {0x7f80ffffu, 0x7fc0}, {0xff800001u, 0xffc0},
        {0x7fa5a5a5u, 0x7fe5},  // payload's top bits kept, quiet bit set
        {0x7fffffffu, 0x7fff}, {0xffffffffu, 0xffff},
    };
  }
  std::vector<float> x;
  std::vector<uint16_t> expect;
  for (const auto& [bits, enc] : cases) {
    x.push_back(from_bits(bits));
    expect.push_back(enc);
  }
  // Random bit patterns: every exponent, NaNs and Infs included.
  std::mt19937 rng(4242);
  for (int i = 0; i < 2000; ++i) {
    const float f = from_bits(static_cast<uint32_t>(rng()));
    x.push_back(f);
    expect.push_back(f16 ? fp32_to_fp16(f) : fp32_to_bf16(f));
  }
  // Every start offset and length up to 40 (the SIMD tails), then the whole row.
  auto check = [&](int64_t off, int64_t n) {
    std::vector<uint16_t> got(n + 4, 0xdead), want(n + 4, 0xbeef);
    fk_->quantize_act(x.data() + off, got.data(), n);
    ref_->quantize_act(x.data() + off, want.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(want[i], expect[off + i]) << "scalar reference, input bits 0x" << std::hex << fp32_to_bits(x[off + i]);
      ASSERT_EQ(got[i], want[i]) << "off=" << off << " n=" << n << " input bits 0x" << std::hex << fp32_to_bits(x[off + i]);
    }
    for (int64_t i = n; i < n + 4; ++i) ASSERT_EQ(got[i], 0xdead) << "wrote past the row, n=" << n;
    if (!has_batch_act(*fk_)) return;
    // The batch form: the same rounding, widened back to floats, bit for bit.
    ASSERT_EQ(fk_->batch_act, DType::kF32);
    std::vector<float> wide(n + 4, -9.f);
    fk_->quantize_batch_act(x.data() + off, wide.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float back = f16 ? fp16_to_fp32(want[i]) : bf16_to_fp32(want[i]);
      ASSERT_EQ(fp32_to_bits(wide[i]), fp32_to_bits(back)) << "batch form, off=" << off << " n=" << n;
    }
    for (int64_t i = n; i < n + 4; ++i) ASSERT_EQ(wide[i], -9.f) << "batch form wrote past the row, n=" << n;
  };
  for (int64_t off = 0; off < static_cast<int64_t>(cases.size()); ++off)
    for (int64_t n = 1; n <= 40 && off + n <= static_cast<int64_t>(x.size()); ++n) check(off, n);
  check(0, static_cast<int64_t>(x.size()));
}

// vec_dot against the scalar kernel, and the scalar kernel against a
// double-precision dot of the dequantized operands (which ties vec_dot's
// reading of the layout to to_float's).
TEST_P(MatmulKernels, VecDotMatchesScalar) {
  for (int64_t n : test_sizes(type_)) {
    if (n % type_info(ref_->act).block_size) continue;
    for (uint32_t seed = 0; seed < 4; ++seed) {
      const auto w = random_blocks(type_, n, 1000 + seed * 7 + static_cast<uint32_t>(n));
      std::vector<float> x = seed == 3 ? std::vector<float>(n, 0.f) : normal(n, 2000 + seed, seed == 2 ? 100.f : 1.f);
      const auto a = act_of(*ref_, x);
      float got = 0.f, want = 0.f;
      fk_->vec_dot(n, w.data(), a.data(), &got);
      ref_->vec_dot(n, w.data(), a.data(), &want);
      std::vector<float> wf(n), af(n);
      ref_->to_float(w.data(), wf.data(), n);
      scalar_fk(ref_->act).to_float(a.data(), af.data(), n);
      double exact = 0, abs_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += double(wf[i]) * af[i];
        abs_sum += std::fabs(double(wf[i]) * af[i]);
      }
      const double tol = 1e-5 * abs_sum + 1e-30;
      EXPECT_NEAR(want, exact, tol) << "scalar vs dequantized, n=" << n << " seed=" << seed;
      EXPECT_NEAR(got, want, tol) << "target vs scalar, n=" << n << " seed=" << seed;
      ASSERT_TRUE(std::isfinite(got));
      if (fk_->tile_dot) {  // the batch arithmetic, held to the same reference
        float batch = 0.f;
        fk_->tile_dot(n, w.data(), batch_act_of(*fk_, x).data(), &batch);
        EXPECT_NEAR(batch, want, tol) << "tile_dot vs scalar, n=" << n << " seed=" << seed;
      }
    }
  }
}

// Weights from the quantizers (the values a real file holds) at the extremes.
TEST_P(MatmulKernels, EdgeValues) {
  const int64_t n = std::max<int64_t>(256, type_info(type_).block_size);
  std::vector<std::vector<float>> ws = {std::vector<float>(n, 0.f), std::vector<float>(n, 1.75f),
                                        std::vector<float>(n, -3.f), normal(n, 5, 1e3f)};
  if (type_ == DType::kF16) {
    std::vector<float> e(n);
    for (int64_t i = 0; i < n; ++i) e[i] = (i % 4 == 0) ? 65504.f : (i % 4 == 1) ? -6.0e-8f : (i % 4 == 2) ? 6.1e-5f : -1.0f;
    ws.push_back(e);
  }
  const auto x = normal(n, 77);
  for (const auto& wf : ws) {
    std::vector<uint8_t> w(row_bytes(type_, n));
    quantize_row(type_, wf.data(), w.data(), n);
    std::vector<float> got(n), want(n);
    fk_->to_float(w.data(), got.data(), n);
    ref_->to_float(w.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]);
    const auto a = act_of(*ref_, x);
    float dg = 0.f, dw = 0.f;
    fk_->vec_dot(n, w.data(), a.data(), &dg);
    ref_->vec_dot(n, w.data(), a.data(), &dw);
    double abs_sum = 0;
    std::vector<float> af(n);
    scalar_fk(ref_->act).to_float(a.data(), af.data(), n);
    for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(double(want[i]) * af[i]);
    EXPECT_NEAR(dg, dw, 1e-5 * abs_sum + 1e-30);
    if (wf[0] == 0.f && wf[1] == 0.f) {
      EXPECT_EQ(dg, 0.f);
    }
  }
}

// The register-blocked tile computes each (row, token) dot bit-identically to
// the dot that serves a batch's leftover rows and tokens (tile_dot, else
// vec_dot), so a batched product does not depend on how it is tiled.
//
// One exception, by design: the ref-engine target's Q4_K reproduces the
// reference engine, which sums a batch's groups of four tokens in another
// order than the tokens after the last group. There the tile and its leftover
// dot agree to float rounding only, and a batch cut off a multiple of four
// changes the last bits (the golden tests check those bits instead).
bool sums_groups_of_four(Isa isa, DType t) { return isa == Isa::kRefEngine && t == DType::kQ4_K; }

class MatmulTile : public MatmulKernels {};  // instantiated for the (target, format) pairs that have a tile

TEST_P(MatmulTile, MatchesItsDotBitExact) {
  ASSERT_NE(fk_->vec_dot_tile, nullptr);
  const int R = fk_->tile_rows, T = fk_->tile_tokens;
  ASSERT_GT(R, 0);
  ASSERT_GT(T, 0);
  const int64_t bs = std::max(type_info(type_).block_size, type_info(fk_->act).block_size);
  for (int64_t n : {bs, 2 * bs, 3 * bs, 7 * bs, 32 * bs, int64_t{40}, int64_t{1000}}) {
    if (n % type_info(type_).block_size || n % type_info(fk_->act).block_size) continue;
    const size_t wrow = row_bytes(type_, n), arow = row_bytes(batch_act(*fk_), n) + 64;  // padded activation rows
    std::vector<uint8_t> w(wrow * R), a(arow * T);
    for (int r = 0; r < R; ++r) {
      const auto wr = random_blocks(type_, n, 77 + static_cast<uint32_t>(r * 13 + n));
      std::memcpy(w.data() + r * wrow, wr.data(), wrow);
    }
    for (int t = 0; t < T; ++t) {
      const auto x = normal(n, 500 + static_cast<uint32_t>(t + n), t == 1 ? 50.f : 1.f);
      const auto at = batch_act_of(*fk_, x);
      std::memcpy(a.data() + t * arow, at.data(), at.size());
    }
    const int64_t ys = R + 3;
    std::vector<float> got(static_cast<size_t>(ys * T), -1.f);
    fk_->vec_dot_tile(n, w.data(), wrow, a.data(), arow, got.data(), ys);
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) {
        float want = 0.f;
        (fk_->tile_dot ? fk_->tile_dot : fk_->vec_dot)(n, w.data() + r * wrow, a.data() + t * arow, &want);
        if (sums_groups_of_four(isa_, type_)) {
          EXPECT_NEAR(got[t * ys + r], want, 1e-5 * std::fabs(want) + 1e-6) << "n=" << n << " r=" << r << " t=" << t;
          continue;
        }
        uint32_t gb, wb;
        std::memcpy(&gb, &got[t * ys + r], 4);
        std::memcpy(&wb, &want, 4);
        EXPECT_EQ(gb, wb) << "n=" << n << " r=" << r << " t=" << t << " got " << got[t * ys + r] << " want " << want;
      }
  }
}

auto isa_fmt_param_name = [](const auto& info) { return isa_fmt_name(std::get<0>(info.param), std::get<1>(info.param)); };

std::vector<std::tuple<Isa, DType>> tile_params() {
  std::vector<std::tuple<Isa, DType>> p;
  for (Isa isa : supported_isas())
    for (DType t : kFormats)
      if (const FormatKernels* fk = kernel_set(isa).format(t); fk && fk->vec_dot_tile) p.emplace_back(isa, t);
  return p;
}

INSTANTIATE_TEST_SUITE_P(All, MatmulKernels, ::testing::Combine(::testing::ValuesIn(supported_isas()), ::testing::ValuesIn(kFormats)),
                         isa_fmt_param_name);
INSTANTIATE_TEST_SUITE_P(All, MatmulFloatAct,
                         ::testing::Combine(::testing::ValuesIn(supported_isas()), ::testing::Values(DType::kF16, DType::kBF16)),
                         isa_fmt_param_name);
INSTANTIATE_TEST_SUITE_P(All, MatmulTile, ::testing::ValuesIn(tile_params()), isa_fmt_param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MatmulTile);  // a build whose targets have no tiles (Arm today)

// ---- matmul ----------------------------------------------------------------------------

class MatmulProduct : public ::testing::TestWithParam<std::tuple<Isa, DType>> {};

TEST_P(MatmulProduct, MatchesDoubleReference) {
  const Isa isa = std::get<0>(GetParam());
  const DType type = std::get<1>(GetParam());
  if (!isa_supported(isa)) GTEST_SKIP() << isa_name(isa) << " not supported on this machine";
  const KernelSet& ks = kernel_set(isa);
  const FormatKernels& ref = scalar_fk(type);
  const int64_t bs = std::max<int64_t>(type_info(type).block_size, type_info(ref.act).block_size);
  const int64_t rows = 67;
  for (int64_t cols : {bs == 1 ? int64_t{37} : bs, 3 * std::max<int64_t>(bs, 32)}) {
    // Weights: quantized from floats; dequantized copy for the reference.
    const auto wsrc = normal(rows * cols, 9 + static_cast<uint32_t>(cols), 0.5f);
    const uint64_t rb = row_bytes(type, cols);
    const uint64_t rstride = rb + 16;  // rows need not be packed
    std::vector<uint8_t> wdata(rows * rstride);
    std::vector<float> wf(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(type, wsrc.data() + r * cols, wdata.data() + r * rstride, cols);
      ref.to_float(wdata.data() + r * rstride, wf.data() + r * cols, cols);
    }
    WeightView w{type, cols, rows, wdata.data(), rstride};
    for (int threads : {1, 2}) {
      ThreadPool& pool = test_pool(threads);
      for (int64_t n_tok : {1, 3, 17}) {
        const int64_t x_stride = cols + 3, y_stride = rows + 5;
        const auto x = normal(n_tok * x_stride, 31 + static_cast<uint32_t>(n_tok));
        std::vector<float> y(n_tok * y_stride, -7.f);
        AlignedBuf scratch(matmul_scratch_bytes(type, cols, n_tok));
        MatmulArgs args{&w, x.data(), x_stride, n_tok, y.data(), y_stride, scratch.p};
        matmul(ks, args, pool);
        for (int64_t t = 0; t < n_tok; ++t) {
          const float* xt = x.data() + t * x_stride;
          // The activations as the kernels see them (quantized, or as is).
          std::vector<float> xq(xt, xt + cols);
          std::vector<float> blk_err(cols, 0.f);
          const bool float_act = ref.act == DType::kF16 || ref.act == DType::kBF16;
          if (float_act) {
            // Rounded here with the platform conversions, not the kernels':
            // to nearest even, within half an ulp (2^-11 / 2^-8 relative;
            // F16 subnormals: 2^-25 absolute).
            const bool f16 = ref.act == DType::kF16;
            for (int64_t c = 0; c < cols; ++c) {
              xq[c] = f16 ? fp16_to_fp32(fp32_to_fp16(xt[c])) : bf16_to_fp32(fp32_to_bf16(xt[c]));
              blk_err[c] = std::fabs(xt[c]) * (f16 ? 0x1p-11f : 0x1p-8f) + (f16 ? 0x1p-25f : 0.f);
            }
          } else if (ref.act != DType::kF32) {
            std::vector<uint8_t> a(row_bytes(ref.act, cols));
            ref.quantize_act(xt, a.data(), cols);
            scalar_fk(ref.act).to_float(a.data(), xq.data(), cols);
            const int64_t abs = type_info(ref.act).block_size;
            for (int64_t b0 = 0; b0 < cols; b0 += abs) {
              float amax = 0.f;
              for (int64_t i = b0; i < b0 + abs; ++i) amax = std::max(amax, std::fabs(xt[i]));
              // half a step, plus the fp16 rounding of the Q8_0 scale
              for (int64_t i = b0; i < b0 + abs; ++i) blk_err[i] = amax / 127.f * 0.5f + amax * 1e-3f;
            }
          }
          for (int64_t r = 0; r < rows; ++r) {
            const float* wr = wf.data() + r * cols;
            double exact_q = 0, exact = 0, abs_sum = 0, bound = 0;
            for (int64_t c = 0; c < cols; ++c) {
              exact_q += double(wr[c]) * xq[c];
              exact += double(wr[c]) * xt[c];
              abs_sum += std::fabs(double(wr[c]) * xq[c]);
              bound += std::fabs(double(wr[c])) * blk_err[c];
            }
            const float got = y[t * y_stride + r];
            // Float formats: the products are exact (F16 x F16, BF16 x BF16)
            // or rounded once (F32), so float summation in any order is
            // within cols * 2^-24 * sum |w x| of the exact value.
            const double tol = type_info(type).block_size == 1 ? 1.01 * cols * 0x1p-24 * abs_sum + 1e-30
                                                               : 2e-5 * abs_sum + 1e-6;
            ASSERT_NEAR(got, exact_q, tol)
                << "t=" << t << " r=" << r << " cols=" << cols << " threads=" << threads << " n_tok=" << n_tok;
            ASSERT_NEAR(got, exact, bound + tol) << "vs float activations";
          }
          for (int64_t r = rows; r < y_stride; ++r) ASSERT_EQ(y[t * y_stride + r], -7.f) << "wrote past the row";
        }
      }
    }
  }
}

// A batched product does not depend on how the batch is cut: 19 tokens at
// once give bit for bit what 8 + 11 and 2 + 17 give (tiles, leftover rows
// and leftover tokens all compute in the tile's arithmetic), on 1 and 2
// threads. (One token alone runs the decode kernel, which may sum in
// another order.)
TEST_P(MatmulProduct, BatchSplitDoesNotChangeResults) {
  const Isa isa = std::get<0>(GetParam());
  const DType type = std::get<1>(GetParam());
  if (!isa_supported(isa)) GTEST_SKIP() << isa_name(isa) << " not supported on this machine";
  const KernelSet& ks = kernel_set(isa);
  const int64_t bs = std::max<int64_t>(type_info(type).block_size, type_info(scalar_fk(type).act).block_size);
  const int64_t rows = 83, cols = 4 * std::max<int64_t>(bs, 32), n_tok = 19;
  const auto wsrc = normal(rows * cols, 5, 0.5f);
  const uint64_t rb = row_bytes(type, cols);
  std::vector<uint8_t> wdata(rows * rb);
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, wsrc.data() + r * cols, wdata.data() + r * rb, cols);
  WeightView w{type, cols, rows, wdata.data(), rb};
  const auto x = normal(n_tok * cols, 6);
  auto run = [&](int64_t t0, int64_t n, int threads, std::vector<float>& y) {
    AlignedBuf scratch(matmul_scratch_bytes(type, cols, n));
    MatmulArgs args{&w, x.data() + t0 * cols, cols, n, y.data() + t0 * rows, rows, scratch.p};
    matmul(ks, args, test_pool(threads));
  };
  for (int threads : {1, 2}) {
    std::vector<float> whole(n_tok * rows), a(n_tok * rows), b(n_tok * rows);
    run(0, n_tok, threads, whole);
    run(0, 8, threads, a);
    run(8, n_tok - 8, threads, a);
    run(0, 2, threads, b);
    run(2, n_tok - 2, threads, b);
    ASSERT_EQ(std::memcmp(whole.data(), a.data(), whole.size() * sizeof(float)), 0) << "8 + 11, threads=" << threads;
    if (sums_groups_of_four(isa, type)) {  // 2 + 17 regroups the tokens: equal to float rounding only
      for (size_t i = 0; i < whole.size(); ++i)
        ASSERT_NEAR(b[i], whole[i], 1e-5 * std::fabs(whole[i]) + 1e-5) << "2 + 17, threads=" << threads << " at " << i;
      continue;
    }
    ASSERT_EQ(std::memcmp(whole.data(), b.data(), whole.size() * sizeof(float)), 0) << "2 + 17, threads=" << threads;
  }
}

// matmul_multi over three products of one input x ([n_tok, cols]) against
// a matmul() call for each: every output bit for bit.
void expect_multi_matches_separate(const KernelSet& ks, const WeightView* w, const int64_t* rows_of, int64_t cols,
                                   int64_t n_tok, const std::vector<float>& x, ThreadPool& pool,
                                   const std::string& where) {
  AlignedBuf scratch(matmul_scratch_bytes(w[0].type, cols, n_tok));
  std::vector<std::vector<float>> got(3), want(3);
  MatmulArgs args[3];
  for (int i = 0; i < 3; ++i) {
    got[i].assign(n_tok * rows_of[i], -3.f);
    want[i].assign(n_tok * rows_of[i], -4.f);
    MatmulArgs one{&w[i], x.data(), cols, n_tok, want[i].data(), rows_of[i], scratch.p};
    matmul(ks, one, pool);
    args[i] = MatmulArgs{&w[i], x.data(), cols, n_tok, got[i].data(), rows_of[i], scratch.p};
  }
  matmul_multi(ks, args, 3, pool);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0)
        << "matrix " << i << " n_tok " << n_tok << " threads " << pool.size() << " " << where;
}

// matmul_multi gives exactly what separate matmul() calls give (one token:
// one fused dispatch; several: the input converted once and one dispatch,
// on the calling thread for a small batch and split over the threads for a
// large one), for 1 and 2 threads.
TEST_P(MatmulProduct, MultiMatchesSeparateCalls) {
  const Isa isa = std::get<0>(GetParam());
  const DType type = std::get<1>(GetParam());
  if (!isa_supported(isa)) GTEST_SKIP() << isa_name(isa) << " not supported on this machine";
  const KernelSet& ks = kernel_set(isa);
  const FormatKernels& ref = scalar_fk(type);
  const int64_t bs = std::max<int64_t>(type_info(type).block_size, type_info(ref.act).block_size);
  const int64_t cols = 2 * std::max<int64_t>(bs, 32);
  const int64_t rows_of[3] = {67, 32, 19};
  std::vector<std::vector<uint8_t>> wdata(3);
  std::vector<WeightView> w;
  for (int i = 0; i < 3; ++i) {
    const auto wsrc = normal(rows_of[i] * cols, 90 + static_cast<uint32_t>(i), 0.5f);
    const uint64_t rb = row_bytes(type, cols);
    wdata[i].resize(rows_of[i] * rb);
    for (int64_t r = 0; r < rows_of[i]; ++r) quantize_row(type, wsrc.data() + r * cols, wdata[i].data() + r * rb, cols);
    w.push_back(WeightView{type, cols, rows_of[i], wdata[i].data(), rb});
  }
  for (int threads : {1, 2}) {
    ThreadPool& pool = test_pool(threads);
    for (int64_t n_tok : {1, 5, 130})
      expect_multi_matches_separate(ks, w.data(), rows_of, cols, n_tok,
                                    normal(n_tok * cols, 7 + static_cast<uint32_t>(n_tok)), pool, "plain");
  }
}

TEST_P(MatmulProduct, DequantizeRow) {
  const Isa isa = std::get<0>(GetParam());
  const DType type = std::get<1>(GetParam());
  if (!isa_supported(isa)) GTEST_SKIP();
  const int64_t cols = 512, rows = 5;
  const auto src = normal(rows * cols, 3);
  std::vector<uint8_t> wd(rows * row_bytes(type, cols));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, src.data() + r * cols, wd.data() + r * row_bytes(type, cols), cols);
  WeightView w{type, cols, rows, wd.data(), row_bytes(type, cols)};
  std::vector<float> got(cols), want(cols);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(kernel_set(isa), w, r, got.data());
    scalar_fk(type).to_float(w.row(r), want.data(), cols);
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[c], want[c]);
  }
}

INSTANTIATE_TEST_SUITE_P(All, MatmulProduct,
                         ::testing::Combine(::testing::ValuesIn(supported_isas()),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                                              DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K)),
                         [](const auto& info) { return isa_fmt_name(std::get<0>(info.param), std::get<1>(info.param)); });

// ---- packed weights (Packing::kQ4_0x8, kQ8_0x8, kQ4_Kx8, kQ5_Kx8, kQ6_Kx8) -------------

const DType kPackable[] = {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Row lengths for a packable format: a few blocks, odd counts included.
std::vector<int64_t> packed_cols(DType t, std::initializer_list<int64_t> blocks) {
  std::vector<int64_t> c;
  for (int64_t b : blocks) c.push_back(b * type_info(t).block_size);
  return c;
}

std::vector<std::tuple<Isa, DType>> packed_params() {
  std::vector<std::tuple<Isa, DType>> p;
  for (Isa isa : supported_isas())
    for (DType t : kPackable)
      if (kernel_set(isa).format(t)->x8_gemm) p.emplace_back(isa, t);
  return p;
}

// Random rows of a packable format, plain and packed copies.
struct PackedMatrix {
  PackedMatrix(DType type, int64_t rows, int64_t cols, uint32_t seed)
      : type(type), rows(rows), cols(cols), rb(row_bytes(type, cols)) {
    plain.resize(rows * rb);
    for (int64_t r = 0; r < rows; ++r) {
      const auto b = random_blocks(type, cols, seed + static_cast<uint32_t>(r));
      std::memcpy(plain.data() + r * rb, b.data(), rb);
    }
    packed = plain;
    pack_rows(packing_for(type, rows, cols), type, packed.data(), rows, cols);
  }
  WeightView plain_view() const { return {type, cols, rows, plain.data(), rb}; }
  WeightView packed_view() const { return {type, cols, rows, packed.data(), rb, packing_for(type, rows, cols)}; }
  DType type;
  int64_t rows, cols;
  uint64_t rb;
  std::vector<uint8_t> plain, packed;
};

TEST(MatmulPacking, RoundTripsAndLeavesTailRows) {
  for (DType t : kPackable)
    for (int64_t rows : {8, 13, 16, 21})
      for (int64_t cols : packed_cols(t, {1, 3})) {
        const PackedMatrix m(t, rows, cols, 11);
        EXPECT_NE(packing_for(t, rows, cols), Packing::kRows);
        // Grouped rows are rearranged (the check would pass on a no-op otherwise).
        EXPECT_NE(std::memcmp(m.packed.data(), m.plain.data(), rows / 8 * 8 * m.rb), 0);
        const int64_t tail = rows / 8 * 8;
        EXPECT_EQ(std::memcmp(m.packed.data() + tail * m.rb, m.plain.data() + tail * m.rb, (rows - tail) * m.rb), 0);
        std::vector<uint8_t> row(m.rb);
        for (int64_t r = 0; r < rows; ++r) {
          unpack_row(m.packed_view(), r, row.data());
          ASSERT_EQ(std::memcmp(row.data(), m.plain.data() + r * m.rb, m.rb), 0)
              << dtype_name(t) << " rows=" << rows << " r=" << r;
        }
      }
  EXPECT_EQ(packing_for(DType::kQ4_0, 7, 64), Packing::kRows);
  EXPECT_EQ(packing_for(DType::kQ4_K, 64, 96), Packing::kRows);
  EXPECT_EQ(packing_for(DType::kQ6_K, 7, 256), Packing::kRows);
}

class MatmulPacked : public ::testing::TestWithParam<std::tuple<Isa, DType>> {};

// Every output of a packed product is x8_dot of its plain row and token, bit
// for bit: one token or many, rows in whole groups and past them, 1 and 2
// threads; and within float rounding of the scalar reference.
TEST_P(MatmulPacked, MatchesRowArithmeticBitExact) {
  const KernelSet& ks = kernel_set(std::get<0>(GetParam()));
  const DType type = std::get<1>(GetParam());
  const FormatKernels& fk = *ks.format(type);
  ASSERT_NE(fk.x8_dot, nullptr);
  for (int64_t rows : {8, 13, 24, 40, 67})
    for (int64_t cols : packed_cols(type, {1, 3, 4, 32})) {
      const PackedMatrix m(type, rows, cols, 100 + static_cast<uint32_t>(rows + cols));
      const WeightView pv = m.packed_view();
      for (int threads : {1, 2})
        for (int64_t n_tok : {1, 2, 3, 4, 5, 8, 9, 17}) {
          const int64_t x_stride = cols + 3, y_stride = rows + 5;
          const auto x = normal(n_tok * x_stride, 7 + static_cast<uint32_t>(n_tok + cols), n_tok == 3 ? 40.f : 1.f);
          std::vector<float> y(n_tok * y_stride, -7.f);
          AlignedBuf scratch(matmul_scratch_bytes(type, cols, n_tok));
          MatmulArgs args{&pv, x.data(), x_stride, n_tok, y.data(), y_stride, scratch.p};
          matmul(ks, args, test_pool(threads));
          std::vector<uint8_t> a(row_bytes(fk.act, cols));
          std::vector<float> af(cols), wf(cols);
          for (int64_t t = 0; t < n_tok; ++t) {
            fk.quantize_act(x.data() + t * x_stride, a.data(), cols);
            scalar_fk(fk.act).to_float(a.data(), af.data(), cols);
            for (int64_t r = 0; r < rows; ++r) {
              float want = 0.f, ref = 0.f;
              fk.x8_dot(cols, m.plain.data() + r * m.rb, a.data(), &want);
              scalar_fk(type).vec_dot(cols, m.plain.data() + r * m.rb, a.data(), &ref);
              const float got = y[t * y_stride + r];
              ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "rows=" << rows << " cols=" << cols << " n_tok=" << n_tok
                                                        << " t=" << t << " r=" << r << " got " << got << " want " << want;
              // Two float sums of exact block terms: within a few roundings
              // of sum |term| each. Q4_K's and Q5_K's sums are of their scale
              // and min parts, each of which can exceed sum |w a| (w = scale
              // part - min part): a looser relative bound there.
              scalar_fk(type).to_float(m.plain.data() + r * m.rb, wf.data(), cols);
              double abs_sum = 0;
              for (int64_t c = 0; c < cols; ++c) abs_sum += std::fabs(double(wf[c]) * af[c]);
              const double tol = type == DType::kQ4_K || type == DType::kQ5_K ? 1e-4 * abs_sum + 1e-6
                                                      : 4.0 * (cols / 32 + 2) * 0x1p-24 * abs_sum + 1e-7;
              ASSERT_NEAR(got, ref, tol) << "vs scalar, r=" << r;
            }
            for (int64_t r = rows; r < y_stride; ++r) ASSERT_EQ(y[t * y_stride + r], -7.f) << "wrote past the rows";
          }
        }
    }
}

// matmul_multi with packed matrices against separate calls: one token, the
// union of rows (67 + 32 + 19) not starting on a group boundary, the first
// matrix plain; batches of 4, 8 and 11 tokens (the 16-row kernel's widths
// and a remainder), all packed (one fused dispatch) and mixed with a plain
// matrix (each product alone).
TEST_P(MatmulPacked, MultiMatchesSeparateCalls) {
  const KernelSet& ks = kernel_set(std::get<0>(GetParam()));
  const DType type = std::get<1>(GetParam());
  const int64_t cols = 4 * type_info(type).block_size, rows_of[3] = {67, 32, 19};
  std::vector<PackedMatrix> ms;
  for (int i = 0; i < 3; ++i) ms.emplace_back(type, rows_of[i], cols, 300 + static_cast<uint32_t>(i));
  for (bool first_plain : {true, false}) {
    std::vector<WeightView> w;
    for (const auto& m : ms) w.push_back(m.packed_view());
    if (first_plain) w[0] = ms[0].plain_view();
    for (int threads : {1, 2}) {
      for (int64_t n_tok : {1, 4, 8, 11})
        expect_multi_matches_separate(ks, w.data(), rows_of, cols, n_tok,
                                      normal(n_tok * cols, 17 + static_cast<uint32_t>(n_tok)), test_pool(threads),
                                      first_plain ? "first plain" : "all packed");
    }
  }
}

// Low-rank terms (LoRA pairs) given to a one-token product: y is, bit for
// bit, the product without them followed by the target's LoRA kernels (down
// over the whole rank, then up over all columns, term after term), whatever
// the pieces the threads claim. Three products of one input (67 + 32 + 19
// rows: pieces cut through the products and through packed groups), the
// first with two terms (F16 rank 5: a piece of A x shorter than eight rows;
// F32 rank 16: two pieces), the second with none, the third with one (F16 rank 4);
// matmul() alone with the first product's terms; 1 and 2 threads.
TEST_P(MatmulPacked, LowRankTermsMatchTheLoraKernelsAfterTheProduct) {
  const Isa isa = std::get<0>(GetParam());
  const KernelSet& ks = kernel_set(isa);
  const LoraKernels& lk = lora_kernels(isa);
  const DType type = std::get<1>(GetParam());
  const int64_t cols = 8 * type_info(type).block_size, rows_of[3] = {67, 32, 19};
  std::vector<PackedMatrix> ms;
  for (int i = 0; i < 3; ++i) ms.emplace_back(type, rows_of[i], cols, 500 + static_cast<uint32_t>(i));
  // The terms' weights: F32 values that F16 holds exactly, as F32 and as F16 bits.
  struct Pair {
    int product;
    int64_t rank;
    bool f16;
    float scale;
    std::vector<float> a, bt;  // [rank, cols], [rank, rows]
    std::vector<uint16_t> a16, bt16;
  };
  std::vector<Pair> pairs = {{0, 5, true, 0.75f, {}, {}, {}, {}},
                             {0, 16, false, -1.5f, {}, {}, {}, {}},
                             {2, 4, true, 2.0f, {}, {}, {}, {}}};
  uint32_t seed = 700;
  for (Pair& p : pairs) {
    p.a = normal(p.rank * cols, seed++, 0.05f);
    p.bt = normal(p.rank * rows_of[p.product], seed++, 0.05f);
    for (auto* v : {&p.a, &p.bt}) {
      std::vector<uint16_t>& h = v == &p.a ? p.a16 : p.bt16;
      for (float& f : *v) {
        h.push_back(fp32_to_fp16(f));
        f = fp16_to_fp32(h.back());
      }
    }
  }
  const std::vector<float> x = normal(cols, 71);
  AlignedBuf scratch(matmul_scratch_bytes(type, cols, 1));
  // The expected outputs: the plain products, then each term with the LoRA kernels.
  auto expected = [&](const std::vector<WeightView>& w, ThreadPool& pool, int n) {
    std::vector<std::vector<float>> y(3);
    for (int i = 0; i < n; ++i) {
      y[i].assign(rows_of[i], -5.f);
      MatmulArgs a{&w[i], x.data(), cols, 1, y[i].data(), rows_of[i], scratch.p};
      matmul(ks, a, pool);
      for (const Pair& p : pairs) {
        if (p.product != i) continue;
        std::vector<float> t(p.rank);
        if (p.f16) {
          lk.down_f16(p.a16.data(), x.data(), cols, 1, p.rank, cols, t.data());
          lk.up_f16(p.bt16.data(), t.data(), p.scale, 1, p.rank, rows_of[i], 0, rows_of[i], y[i].data(), 0);
        } else {
          lk.down(p.a.data(), x.data(), cols, 1, p.rank, cols, t.data());
          lk.up(p.bt.data(), t.data(), p.scale, 1, p.rank, rows_of[i], 0, rows_of[i], y[i].data(), 0);
        }
      }
    }
    return y;
  };
  std::vector<std::vector<float>> t_scratch(pairs.size());
  std::vector<std::vector<LowRankTerm>> terms(3);
  for (size_t k = 0; k < pairs.size(); ++k) {
    const Pair& p = pairs[k];
    t_scratch[k].assign(p.rank, std::numeric_limits<float>::quiet_NaN());
    LowRankTerm lt;
    lt.a = p.f16 ? static_cast<const void*>(p.a16.data()) : p.a.data();
    lt.bt = p.f16 ? static_cast<const void*>(p.bt16.data()) : p.bt.data();
    lt.f16 = p.f16;
    lt.rank = p.rank;
    lt.scale = p.scale;
    lt.t = t_scratch[k].data();
    terms[p.product].push_back(lt);
  }
  for (bool packed : {true, false}) {
    std::vector<WeightView> w;
    for (const auto& m : ms) w.push_back(packed ? m.packed_view() : m.plain_view());
    for (int threads : {1, 2}) {
      ThreadPool& pool = test_pool(threads);
      const std::string where = std::string(packed ? "packed" : "plain") + " threads " + std::to_string(threads);
      const auto want = expected(w, pool, 3);
      std::vector<std::vector<float>> got(3);
      MatmulArgs args[3];
      for (int i = 0; i < 3; ++i) {
        got[i].assign(rows_of[i], -5.f);
        args[i] = MatmulArgs{&w[i], x.data(), cols, 1, got[i].data(), rows_of[i], scratch.p};
        args[i].terms = terms[i];
      }
      matmul_multi(ks, args, 3, pool);
      for (int i = 0; i < 3; ++i)
        ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0)
            << "matmul_multi, product " << i << " " << where;
      // The terms do change the outputs (a dropped term would show).
      const auto base = [&] {
        std::vector<float> y(rows_of[0], -5.f);
        MatmulArgs a{&w[0], x.data(), cols, 1, y.data(), rows_of[0], scratch.p};
        matmul(ks, a, pool);
        return y;
      }();
      int changed = 0;
      for (int64_t r = 0; r < rows_of[0]; ++r) changed += base[r] != want[0][r];
      EXPECT_GT(changed, rows_of[0] / 2) << where;
      // matmul() alone with terms.
      std::vector<float> one(rows_of[0], -5.f);
      MatmulArgs a{&w[0], x.data(), cols, 1, one.data(), rows_of[0], scratch.p};
      a.terms = terms[0];
      matmul(ks, a, pool);
      ASSERT_EQ(std::memcmp(one.data(), want[0].data(), one.size() * sizeof(float)), 0) << "matmul, " << where;
    }
  }
}

TEST_P(MatmulPacked, DequantizeRow) {
  const KernelSet& ks = kernel_set(std::get<0>(GetParam()));
  const PackedMatrix m(std::get<1>(GetParam()), 21, 256, 5);
  std::vector<float> got(256), want(256);
  for (int64_t r = 0; r < 21; ++r) {
    dequantize_row(ks, m.packed_view(), r, got.data());
    dequantize_row(ks, m.plain_view(), r, want.data());
    ASSERT_EQ(got, want) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(All, MatmulPacked, ::testing::ValuesIn(packed_params()), isa_fmt_param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MatmulPacked);  // targets without packed kernels (Arm today)

// The activation rounding is visible in the product: x values that F16 /
// BF16 cannot hold give exactly the product with the rounded value (a few
// equal terms and zeros: every sum is exact), on every target, one token and
// several (the threaded conversion), tails included (cols = 70); F32 weights
// keep x as is.
TEST(MatmulActivations, RoundedToTheWeightFormat) {
  struct Case {
    DType type;
    float x, rounded;
  };
  const Case cases[] = {
      {DType::kF16, 1.f + 0x1p-11f + 0x1p-14f, 1.f + 0x1p-10f},  // above the tie: up
      {DType::kF16, 1.f + 0x1p-11f, 1.f},                          // tie: to even (down)
      {DType::kF16, 1.f + 3 * 0x1p-11f, 1.f + 0x1p-9f},            // tie: to even (up)
      {DType::kF16, -0.1f, -0.0999755859375f},                     // 0xae66
      {DType::kF16, 0x1p-25f * 3, 0x1p-24f * 2},                   // subnormal tie
      {DType::kBF16, 1.f + 0x1p-8f + 0x1p-12f, 1.f + 0x1p-7f},
      {DType::kBF16, 1.f + 0x1p-8f, 1.f},
      {DType::kBF16, 1.f + 3 * 0x1p-8f, 1.f + 0x1p-6f},
      {DType::kBF16, 0.1f, 0.10009765625f},  // 0x3dcd
      {DType::kF32, 1.f + 0x1p-11f + 0x1p-14f, 1.f + 0x1p-11f + 0x1p-14f},
      {DType::kF32, 0.1f, 0.1f},
  };
  const int64_t cols = 70, rows = 35;
  const int64_t nonzero[] = {0, 33, 69};
  for (const Case& c : cases) {
    if (c.type != DType::kF32) {
      ASSERT_NE(c.x, c.rounded);
    }
    // Row r: all 1 (even r) or all 2 (odd r), exact in every format.
    std::vector<float> wsrc(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) wsrc[r * cols + k] = r % 2 ? 2.f : 1.f;
    const uint64_t rb = row_bytes(c.type, cols);
    std::vector<uint8_t> wdata(rows * rb);
    for (int64_t r = 0; r < rows; ++r) quantize_row(c.type, wsrc.data() + r * cols, wdata.data() + r * rb, cols);
    WeightView w{c.type, cols, rows, wdata.data(), rb};
    for (Isa isa : supported_isas())
      for (int threads : {1, 2})
        for (int64_t n_tok : {1, 3}) {
          std::vector<float> x(n_tok * cols, 0.f), y(n_tok * rows, -7.f);
          for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t k : nonzero) x[t * cols + k] = c.x;
          AlignedBuf scratch(matmul_scratch_bytes(c.type, cols, n_tok));
          MatmulArgs args{&w, x.data(), cols, n_tok, y.data(), rows, scratch.p};
          matmul(kernel_set(isa), args, test_pool(threads));
          for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_EQ(y[t * rows + r], 3.f * (r % 2 ? 2.f : 1.f) * c.rounded)
                  << dtype_name(c.type) << " x=" << c.x << " " << isa_name(isa) << " threads=" << threads
                  << " n_tok=" << n_tok << " t=" << t << " r=" << r;
        }
  }
}

TEST(MatmulApi, TableAndScratch) {
  for (Isa isa : supported_isas()) {
    const KernelSet& ks = kernel_set(isa);
    EXPECT_EQ(ks.isa(), isa);
    EXPECT_EQ(ks.format(DType::kIQ2_XXS), nullptr);
    EXPECT_EQ(ks.format(DType::kQ4_0)->act, DType::kQ8_0);
    EXPECT_EQ(ks.format(DType::kQ8_0)->act, DType::kQ8_0);
    for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) EXPECT_EQ(ks.format(t)->act, DType::kQ8_K);
    EXPECT_EQ(ks.format(DType::kF32)->act, DType::kF32);
    EXPECT_EQ(ks.format(DType::kF16)->act, DType::kF16);
    EXPECT_EQ(ks.format(DType::kBF16)->act, DType::kBF16);
  }
  EXPECT_EQ(matmul_scratch_bytes(DType::kF32, 4096, 8), 0u);
  // F16 / BF16: one 2-byte row per token, rows 64-byte aligned; a batch of
  // F16 products room for float rows (batch_act).
  EXPECT_EQ(matmul_scratch_bytes(DType::kF16, 4096, 1), 8192u);
  EXPECT_EQ(matmul_scratch_bytes(DType::kF16, 4096, 8), 8u * 16384u);
  EXPECT_EQ(matmul_scratch_bytes(DType::kBF16, 4096, 3), 3u * 8192u);
  EXPECT_EQ(matmul_scratch_bytes(DType::kF16, 37, 2), 2u * 192u);
  EXPECT_EQ(matmul_scratch_bytes(DType::kBF16, 32, 5), 5u * 64u);
  EXPECT_GE(matmul_scratch_bytes(DType::kQ4_0, 4096, 3), 3 * row_bytes(DType::kQ8_0, 4096));
  EXPECT_EQ(matmul_scratch_bytes(DType::kQ4_K, 4096, 2) % 64, 0u);
  EXPECT_GE(matmul_scratch_bytes(DType::kQ6_K, 4096, 2), 2 * row_bytes(DType::kQ8_K, 4096));
}

}  // namespace
}  // namespace ebb

