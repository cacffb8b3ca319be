// One Llama-style transformer layer on the Vulkan backend, through its ops
// only (rmsnorm, matmul, rope, kv_store, attention, add, swiglu), recorded
// on one stream and submitted once per step, against the same layer
// composed on the CPU from ebb's scalar kernels (double-precision products
// and attention), and against the same recorded ops run by the CPU backend. A prefill of 7 tokens, then one decode step reading the
// KV the prefill stored, in chunks of 4 positions placed out of order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "platform/fp16.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::download;
using test::upload;

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Dims {
  int64_t d_model = 128, n_heads = 4, n_kv_heads = 2, head_dim = 32, n_ff = 256, chunk = 4, n_chunks = 3;
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
};

// A weight: its quantised bytes and its dequantised values (the reference's).
struct Weight {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
};

Weight make_weight(Backend& be, DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weight w;
  w.rows = rows;
  w.cols = cols;
  const float s = 1.0f / std::sqrt(static_cast<float>(cols));  // keeps activations O(1)
  const auto f = random_floats(static_cast<size_t>(rows * cols), rng, -s * 1.7f, s * 1.7f);
  const uint64_t rb = row_bytes(t, cols);
  w.bytes.resize(rb * rows);
  w.deq.resize(f.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(t, f.data() + r * cols, w.bytes.data() + r * rb, cols);
    kernel_set(Isa::kScalar).format(t)->to_float(w.bytes.data() + r * rb, w.deq.data() + r * cols, cols);
  }
  return w;
}

// y[t] = W x[t], in double, rounded once.
std::vector<float> ref_matmul(const Weight& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(n_tokens * w.rows));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(w.deq[r * w.cols + c]) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(s);
    }
  return y;
}

// The layer's device state on one backend: weights, KV chunks (chunk i at
// slot n_chunks - 1 - i of each buffer) and activations.
struct DeviceLayer {
  Backend& be;
  DType wt;
  Dims d;
  std::unique_ptr<BackendBuffer> wq, wk, wv, wo, wg, wu, wd, attn_norm, ffn_norm, table, k_cache, v_cache;
  std::unique_ptr<BackendBuffer> x, xn, q, k, v, att, g, u, cs;
  std::unique_ptr<BackendStream> stream;
  static constexpr int64_t kMaxT = 7;

  DeviceLayer(Backend& b, DType t, const std::vector<const Weight*>& w, const std::vector<float>& an,
              const std::vector<float>& fn, const std::vector<uint32_t>& tab)
      : be(b), wt(t) {
    std::unique_ptr<BackendBuffer>* dst[] = {&wq, &wk, &wv, &wo, &wg, &wu, &wd};
    for (size_t i = 0; i < 7; ++i) *dst[i] = upload(be, w[i]->bytes);
    attn_norm = upload(be, an);
    ffn_norm = upload(be, fn);
    table = upload(be, tab);
    const int64_t kv_halves = d.n_chunks * d.chunk * d.kv_dim();
    k_cache = be.alloc(2 * kv_halves, MemoryPlace::kDevice);
    v_cache = be.alloc(2 * kv_halves, MemoryPlace::kDevice);
    auto f = [&](int64_t n) { return be.alloc(4 * kMaxT * n, MemoryPlace::kDevice); };
    x = f(d.d_model), xn = f(d.d_model), q = f(d.q_dim()), k = f(d.kv_dim()), v = f(d.kv_dim());
    att = f(d.q_dim()), g = f(d.n_ff), u = f(d.n_ff), cs = f(d.head_dim);
    stream = be.new_stream();
  }

