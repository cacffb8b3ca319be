// Weight quantizers and block layouts: hand-built blocks decode to the values
// the GGUF layout defines, quantize -> dequantize stays within per-format
// error bounds, and tensors of real GGUF files (quantized by another engine)
// dequantize to the values of the same model's F16 file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/quantize.h"
#include "model/gguf.h"
#include "platform/fp16.h"
#include "support.h"

namespace ebb {
namespace {

const FormatKernels& scalar_fk(DType t) { return *kernel_set(Isa::kScalar).format(t); }

std::vector<float> dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(n);
  scalar_fk(t).to_float(src, out.data(), n);
  return out;
}

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double rel_rmse(const std::vector<float>& ref, const std::vector<float>& got) {
  double e = 0, s = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    s += double(ref[i]) * ref[i];
  }
  return s > 0 ? std::sqrt(e / s) : std::sqrt(e);
}

// ---- layouts -------------------------------------------------------------------------

TEST(QuantLayout, Q4_0NibbleOrder) {
  BlockQ4_0 b{};
  b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::kQ4_0, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (7 - j)) << j;
  }
}

TEST(QuantLayout, Q8_0) {
  BlockQ8_0 b{};
  b.d = fp32_to_fp16(0.25f);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  const auto y = dequant(DType::kQ8_0, &b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.25f * (j * 8 - 128));
}

// Scale bytes with every high-bit field populated, decoded by hand from the
// GGUF definition: j < 4: sc = q[j] & 63, m = q[j+4] & 63; j >= 4:
// sc = (q[j+4] & 15) | (q[j-4] >> 6) << 4, m = (q[j+4] >> 4) | (q[j] >> 6) << 4.
constexpr uint8_t kScales[12] = {0xC1, 0x42, 0x83, 0x04, 0x45, 0x86, 0xC7, 0x08, 0x21, 0x43, 0x65, 0x87};
constexpr int kSc[8] = {1, 2, 3, 4, 49, 19, 37, 7};
constexpr int kMin[8] = {5, 6, 7, 8, 18, 36, 54, 8};

TEST(QuantLayout, Q4_KScalesAndNibbles) {
  BlockQ4_K b{};
  b.d = fp32_to_fp16(1.f);
  b.dmin = fp32_to_fp16(0.5f);
  std::memcpy(b.scales, kScales, 12);
  // Element 64k + l has nibble (l + k) & 15; element 64k + 32 + l has (l * 3 + k) & 15.
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 32; ++l) b.qs[32 * k + l] = static_cast<uint8_t>(((l + k) & 15) | (((l * 3 + k) & 15) << 4));
  const auto y = dequant(DType::kQ4_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, k = e / 64, l = e % 32;
    const int q = (j % 2 == 0) ? ((l + k) & 15) : ((l * 3 + k) & 15);
    EXPECT_EQ(y[e], 1.f * kSc[j] * q - 0.5f * kMin[j]) << e;
  }
}

TEST(QuantLayout, Q5_KHighBits) {
  BlockQ5_K b{};
  b.d = fp32_to_fp16(1.f);
  b.dmin = fp32_to_fp16(1.f);
  std::memcpy(b.scales, kScales, 12);
  for (int i = 0; i < 128; ++i) b.qs[i] = 0x00;
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(l * 37 + 11);  // bit j: high bit of element 32j + l
  const auto y = dequant(DType::kQ5_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    const int q = ((static_cast<uint8_t>(l * 37 + 11) >> j) & 1) * 16;
    EXPECT_EQ(y[e], float(kSc[j] * q) - float(kMin[j])) << e;
  }
}

