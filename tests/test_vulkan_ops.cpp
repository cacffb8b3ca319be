// Every Vulkan kernel against a scalar CPU reference (ebb's scalar kernels
// where the arithmetic matches, else double precision), on whatever Vulkan
// device is first (lavapipe in CI). Tolerances are error bounds derived for
// F32 arithmetic with unit roundoff u = 2^-24 and the Vulkan spec's
// precision of exp (3 + 2|x| ulp), division (2.5 ulp) and inversesqrt (2 ulp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::download;
using test::upload;

constexpr double kU = 1.0 / (1 << 24);  // F32 unit roundoff

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- matmul ----

struct MatmulCase {
  DType type;
  int64_t rows, cols, n_tokens;
};

class VulkanMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(VulkanMatmul, MatchesScalarDequantisedProduct) {
  EBB_REQUIRE_VULKAN(be);
  const MatmulCase c = GetParam();
  const int64_t x_stride = c.cols + 8, y_stride = c.rows + 3;  // strided rows, as a batch's views are
  // Weights: quantised with ebb's own quantize_row into GGUF's row layout.
  const uint64_t rb = row_bytes(c.type, c.cols);
  std::vector<uint8_t> w(rb * c.rows);
  const std::vector<float> wf = random_floats(static_cast<size_t>(c.rows * c.cols), 1);
  for (int64_t r = 0; r < c.rows; ++r) quantize_row(c.type, wf.data() + r * c.cols, w.data() + r * rb, c.cols);
  const std::vector<float> x = random_floats(static_cast<size_t>(c.n_tokens * x_stride), 2);

  // The reference: the scalar kernels' dequantisation (the values the GPU
  // must decode the blocks into), products summed in double.
  const FormatKernels* fk = kernel_set(Isa::kScalar).format(c.type);
  ASSERT_NE(fk, nullptr);
  std::vector<float> deq(static_cast<size_t>(c.rows * c.cols));
  for (int64_t r = 0; r < c.rows; ++r) fk->to_float(w.data() + r * rb, deq.data() + r * c.cols, c.cols);

  // The tensors at offsets that are not multiples of the device's
  // minStorageBufferOffsetAlignment, so the shaders' off[] path is used.
  auto wb = upload(*be, w, 36);
  auto xb = upload(*be, x, 20);
  auto yb = be->alloc(4 * (12 + c.n_tokens * y_stride), MemoryPlace::kDevice);
  auto stream = be->new_stream();
  MatmulOp op;
  op.w_type = c.type;
  op.rows = c.rows;
  op.cols = c.cols;
  op.w = {wb.get(), 36};
  op.x = {xb.get(), 20};
  op.x_stride = x_stride;
  op.n_tokens = c.n_tokens;
  op.y = {yb.get(), 48};
  op.y_stride = y_stride;
  stream->matmul(op);
  stream->submit();
  stream->wait();
  const std::vector<float> y = download<float>(*yb, static_cast<size_t>(c.n_tokens * y_stride), 48);

  double err2 = 0, ref2 = 0;
  for (int64_t t = 0; t < c.n_tokens; ++t)
    for (int64_t r = 0; r < c.rows; ++r) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < c.cols; ++k) {
        const double p = static_cast<double>(deq[r * c.cols + k]) * x[t * x_stride + k];
        ref += p;
        mag += std::fabs(p);
      }
      // The shaders decode every block into the F32 values the scalar
      // dequantiser gives: an F16 (BF16) weight widened exactly; a Q8_0,
      // Q4_0 or Q6_K weight an F16 scale times small integers (every product
      // exact in F32); a Q4_K or Q5_K weight (d * sc) * q - dmin * m, the
      // products exact and the one rounded difference the same on both
      // sides, FMA or not. So the only error is the product with x: each
      // product rounds once and any summation order of cols terms adds at
      // most (cols - 1) u |sum of |terms||: |err| <= (cols + 1) u mag.
      const double tol = (c.cols + 1) * kU * mag + 1e-30;
      const double got = y[t * y_stride + r];
      ASSERT_NEAR(got, ref, tol) << dtype_name(c.type) << " row " << r << " token " << t << " of " << c.rows << "x"
                                 << c.cols;
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  // And as llama.cpp's test-backend-ops measures a matrix product: the
  // normalised mean squared error against the reference, whose limit there
  // is 5e-4 for every format (its reference multiplies the dequantised
  // weights too). The bound above is far tighter; this one says the same
  // in the figure that suite prints.
  const double nmse = err2 / std::max(ref2, 1e-30);
  EXPECT_LT(nmse, 5e-4) << dtype_name(c.type);
  RecordProperty("nmse", std::to_string(nmse));
}