  // One step of T tokens at pos0: the layer as recorded ops, one submission.
  std::vector<float> run(const std::vector<float>& x_in, const std::vector<float>& cos_sin, int64_t pos0, int64_t T,
                         float eps, float scale) {
    x->write(0, x_in.data(), x_in.size() * 4);
    cs->write(0, cos_sin.data(), cos_sin.size() * 4);
    BackendStream& s = *stream;
    auto mm = [&](BackendBuffer* w, int64_t rows, int64_t cols, BackendBuffer* in, BackendBuffer* out) {
      MatmulOp op;
      op.w_type = wt;
      op.rows = rows;
      op.cols = cols;
      op.w = {w, 0};
      op.x = {in, 0};
      op.n_tokens = T;
      op.y = {out, 0};
      s.matmul(op);
    };
    s.rms_norm({{x.get(), 0}, {attn_norm.get(), 0}, {xn.get(), 0}, T, d.d_model, eps});
    mm(wq.get(), d.q_dim(), d.d_model, xn.get(), q.get());
    mm(wk.get(), d.kv_dim(), d.d_model, xn.get(), k.get());
    mm(wv.get(), d.kv_dim(), d.d_model, xn.get(), v.get());
    s.rope({{q.get(), 0}, {cs.get(), 0}, T, d.n_heads, d.head_dim, d.head_dim, RopeStyle::kNorm});
    s.rope({{k.get(), 0}, {cs.get(), 0}, T, d.n_kv_heads, d.head_dim, d.head_dim, RopeStyle::kNorm});
    s.kv_store({{k.get(), 0}, {k_cache.get(), 0}, {table.get(), 0}, T, d.kv_dim(), pos0, d.chunk});
    s.kv_store({{v.get(), 0}, {v_cache.get(), 0}, {table.get(), 0}, T, d.kv_dim(), pos0, d.chunk});
    AttentionOp a;
    a.q = {q.get(), 0};
    a.out = {att.get(), 0};
    a.k = {k_cache.get(), 0};
    a.v = {v_cache.get(), 0};
    a.chunk_offsets = {table.get(), 0};
    a.n_q = T;
    a.n_heads = d.n_heads;
    a.n_kv_heads = d.n_kv_heads;
    a.head_dim = d.head_dim;
    a.pos0 = pos0;
    a.chunk_size = d.chunk;
    a.scale = scale;
    s.attention(a);
    mm(wo.get(), d.d_model, d.q_dim(), att.get(), xn.get());
    s.add({{x.get(), 0}, {xn.get(), 0}, T * d.d_model});
    s.rms_norm({{x.get(), 0}, {ffn_norm.get(), 0}, {xn.get(), 0}, T, d.d_model, eps});
    mm(wg.get(), d.n_ff, d.d_model, xn.get(), g.get());
    mm(wu.get(), d.n_ff, d.d_model, xn.get(), u.get());
    s.swiglu({{g.get(), 0}, {u.get(), 0}, {g.get(), 0}, T * d.n_ff});
    mm(wd.get(), d.d_model, d.n_ff, g.get(), xn.get());
    s.add({{x.get(), 0}, {xn.get(), 0}, T * d.d_model});
    s.submit();
    s.wait();
    return download<float>(*x, static_cast<size_t>(T * d.d_model));
  }
};

// max |a - b| and max |b|.
std::pair<double, double> max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
  }
  return {err, mag};
}

class VulkanLayer : public ::testing::TestWithParam<DType> {};