TEST(QuantLayout, Q6_KBitPlanes) {
  // Element e gets the 6-bit value v(e) = (e * 7 + 3) & 63; pack it as GGUF
  // does and check every element decodes to scales[e / 16] * (v - 32) * d.
  auto v = [](int e) { return (e * 7 + 3) & 63; };
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.5f);
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g * 17 - 128);
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int e = 128 * h + l;
      b.ql[64 * h + l] = static_cast<uint8_t>((v(e) & 15) | ((v(e + 64) & 15) << 4));
      b.ql[64 * h + 32 + l] = static_cast<uint8_t>((v(e + 32) & 15) | ((v(e + 96) & 15) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>((v(e) >> 4) | ((v(e + 32) >> 4) << 2) | ((v(e + 64) >> 4) << 4) | ((v(e + 96) >> 4) << 6));
    }
  const auto y = dequant(DType::kQ6_K, &b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.5f * b.scales[e / 16] * (v(e) - 32)) << e;
}

TEST(QuantLayout, Q8_KBlockSums) {
  const auto x = normal(512, 4);
  std::vector<BlockQ8_K> b(2);
  quantize_row(DType::kQ8_K, x.data(), b.data(), 512);
  for (const auto& blk : b)
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += blk.qs[16 * g + l];
      EXPECT_EQ(blk.bsums[g], s);
    }
}

// ---- quantize -> dequantize ----------------------------------------------------------------

struct Bound {
  DType type;
  double max_rel_rmse;  // on Gaussian data
};

class QuantRoundTrip : public ::testing::TestWithParam<Bound> {};

TEST_P(QuantRoundTrip, ErrorWithinBound) {
  const Bound b = GetParam();
  for (int64_t blocks : {1, 3, 7, 16}) {
    const int64_t n = blocks * 256;
    for (float scale : {1.f, 1e-3f, 300.f}) {
      const auto x = normal(n, 17 + static_cast<uint32_t>(blocks), scale);
      std::vector<uint8_t> q(row_bytes(b.type, n));
      quantize_row(b.type, x.data(), q.data(), n);
      const double err = rel_rmse(x, dequant(b.type, q.data(), n));
      EXPECT_LE(err, b.max_rel_rmse) << dtype_name(b.type) << " n=" << n << " scale=" << scale;
    }
  }
}