INSTANTIATE_TEST_SUITE_P(Formats, VulkanMatmul,
                         ::testing::Values(MatmulCase{DType::kF32, 37, 64, 1}, MatmulCase{DType::kF16, 70, 256, 1},
                                           MatmulCase{DType::kF16, 70, 96, 6}, MatmulCase{DType::kF16, 19, 172, 3},
                                           MatmulCase{DType::kF32, 21, 174, 2}, MatmulCase{DType::kQ8_0, 70, 256, 1},
                                           MatmulCase{DType::kQ8_0, 33, 2112, 5},
                                           MatmulCase{DType::kQ4_0, 70, 256, 1},
                                           MatmulCase{DType::kQ4_0, 65, 2080, 9},
                                           // BF16 and the K-quants: a matrix-vector product (decode) and
                                           // tiled products of 5 and 16 tokens (prefill; not multiples of
                                           // the shader's 4-token tile, and 16 a multiple of it).
                                           MatmulCase{DType::kBF16, 70, 256, 1}, MatmulCase{DType::kBF16, 19, 174, 5},
                                           MatmulCase{DType::kBF16, 33, 96, 16}, MatmulCase{DType::kQ4_K, 70, 256, 1},
                                           MatmulCase{DType::kQ4_K, 33, 768, 5}, MatmulCase{DType::kQ4_K, 17, 512, 16},
                                           MatmulCase{DType::kQ5_K, 70, 256, 1}, MatmulCase{DType::kQ5_K, 33, 768, 5},
                                           MatmulCase{DType::kQ5_K, 17, 512, 16}, MatmulCase{DType::kQ6_K, 70, 256, 1},
                                           MatmulCase{DType::kQ6_K, 33, 768, 5},
                                           MatmulCase{DType::kQ6_K, 17, 512, 16}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.type)) + "_" + std::to_string(info.param.rows) +
                                  "x" + std::to_string(info.param.cols) + "_t" + std::to_string(info.param.n_tokens);
                         });

// ---- RMSNorm ----