TEST_P(VulkanLayer, PrefillThenDecodeMatchesCpuComposition) {
  EBB_REQUIRE_VULKAN(be);
  const DType wt = GetParam();
  const Dims d;
  std::mt19937 rng(42);
  Weight wq = make_weight(*be, wt, d.q_dim(), d.d_model, rng), wk = make_weight(*be, wt, d.kv_dim(), d.d_model, rng),
         wv = make_weight(*be, wt, d.kv_dim(), d.d_model, rng), wo = make_weight(*be, wt, d.d_model, d.q_dim(), rng),
         wg = make_weight(*be, wt, d.n_ff, d.d_model, rng), wu = make_weight(*be, wt, d.n_ff, d.d_model, rng),
         wd = make_weight(*be, wt, d.d_model, d.n_ff, rng);
  const auto attn_norm = random_floats(d.d_model, rng, 0.8f, 1.2f), ffn_norm = random_floats(d.d_model, rng, 0.8f, 1.2f);
  const float eps = 1e-5f, rope_base = 10000.0f;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  const int64_t chunk_halves = d.chunk * d.kv_dim();
  std::vector<uint32_t> table(static_cast<size_t>(d.n_chunks));
  for (int64_t i = 0; i < d.n_chunks; ++i) table[i] = static_cast<uint32_t>((d.n_chunks - 1 - i) * chunk_halves);

  // The same layer on the Vulkan device and on the CPU backend (ebb's CPU
  // kernels behind the same interface), and composed by hand below.
  const std::vector<const Weight*> ws = {&wq, &wk, &wv, &wo, &wg, &wu, &wd};
  DeviceLayer gpu(*be, wt, ws, attn_norm, ffn_norm, table);
  auto cpu_be = open_backend("cpu");
  DeviceLayer cpu(*cpu_be, wt, ws, attn_norm, ffn_norm, table);
  std::vector<float> ref_k, ref_v;  // the reference's KV: [positions, kv_dim], F16-rounded
  const OpsKernels& ops = ops_kernels(Isa::kScalar);

  auto step = [&](int64_t pos0, int64_t T) {
    std::vector<float> x = random_floats(static_cast<size_t>(T * d.d_model), rng, -1.0f, 1.0f);
    std::vector<float> cs(static_cast<size_t>(T * d.head_dim));
    for (int64_t t = 0; t < T; ++t) rope_cos_sin(pos0 + t, d.head_dim, rope_base, 1.0f, cs.data() + t * d.head_dim);
    const std::vector<float> got = gpu.run(x, cs, pos0, T, eps, scale);
    const std::vector<float> cpu_got = cpu.run(x, cs, pos0, T, eps, scale);

    // ---- the reference: the same layer from the scalar kernels ----
    std::vector<float> xn(x.size());
    for (int64_t t = 0; t < T; ++t)
      ops.rmsnorm(x.data() + t * d.d_model, attn_norm.data(), xn.data() + t * d.d_model, d.d_model, eps);
    auto q = ref_matmul(wq, xn, T), k = ref_matmul(wk, xn, T), v = ref_matmul(wv, xn, T);
    for (int64_t t = 0; t < T; ++t) {
      ops.rope(q.data() + t * d.q_dim(), d.n_heads, d.head_dim, d.head_dim, cs.data() + t * d.head_dim,
               RopeStyle::kNorm);
      ops.rope(k.data() + t * d.kv_dim(), d.n_kv_heads, d.head_dim, d.head_dim, cs.data() + t * d.head_dim,
               RopeStyle::kNorm);
    }
    for (float& e : k) ref_k.push_back(fp16_to_fp32(fp32_to_fp16(e)));
    for (float& e : v) ref_v.push_back(fp16_to_fp32(fp32_to_fp16(e)));
    std::vector<float> att(q.size());
    const int64_t group = d.n_heads / d.n_kv_heads;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < d.n_heads; ++h) {
        const int64_t len = pos0 + t + 1, kvh = h / group;
        std::vector<double> sc(static_cast<size_t>(len));
        double mx = -INFINITY, l = 0;
        for (int64_t j = 0; j < len; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d.head_dim; ++e)
            dot += static_cast<double>(q[t * d.q_dim() + h * d.head_dim + e]) * ref_k[j * d.kv_dim() + kvh * d.head_dim + e];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto& e : sc) l += (e = std::exp(e - mx));
        for (int64_t e = 0; e < d.head_dim; ++e) {
          double o = 0;
          for (int64_t j = 0; j < len; ++j) o += sc[j] * ref_v[j * d.kv_dim() + kvh * d.head_dim + e];
          att[t * d.q_dim() + h * d.head_dim + e] = static_cast<float>(o / l);
        }
      }
    auto o = ref_matmul(wo, att, T);
    ops.add(x.data(), o.data(), static_cast<int64_t>(x.size()));
    for (int64_t t = 0; t < T; ++t)
      ops.rmsnorm(x.data() + t * d.d_model, ffn_norm.data(), xn.data() + t * d.d_model, d.d_model, eps);
    auto g = ref_matmul(wg, xn, T), u = ref_matmul(wu, xn, T);
    ops.swiglu(g.data(), u.data(), g.data(), static_cast<int64_t>(g.size()));
    auto dn = ref_matmul(wd, g, T);
    ops.add(x.data(), dn.data(), static_cast<int64_t>(x.size()));

    const auto [err, mag] = max_diff(got, x);
    const auto [cpu_err, cpu_mag] = max_diff(got, cpu_got);
    std::printf("%s pos0 %lld tokens %lld: max |vulkan - reference| %.3g, max |vulkan - cpu backend| %.3g, max |x| %.3g\n",
                std::string(dtype_name(wt)).c_str(), static_cast<long long>(pos0), static_cast<long long>(T), err,
                cpu_err, mag);
    // Each op agrees with its reference to ~1e-5 relative or better
    // (test_vulkan_ops); the layer adds them up over ~10 ops. The one place
    // the two may round differently by more is the F16 KV store (half an F16
    // ulp, 2^-12 relative, where a device's F32 -> F16 is not round-to-
    // nearest), carried through attention and Wo into the residual: at most
    // ~2^-12 of |x|. 1e-3 of max |x| covers both with margin and still fails
    // on any wrong index, chunk or format (errors of O(|x|)).
    EXPECT_LT(err, 1e-3 * mag) << "pos0 " << pos0;
    // The CPU backend runs ebb's CPU kernels, which round activations to the
    // weights' pairing format first (matmul.h: F16 for F16 weights, Q8_0 for
    // Q8_0 and Q4_0): F16 rounds each activation by up to 2^-11 relative,
    // Q8_0 by up to 1/254 of its block's largest. Through seven products
    // that leaves the layers within ~1% of |x| (F16 far less).
    EXPECT_LT(cpu_err, (wt == DType::kF16 ? 2e-3 : 2e-2) * mag) << "pos0 " << pos0;
  };
  step(0, DeviceLayer::kMaxT);      // prefill: positions 0..6, chunks 0 and 1
  step(DeviceLayer::kMaxT, 1);      // decode: position 7 (chunk 1's last slot) over the stored KV
  step(DeviceLayer::kMaxT + 1, 2);  // positions 8, 9: into chunk 2
}