TEST_P(QuantRoundTrip, EdgeValues) {
  const DType t = GetParam().type;
  const int64_t n = 512;
  auto roundtrip = [&](const std::vector<float>& x) {
    std::vector<uint8_t> q(row_bytes(t, n));
    quantize_row(t, x.data(), q.data(), n);
    return dequant(t, q.data(), n);
  };
  // Zeros stay exactly zero.
  for (float v : roundtrip(std::vector<float>(n, 0.f))) ASSERT_EQ(v, 0.f);
  // All equal (positive and negative): close, finite.
  for (float c : {1.f, -3.25f, 1e4f, -1e4f}) {
    const auto y = roundtrip(std::vector<float>(n, c));
    for (float v : y) ASSERT_NEAR(v, c, std::fabs(c) * 0.02) << dtype_name(t);
  }
  // Mostly zeros with one spike per block: the spike survives.
  std::vector<float> x(n, 0.f);
  for (int64_t i = 0; i < n; i += 32) x[i + 5] = (i % 64 ? -1.f : 1.f) * 50.f;
  const auto y = roundtrip(x);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(y[i]));
    ASSERT_NEAR(y[i], x[i], 50.f * 0.1f) << dtype_name(t) << " i=" << i;
  }
  // Half-precision extremes: representable values round-trip exactly.
  if (t == DType::kF16) {
    std::vector<float> e(n);
    const float vals[] = {65504.f, -65504.f, 6.103515625e-05f, 5.960464477539063e-08f, -5.960464477539063e-08f, 0.f, -1.f, 1023.5f};
    for (int64_t i = 0; i < n; ++i) e[i] = vals[i % 8];
    const auto r = roundtrip(e);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(r[i], e[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(All, QuantRoundTrip,
                         ::testing::Values(Bound{DType::kF32, 0.0}, Bound{DType::kF16, 5e-4}, Bound{DType::kBF16, 4e-3},
                                           Bound{DType::kQ8_0, 0.01}, Bound{DType::kQ8_K, 0.01}, Bound{DType::kQ4_0, 0.12},
                                           Bound{DType::kQ4_K, 0.10}, Bound{DType::kQ5_K, 0.05}, Bound{DType::kQ6_K, 0.025},
                                           Bound{DType::kQ4_1, 0.10}, Bound{DType::kQ5_0, 0.05}, Bound{DType::kQ5_1, 0.05},
                                           Bound{DType::kIQ4_NL, 0.10}, Bound{DType::kIQ4_XS, 0.10},
                                           Bound{DType::kQ3_K, 0.20}, Bound{DType::kQ2_K, 0.40}),
                         [](const auto& info) { return std::string(dtype_name(info.param.type)); });

// ---- F16 / BF16 activations ------------------------------------------------------------

// The F16 / BF16 weight rows round the activations to their own format (RNE)
// and multiply in float. Every target's rounding is bit-exact with the
// platform conversions over a sweep of all sign/exponent/kept-mantissa
// patterns, each with the dropped bits at the rounding edges (zero, one ulp,
// just under half, half, just over half, all ones).
TEST(ActivationRounding, SweepMatchesPlatformConversions) {
  for (const bool f16 : {true, false}) {
    const DType t = f16 ? DType::kF16 : DType::kBF16;
    const int drop = f16 ? 13 : 16;  // float mantissa bits the format drops
    const uint32_t half = 1u << (drop - 1), all = (1u << drop) - 1;
    const uint32_t lows[] = {0, 1, half - 1, half, half + 1, all};
    std::vector<float> x;
    x.reserve((size_t{1} << (32 - drop)) * std::size(lows));
    for (uint32_t hi = 0; hi < (1u << (32 - drop)); ++hi)
      for (uint32_t lo : lows) x.push_back(fp32_from_bits((hi << drop) | lo));
    std::vector<uint16_t> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = f16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
    for (Isa isa : supported_isas()) {
      const FormatKernels& fk = *kernel_set(isa).format(t);
      ASSERT_EQ(fk.act, t) << isa_name(isa);
      std::vector<uint16_t> got(x.size() + 1, 0x5555);
      // An odd length, so the SIMD tail runs too.
      fk.quantize_act(x.data(), got.data(), static_cast<int64_t>(x.size()) - 3);
      for (size_t i = 0; i + 3 < x.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " " << dtype_name(t) << " bits 0x" << std::hex << fp32_to_bits(x[i]);
      ASSERT_EQ(got[x.size() - 3], 0x5555) << "wrote past the row";
    }
  }
}

// F16 / BF16 vec_dot is the float sum of products of the rounded operands:
// against a double sum of the same products (exact: both formats' products
// fit a float) within the float summation bound, on every target.
TEST(ActivationRounding, FloatDotOfRoundedOperands) {
  for (const DType t : {DType::kF16, DType::kBF16}) {
    for (int64_t n : {1, 15, 16, 17, 31, 32, 33, 127, 128, 129, 4096}) {
      const auto wf = normal(n, 7 + static_cast<uint32_t>(n));
      const auto x = normal(n, 8 + static_cast<uint32_t>(n), 3.f);
      std::vector<uint8_t> w(row_bytes(t, n));
      quantize_row(t, wf.data(), w.data(), n);
      const auto wd = dequant(t, w.data(), n);
      double exact = 0, abs_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float xr = t == DType::kF16 ? fp16_to_fp32(fp32_to_fp16(x[i])) : bf16_to_fp32(fp32_to_bf16(x[i]));
        exact += double(wd[i]) * xr;
        abs_sum += std::fabs(double(wd[i]) * xr);
      }
      for (Isa isa : supported_isas()) {
        const FormatKernels& fk = *kernel_set(isa).format(t);
        std::vector<uint8_t> a(row_bytes(fk.act, n));
        fk.quantize_act(x.data(), a.data(), n);
        float got = 0.f;
        fk.vec_dot(n, w.data(), a.data(), &got);
        EXPECT_NEAR(got, exact, 1.01 * n * 0x1p-24 * abs_sum) << isa_name(isa) << " " << dtype_name(t) << " n=" << n;
      }
    }
  }
}

// ---- real files ----------------------------------------------------------------------------

// Every tensor of each quantized file against the same tensor of the F16 file:
// a wrong layout gives errors near 100%; the bounds are what the formats allow.
// Also: our quantizer on the F16 values does about as well as the file's.
double model_bound(DType t) {
  switch (t) {
    case DType::kF16: return 1e-6;
    case DType::kF32: return 1e-3;
    case DType::kBF16: return 6e-3;
    case DType::kQ8_0: return 0.01;
    case DType::kQ6_K: return 0.03;
    case DType::kQ5_K: return 0.06;
    case DType::kQ4_K: return 0.12;
    case DType::kQ4_0: return 0.15;
    case DType::kQ5_0: return 0.06;
    case DType::kQ5_1: return 0.06;
    case DType::kQ4_1: return 0.12;
    case DType::kIQ4_NL: return 0.12;
    case DType::kIQ4_XS: return 0.12;
    case DType::kQ3_K: return 0.25;
    case DType::kQ2_K: return 0.45;
    default: return 0;
  }
}

TEST(QuantModels, DequantizeMatchesF16File) {
  int checked = 0;
  for (std::string family : {"tiny-llama", "tiny-qwen3"}) {
    auto ref = GgufFile::open(test::model_path(family + "-f16.gguf"));
    for (std::string q : {"bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m",
                          "iq4_nl", "iq4_xs"}) {
      auto f = GgufFile::open(test::model_path(family + "-" + q + ".gguf"));
      for (const auto& ti : f->tensors()) {
        if (ti.dims.size() != 2 || kernel_format_index(ti.type) < 0) continue;
        const GgufTensorInfo* rt = ref->find_tensor(ti.name);
        ASSERT_NE(rt, nullptr) << ti.name;
        ASSERT_EQ(rt->n_elements, ti.n_elements);
        std::vector<uint8_t> raw(ti.n_bytes), rraw(rt->n_bytes);
        f->read(ti.file_offset, raw.data(), raw.size());
        ref->read(rt->file_offset, rraw.data(), rraw.size());
        const int64_t n = static_cast<int64_t>(ti.n_elements);
        const auto want = dequant(rt->type, rraw.data(), n);
        const auto got = dequant(ti.type, raw.data(), n);
        const double err = rel_rmse(want, got);
        RecordProperty(family + "-" + q + "." + ti.name, std::to_string(err));
        EXPECT_LE(err, model_bound(ti.type)) << family << "-" << q << " " << ti.name << " " << dtype_name(ti.type);
        // Our quantizer, same format, on the F16 values.
        std::vector<uint8_t> mine(ti.n_bytes);
        const int64_t cols = ti.dims[0], rows = ti.dims[1];
        const uint64_t rb = row_bytes(ti.type, cols);
        for (int64_t r = 0; r < rows; ++r) quantize_row(ti.type, want.data() + r * cols, mine.data() + r * rb, cols);
        const double my_err = rel_rmse(want, dequant(ti.type, mine.data(), n));
        EXPECT_LE(my_err, err * 1.25 + 1e-6) << "our " << dtype_name(ti.type) << " quantizer on " << ti.name;
        // And one matrix-vector product on the real bytes, on every target.
        const auto x = normal(cols, 5);
        std::vector<float> y_ref(rows);
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t c = 0; c < cols; ++c) s += double(got[r * cols + c]) * x[c];
          y_ref[r] = static_cast<float>(s);
        }
        for (Isa isa : supported_isas()) {
          const FormatKernels& fk = *kernel_set(isa).format(ti.type);
          std::vector<uint8_t> a(std::max<uint64_t>(row_bytes(fk.act, cols), 1));
          fk.quantize_act(x.data(), a.data(), cols);
          std::vector<float> y(rows);
          for (int64_t r = 0; r < rows; ++r) fk.vec_dot(cols, raw.data() + r * rb, a.data(), &y[r]);
          EXPECT_LE(rel_rmse(y_ref, y), 0.02) << isa_name(isa) << " " << ti.name << " " << dtype_name(ti.type);
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 50);
}

}  // namespace
}  // namespace ebb