class VulkanRmsNorm : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(VulkanRmsNorm, MatchesScalar) {
  EBB_REQUIRE_VULKAN(be);
  const auto [n_rows, n] = GetParam();
  const std::vector<float> x = random_floats(static_cast<size_t>(n_rows * n), 3, -4.0f, 4.0f);
  const std::vector<float> w = random_floats(static_cast<size_t>(n), 4, 0.5f, 1.5f);
  auto xb = upload(*be, x);
  auto wb = upload(*be, w);
  auto yb = be->alloc(4 * n_rows * n, MemoryPlace::kDevice);
  auto s = be->new_stream();
  s->rms_norm({{xb.get(), 0}, {wb.get(), 0}, {yb.get(), 0}, n_rows, n, 1e-5f});
  s->wait();  // submits what was recorded
  const auto y = download<float>(*yb, static_cast<size_t>(n_rows * n));
  const OpsKernels& ref = ops_kernels(Isa::kScalar);
  std::vector<float> want(x);
  for (int64_t r = 0; r < n_rows; ++r) ref.rmsnorm(x.data() + r * n, w.data(), want.data() + r * n, n, 1e-5f);
  for (size_t i = 0; i < want.size(); ++i) {
    // The sum of squares in F32 in any order: relative error <= n u; the
    // scale 1 / sqrt(mean + eps) halves it and adds a few ulps (division,
    // sqrt); the two products two more. The reference sums in double.
    const double tol = (n / 2.0 + 16) * kU * std::fabs(want[i]) + 1e-30;
    ASSERT_NEAR(y[i], want[i], tol) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, VulkanRmsNorm,
                         ::testing::Values(std::pair<int64_t, int64_t>{3, 200},  // n not a multiple of the workgroup
                                           std::pair<int64_t, int64_t>{70000, 8}),  // rows past 65535 (Q/K norms of a long prefill)
                         [](const auto& info) {
                           return "rows" + std::to_string(info.param.first) + "_n" + std::to_string(info.param.second);
                         });

// ---- RoPE ----

class VulkanRope : public ::testing::TestWithParam<std::tuple<RopeStyle, int>> {};

TEST_P(VulkanRope, MatchesScalarBothStyles) {
  EBB_REQUIRE_VULKAN(be);
  const auto [style, rot_dim] = GetParam();
  const int64_t n_tokens = 3, n_heads = 4, head_dim = 64, pos0 = 1000;
  const std::vector<float> x = random_floats(static_cast<size_t>(n_tokens * n_heads * head_dim), 5, -2.0f, 2.0f);
  std::vector<float> cs(static_cast<size_t>(n_tokens * rot_dim));
  for (int64_t t = 0; t < n_tokens; ++t) rope_cos_sin(pos0 + t, rot_dim, 10000.0f, 1.0f, cs.data() + t * rot_dim);
  auto xb = upload(*be, x);
  auto cb = upload(*be, cs);
  auto s = be->new_stream();
  s->rope({{xb.get(), 0}, {cb.get(), 0}, n_tokens, n_heads, head_dim, rot_dim, style});
  s->wait();
  const auto y = download<float>(*xb, x.size());
  std::vector<float> want(x);
  for (int64_t t = 0; t < n_tokens; ++t)
    ops_kernels(Isa::kScalar)
        .rope(want.data() + t * n_heads * head_dim, n_heads, head_dim, rot_dim, cs.data() + t * rot_dim, style);
  for (size_t i = 0; i < want.size(); ++i) {
    if (i % head_dim >= static_cast<size_t>(rot_dim)) {
      ASSERT_EQ(y[i], x[i]) << "dimension past rot_dim changed at " << i;
      continue;
    }
    // x0 c - x1 s: two products and a difference, possibly fused into FMAs
    // on the GPU: |err| <= 3 u (|x0| + |x1|) as |c|, |s| <= 1; 4 u to cover
    // the reference's own rounding.
    ASSERT_NEAR(y[i], want[i], 4 * kU * 4.0) << "element " << i;
  }
  // Rotation changes something: the test is not vacuous.
  EXPECT_NE(y, x);
}

INSTANTIATE_TEST_SUITE_P(Styles, VulkanRope,
                         ::testing::Combine(::testing::Values(RopeStyle::kNorm, RopeStyle::kNeox),
                                            ::testing::Values(64, 32)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == RopeStyle::kNorm ? "norm" : "neox") +
                                  "_rot" + std::to_string(std::get<1>(info.param));
                         });

// ---- attention ----

struct AttnCase {
  int64_t n_q, pos0, n_heads, n_kv_heads, head_dim, chunk_size;
};

class VulkanAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(VulkanAttention, MatchesDoubleReferenceOverChunkTable) {
  EBB_REQUIRE_VULKAN(be);
  const AttnCase c = GetParam();
  const int64_t n_ctx = c.pos0 + c.n_q;
  const int64_t n_chunks = (n_ctx + c.chunk_size - 1) / c.chunk_size;
  const int64_t chunk_halves = c.chunk_size * c.n_kv_heads * c.head_dim;
  // Chunks stored in reverse order with a gap, so the kernel must follow the
  // table: chunk i at slot (n_chunks - 1 - i) of the KV buffers, after a pad.
  const int64_t pad = 2 * c.head_dim;
  std::vector<uint32_t> table(static_cast<size_t>(n_chunks));
  for (int64_t i = 0; i < n_chunks; ++i) table[i] = static_cast<uint32_t>(pad + (n_chunks - 1 - i) * chunk_halves);
  std::vector<uint16_t> k(static_cast<size_t>(pad + n_chunks * chunk_halves)), v(k.size());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& h : k) h = fp32_to_fp16(d(rng));
  for (auto& h : v) h = fp32_to_fp16(d(rng));
  const std::vector<float> q = random_floats(static_cast<size_t>(c.n_q * c.n_heads * c.head_dim), 8);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  auto qb = upload(*be, q);
  auto ob = be->alloc(q.size() * 4, MemoryPlace::kDevice);
  auto kb = upload(*be, k);
  auto vb = upload(*be, v);
  auto tb = upload(*be, table);
  AttentionOp op;
  op.q = {qb.get(), 0};
  op.out = {ob.get(), 0};
  op.k = {kb.get(), 0};
  op.v = {vb.get(), 0};
  op.chunk_offsets = {tb.get(), 0};
  op.n_q = c.n_q;
  op.n_heads = c.n_heads;
  op.n_kv_heads = c.n_kv_heads;
  op.head_dim = c.head_dim;
  op.pos0 = c.pos0;
  op.chunk_size = c.chunk_size;
  op.scale = scale;
  auto s = be->new_stream();
  s->attention(op);
  s->wait();
  const auto out = download<float>(*ob, q.size());

  auto at = [&](const std::vector<uint16_t>& kv, int64_t j, int64_t kvh, int64_t dd) {
    return static_cast<double>(
        fp16_to_fp32(kv[table[j / c.chunk_size] + ((j % c.chunk_size) * c.n_kv_heads + kvh) * c.head_dim + dd]));
  };
  const int64_t group = c.n_heads / c.n_kv_heads;
  for (int64_t i = 0; i < c.n_q; ++i)
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t kvh = h / group, len = c.pos0 + i + 1;
      std::vector<double> sc(static_cast<size_t>(len));
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        double dot = 0;
        for (int64_t dd = 0; dd < c.head_dim; ++dd) dot += q[(i * c.n_heads + h) * c.head_dim + dd] * at(k, j, kvh, dd);
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double l = 0;
      for (auto& e : sc) l += (e = std::exp(e - mx));
      for (int64_t dd = 0; dd < c.head_dim; ++dd) {
        double o = 0;
        for (int64_t j = 0; j < len; ++j) o += sc[j] * at(v, j, kvh, dd);
        o /= l;
        // |q|, |k| <= 1 and scale = 1/sqrt(head_dim): |s| <= sqrt(head_dim)
        // = 8, so e^(s - m) has |s - m| <= 16, an error of at most 3 + 32
        // ulp (Vulkan's exp); each score's F32 dot adds (head_dim + 1) u
        // * 8 absolute, ~3.1e-5 relative in its weight. The output is a
        // convex combination of |v| <= 1, so its error is below twice the
        // largest relative weight error plus the F32 sums' (n_ctx u):
        // 2 * (35 u + 3.1e-5) + n_ctx u < 1e-4.
        ASSERT_NEAR(out[(i * c.n_heads + h) * c.head_dim + dd], o, 1e-4)
            << "query " << i << " head " << h << " dim " << dd;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, VulkanAttention,
                         ::testing::Values(AttnCase{6, 21, 4, 2, 64, 16},    // prefill tail over 2 chunks, GQA 2
                                           AttnCase{1, 150, 4, 1, 64, 32},   // decode: 3 blocks of 64 positions
                                           AttnCase{5, 0, 2, 2, 128, 256},   // first prefill, MHA, head_dim 128
                                           AttnCase{2, 70, 8, 2, 256, 64}),  // head_dim 256, GQA 4
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return "q" + std::to_string(c.n_q) + "_pos" + std::to_string(c.pos0) + "_h" +
                                  std::to_string(c.n_heads) + "_kv" + std::to_string(c.n_kv_heads) + "_d" +
                                  std::to_string(c.head_dim) + "_c" + std::to_string(c.chunk_size);
                         });