INSTANTIATE_TEST_SUITE_P(Formats, VulkanLayer, ::testing::Values(DType::kF16, DType::kQ8_0, DType::kQ4_0),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// kv_store on its own: every element lands at its chunk and slot, rounded
// to F16 as the CPU rounds (to nearest even), or within one F16 ulp.
TEST(VulkanOps, KvStoreWritesChunkSlots) {
  EBB_REQUIRE_VULKAN(be);
  const int64_t row_len = 48, chunk = 4, n_chunks = 3, pos0 = 3, T = 8;
  std::vector<uint32_t> table = {static_cast<uint32_t>(2 * chunk * row_len), 0, static_cast<uint32_t>(chunk * row_len)};
  std::mt19937 rng(3);
  const auto src = random_floats(static_cast<size_t>(T * row_len), rng, -3.0f, 3.0f);
  std::vector<uint16_t> init(static_cast<size_t>(n_chunks * chunk * row_len), 0x7C01);  // NaNs: untouched slots stay so
  auto sb = upload(*be, src);
  auto db = upload(*be, init);
  auto tb = upload(*be, table);
  auto s = be->new_stream();
  s->kv_store({{sb.get(), 0}, {db.get(), 0}, {tb.get(), 0}, T, row_len, pos0, chunk});
  s->wait();
  const auto got = download<uint16_t>(*db, init.size());
  int64_t exact = 0;
  for (int64_t pos = 0; pos < n_chunks * chunk; ++pos)
    for (int64_t i = 0; i < row_len; ++i) {
      const uint16_t h = got[table[pos / chunk] + (pos % chunk) * row_len + i];
      if (pos < pos0 || pos >= pos0 + T) {
        ASSERT_EQ(h, 0x7C01) << "position " << pos << " outside the batch was written";
        continue;
      }
      const uint16_t want = fp32_to_fp16(src[(pos - pos0) * row_len + i]);
      ASSERT_LE(std::abs(static_cast<int>(h) - static_cast<int>(want)), 1) << "position " << pos << " element " << i;
      exact += h == want;
    }
  std::printf("kv_store: %lld of %lld halves rounded as the CPU rounds\n", static_cast<long long>(exact),
              static_cast<long long>(T * row_len));
}

}  // namespace
}  // namespace ebb