// ---- SwiGLU and add ----

TEST(VulkanOps, SwigluMatchesScalar) {
  EBB_REQUIRE_VULKAN(be);
  const int64_t n = 1000;
  const auto g = random_floats(n, 9, -8.0f, 8.0f), u = random_floats(n, 10, -2.0f, 2.0f);
  auto gb = upload(*be, g);
  auto ub = upload(*be, u);
  auto s = be->new_stream();
  s->swiglu({{gb.get(), 0}, {ub.get(), 0}, {gb.get(), 0}, n});  // in place, y aliasing gate
  s->wait();
  const auto y = download<float>(*gb, n);
  std::vector<float> want(n);
  ops_kernels(Isa::kScalar).swiglu(g.data(), u.data(), want.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    // e^-g within 3 + 2|g| ulp, then 1 + e, a division (2.5 ulp) and a
    // product: relative error <= (3 + 2|g| + 5) u, and the reference's own
    // std::exp rounding; 2x margin.
    const double tol = 2 * (8 + 2 * std::fabs(g[i])) * kU * std::fabs(want[i]) + 1e-30;
    ASSERT_NEAR(y[i], want[i], tol) << "element " << i << " gate " << g[i];
  }
}

TEST(VulkanOps, AddIsExact) {
  EBB_REQUIRE_VULKAN(be);
  const int64_t n = 70001;  // 1,094 workgroups and a partial one
  const auto a = random_floats(n, 11), b = random_floats(n, 12);
  auto ab = upload(*be, a);
  auto bb = upload(*be, b);
  auto s = be->new_stream();
  s->add({{ab.get(), 0}, {bb.get(), 0}, n});
  s->wait();
  const auto y = download<float>(*ab, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << "element " << i;  // Vulkan's add is correctly rounded
}

// y += alpha x (a LoRA term's scale): within one rounding of the product
// and one of the sum, whether the driver fuses them or not.
TEST(VulkanOps, ScaledAddWithinTwoRoundings) {
  EBB_REQUIRE_VULKAN(be);
  const int64_t n = 4099;
  const auto a = random_floats(n, 13), b = random_floats(n, 14);
  auto ab = upload(*be, a);
  auto bb = upload(*be, b);
  auto s = be->new_stream();
  for (const float alpha : {-0.7f, 2.5f}) {
    ab->write(0, a.data(), a.size() * sizeof(float));
    AddOp op{{ab.get(), 0}, {bb.get(), 0}, n};
    op.alpha = alpha;
    s->add(op);
    s->wait();
    const auto y = download<float>(*ab, n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = double(a[i]) + double(alpha) * b[i];
      const double tol = 2 * kU * (std::fabs(a[i]) + std::fabs(double(alpha) * b[i])) + 1e-30;
      ASSERT_NEAR(y[i], want, tol) << "element " << i << " alpha " << alpha;
    }
  }
  AddOp bad{{ab.get(), 0}, {bb.get(), 0}, n};
  bad.alpha = std::nanf("");
  EXPECT_THROW(s->add(bad), Error);
}

// ---- the LoRA up-projection with its accumulate (LowRankUpOp) ----

struct LowRankCase {
  DType type;  // B's: F16 or F32
  int64_t n_out, rank, n_tokens, y_pad;  // y_stride = n_out + y_pad
  float alpha;
};

class VulkanLowRankUp : public ::testing::TestWithParam<LowRankCase> {};

// y[r * y_stride + o] += alpha * sum_j B[o][j] t[r][j] against a double
// reference: the padding between y's rows untouched, the sum of rank
// products (each exact in double) within rank roundings, then the scale and
// the add one each; 2x margin.
TEST_P(VulkanLowRankUp, MatchesDoubleReference) {
  EBB_REQUIRE_VULKAN(be);
  const LowRankCase c = GetParam();
  const int64_t t_stride = c.rank + 3, y_stride = c.n_out + c.y_pad;
  std::vector<float> bf = random_floats(static_cast<size_t>(c.n_out * c.rank), 21);
  std::vector<uint16_t> bh(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {  // F16 B: the reference uses the values the device widens
    bh[i] = fp32_to_fp16(bf[i]);
    if (c.type == DType::kF16) bf[i] = fp16_to_fp32(bh[i]);
  }
  const std::vector<float> t = random_floats(static_cast<size_t>(c.n_tokens * t_stride), 22);
  const std::vector<float> y0 = random_floats(static_cast<size_t>(c.n_tokens * y_stride), 23, -4.0f, 4.0f);
  const uint64_t pad = 256;  // every tensor at an offset in its buffer
  auto bb = c.type == DType::kF16 ? upload(*be, bh, pad) : upload(*be, bf, pad);
  auto tb = upload(*be, t, pad);
  auto yb = upload(*be, y0, pad);
  LowRankUpOp op;
  op.b_type = c.type;
  op.n_out = c.n_out;
  op.rank = c.rank;
  op.b = {bb.get(), pad};
  op.t = {tb.get(), pad};
  op.t_stride = t_stride;
  op.n_tokens = c.n_tokens;
  op.y = {yb.get(), pad};
  op.y_stride = y_stride;
  op.alpha = c.alpha;
  auto s = be->new_stream();
  s->low_rank_up(op);
  EXPECT_EQ(s->n_recorded(), 1);  // one dispatch, whatever y's stride
  s->wait();
  const auto y = download<float>(*yb, y0.size(), pad);
  for (int64_t r = 0; r < c.n_tokens; ++r) {
    for (int64_t o = 0; o < y_stride; ++o) {
      const size_t i = static_cast<size_t>(r * y_stride + o);
      if (o >= c.n_out) {
        ASSERT_EQ(y[i], y0[i]) << "padding of row " << r << " at " << o;
        continue;
      }
      double sum = 0, mag = 0;
      for (int64_t j = 0; j < c.rank; ++j) {
        const double p = double(bf[static_cast<size_t>(o * c.rank + j)]) * t[static_cast<size_t>(r * t_stride + j)];
        sum += p;
        mag += std::fabs(p);
      }
      const double want = y0[i] + double(c.alpha) * sum;
      const double tol = 2 * kU * ((c.rank + 2) * std::fabs(double(c.alpha)) * mag + std::fabs(y0[i])) + 1e-30;
      ASSERT_NEAR(y[i], want, tol) << dtype_name(c.type) << " row " << r << " output " << o;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, VulkanLowRankUp,
                         ::testing::Values(LowRankCase{DType::kF32, 100, 8, 1, 0, 1.0f},     // decode, y dense
                                           LowRankCase{DType::kF16, 100, 8, 1, 28, 0.75f},   // y inside wider rows
                                           LowRankCase{DType::kF16, 130, 16, 11, 0, -1.5f},  // two row tiles
                                           LowRankCase{DType::kF32, 65, 64, 9, 37, 2.0f},    // one full slice
                                           LowRankCase{DType::kF16, 70, 70, 3, 5, 0.5f}));   // two slices of t

TEST(VulkanOps, LowRankUpRejectsBadArguments) {
  EBB_REQUIRE_VULKAN(be);
  auto buf = be->alloc(4096, MemoryPlace::kDevice);
  auto s = be->new_stream();
  LowRankUpOp op;
  op.b_type = DType::kF16;
  op.n_out = 16;
  op.rank = 4;
  op.b = op.t = op.y = {buf.get(), 0};
  LowRankUpOp bad = op;
  bad.b_type = DType::kQ8_0;
  EXPECT_THROW(s->low_rank_up(bad), Error);
  bad = op;
  bad.y_stride = 8;  // < n_out
  EXPECT_THROW(s->low_rank_up(bad), Error);
  bad = op;
  bad.n_tokens = 100;  // y's rows past the buffer
  EXPECT_THROW(s->low_rank_up(bad), Error);
  bad = op;
  bad.alpha = std::nanf("");
  EXPECT_THROW(s->low_rank_up(bad), Error);
  EXPECT_EQ(s->n_recorded(), 0);
}

}  // namespace
}  // namespace ebb
