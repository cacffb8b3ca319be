// attention() against naive references, on every supported target, for
// prefill, decode and chunked prefill, F16 and F32 KV, GQA ratios 1-4, 1 and 2
// threads. F32 KV: a double-precision softmax (materialised scores, softmax,
// weighted V). F16 KV: the half-precision semantics of attention.h written out
// literally, position by position (and loosely the double reference too).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_internal.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

// KV of one layer as a chunk table, built from dense [ctx, n_kv, hd] arrays.
// Slots past ctx hold NaN, so reading them would poison the output.
struct ChunkedKv {
  std::vector<std::vector<uint16_t>> k16, v16;
  std::vector<std::vector<float>> k32, v32;
  std::vector<KvChunkRef> refs;
};

ChunkedKv make_chunks(const std::vector<float>& k, const std::vector<float>& v, int64_t ctx, int64_t cs, int64_t n_kv,
                      int64_t hd, DType type) {
  ChunkedKv kv;
  const int64_t row = n_kv * hd, n_chunks = (ctx + cs - 1) / cs;
  for (int64_t c = 0; c < n_chunks; ++c) {
    if (type == DType::kF16) {
      kv.k16.emplace_back(cs * row, uint16_t{0x7e00});  // NaN
      kv.v16.emplace_back(cs * row, uint16_t{0x7e00});
    } else {
      kv.k32.emplace_back(cs * row, NAN);
      kv.v32.emplace_back(cs * row, NAN);
    }
    for (int64_t s = 0; s < cs && c * cs + s < ctx; ++s)
      for (int64_t i = 0; i < row; ++i) {
        const int64_t src = (c * cs + s) * row + i, dst = s * row + i;
        if (type == DType::kF16) {
          kv.k16[c][dst] = fp32_to_fp16(k[src]);
          kv.v16[c][dst] = fp32_to_fp16(v[src]);
        } else {
          kv.k32[c][dst] = k[src];
          kv.v32[c][dst] = v[src];
        }
      }
  }
  for (int64_t c = 0; c < n_chunks; ++c) {
    if (type == DType::kF16)
      kv.refs.push_back({kv.k16[c].data(), kv.v16[c].data()});
    else
      kv.refs.push_back({kv.k32[c].data(), kv.v32[c].data()});
  }
  return kv;
}

struct Case {
  int64_t n_heads = 4, n_kv = 2, hd = 64, pos0 = 0, n_q = 1, cs = 256;
  DType type = DType::kF16;
  float q_range = 1.0f;
  bool f16_acc = true;  // F16 KV: the half-precision arithmetic (else widened to F32)
  std::string name() const {
    return "heads=" + std::to_string(n_heads) + "/" + std::to_string(n_kv) + " hd=" + std::to_string(hd) +
           " pos0=" + std::to_string(pos0) + " n_q=" + std::to_string(n_q) + " cs=" + std::to_string(cs) +
           (type == DType::kF16 ? (f16_acc ? " f16" : " f16-kv-f32-acc") : " f32");
  }
};

struct Data {
  std::vector<float> q, k, v;  // k, v already rounded to the KV type
};

Data make_data(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t ctx = c.pos0 + c.n_q;
  Data x;
  x.q.resize(c.n_q * c.n_heads * c.hd);
  for (auto& e : x.q) e = d(rng) * c.q_range;
  x.k.resize(ctx * c.n_kv * c.hd);
  x.v.resize(ctx * c.n_kv * c.hd);
  for (auto* a : {&x.k, &x.v})
    for (auto& e : *a) {
      e = d(rng);
      if (c.type == DType::kF16) e = fp16_to_fp32(fp32_to_fp16(e));
    }
  return x;
}

std::vector<double> reference(const Case& c, const Data& x, float scale) {
  const int64_t group = c.n_heads / c.n_kv, ctx = c.pos0 + c.n_q;
  std::vector<double> out(c.n_q * c.n_heads * c.hd, 0.0), s(ctx);
  for (int64_t i = 0; i < c.n_q; ++i)
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t g = h / group, n = c.pos0 + i + 1;
      const float* q = &x.q[(i * c.n_heads + h) * c.hd];
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float* k = &x.k[(j * c.n_kv + g) * c.hd];
        double dot = 0;
        for (int64_t e = 0; e < c.hd; ++e) dot += double(q[e]) * k[e];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
      double* o = &out[(i * c.n_heads + h) * c.hd];
      for (int64_t j = 0; j < n; ++j) {
        const float* v = &x.v[(j * c.n_kv + g) * c.hd];
        for (int64_t e = 0; e < c.hd; ++e) o[e] += s[j] / sum * v[e];
      }
    }
  return out;
}

float f16_round(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

// attention.h's F16-KV definition, literally.
std::vector<float> reference_f16(const Case& c, const Data& x, float scale) {
  const int64_t group = c.n_heads / c.n_kv;
  std::vector<float> out(c.n_q * c.n_heads * c.hd), qh(c.hd), acc(c.hd);
  for (int64_t i = 0; i < c.n_q; ++i)
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t g = h / group, n = c.pos0 + i + 1;
      const float* q = &x.q[(i * c.n_heads + h) * c.hd];
      for (int64_t e = 0; e < c.hd; ++e) qh[e] = f16_round(q[e]);
      float m = -INFINITY, l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* k = &x.k[(j * c.n_kv + g) * c.hd];
        const float* v = &x.v[(j * c.n_kv + g) * c.hd];
        float dot = 0.0f;
        for (int64_t e = 0; e < c.hd; ++e) dot += qh[e] * k[e];
        const float sc = dot * scale;
        float ms, vs;
        if (sc > m) {
          ms = std::exp(m - sc);
          m = sc;
          for (int64_t e = 0; e < c.hd; ++e) acc[e] = f16_round(acc[e] * ms);
          vs = 1.0f;
        } else {
          ms = 1.0f;
          vs = std::exp(sc - m);
        }
        for (int64_t e = 0; e < c.hd; ++e) acc[e] = f16_round(acc[e] + v[e] * vs);
        l = l * ms + vs;
      }
      float* o = &out[(i * c.n_heads + h) * c.hd];
      for (int64_t e = 0; e < c.hd; ++e) o[e] = acc[e] / l;
    }
  return out;
}

// got against the F16 reference: max |diff| within a few F16 ulps of the
// output magnitude and a small mean |diff| (a systematic error shows there).
struct HalfDiff {
  double max_rel = 0, mean_rel = 0;  // relative to max |want|
};
HalfDiff half_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double mag = 0, mx = 0, sum = 0;
  for (float w : want) mag = std::max(mag, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return {INFINITY, INFINITY};
    const double d = std::fabs(double(got[i]) - want[i]);
    mx = std::max(mx, d);
    sum += d;
  }
  return {mx / mag, sum / got.size() / mag};
}
constexpr double kHalfMaxRel = 2e-3, kHalfMeanRel = 1e-4;

// The arguments of case c over kv, queries q, output out.
AttentionArgs args_for(const Case& c, const ChunkedKv& kv, const float* q, float* out, float scale, float* scratch) {
  AttentionArgs a;
  a.q = q;
  a.out = out;
  a.n_q = c.n_q;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv;
  a.head_dim = c.hd;
  a.pos0 = c.pos0;
  a.chunks = kv.refs.data();
  a.chunk_size = c.cs;
  a.kv_type = c.type;
  a.f16_accumulator = c.type == DType::kF16 && c.f16_acc;
  a.scale = scale;
  a.scratch = scratch;
  return a;
}

// kk: run these kernels instead of the ones attention() picks for isa.
std::vector<float> run(Isa isa, ThreadPool& pool, const Case& c, const Data& x, float scale, bool in_place = false,
                       const detail::AttnKernels* kk = nullptr) {
  const ChunkedKv kv = make_chunks(x.k, x.v, c.pos0 + c.n_q, c.cs, c.n_kv, c.hd, c.type);
  std::vector<float> scratch(attention_scratch_floats(pool.size(), c.hd, c.cs), NAN);
  std::vector<float> q = x.q, out(q.size(), NAN);
  const AttentionArgs a = args_for(c, kv, q.data(), in_place ? q.data() : out.data(), scale, scratch.data());
  if (kk)
    detail::attention_with(*kk, a, pool);
  else
    attention(isa, a, pool);
  return in_place ? q : out;
}

// Largest |got - want| over all outputs (V is in [-1, 1], so the outputs are
// too and an absolute bound is a relative one).
double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    e = std::max(e, std::fabs(got[i] - want[i]));
  }
  return e;
}

// One pool per size for the whole process. ThreadPool::worker_loop reads the
// job generation when the worker thread first runs, so a run() issued before
// a new worker got scheduled is never seen and the pool deadlocks (found while
// writing these tests; the fix belongs in thread_pool.cpp). Until then, give
// the workers time to start before the first job.
ThreadPool& shared_pool(int n) {
  static ThreadPool* pools[3] = {};
  if (!pools[n]) {
    pools[n] = new ThreadPool({.n_threads = n});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  return *pools[n];
}

class AttentionTest : public ::testing::Test {
 protected:
  ThreadPool& pool1 = shared_pool(1);
  ThreadPool& pool2 = shared_pool(2);

  // Runs c on every supported target with 1 and 2 threads; F16 KV in both
  // arithmetics. tol: the F32 arithmetic's bound against the double reference.
  void check(const Case& c, double tol = 1e-6) {
    const Data x = make_data(c, static_cast<uint32_t>(c.pos0 * 7919 + c.n_q * 131 + c.hd + c.n_heads * 17 + c.cs));
    check_data(c, x, 1.0f / std::sqrt(static_cast<float>(c.hd)), tol);
    if (c.type == DType::kF16 && c.f16_acc) {
      Case widened = c;
      widened.f16_acc = false;
      check_data(widened, x, 1.0f / std::sqrt(static_cast<float>(c.hd)), tol);
    }
  }
  void check_data(const Case& c, const Data& x, float scale, double tol, bool in_place = false) {
    const auto want = reference(c, x, scale);
    if (c.type == DType::kF32 || !c.f16_acc) {
      for (Isa isa : supported_isas())
        for (ThreadPool* pool : {&pool1, &pool2}) {
          const double e = max_err(run(isa, *pool, c, x, scale, in_place), want);
          worst_ = std::max(worst_, e);
          ASSERT_LE(e, tol) << c.name() << " " << isa_name(isa) << " threads=" << pool->size();
        }
#if defined(EBB_ARCH_X86)
      // The AVX-512 target's F32 arithmetic on CPUs that run AVX-512 in halves,
      // whichever CPU this is.
      if (isa_supported(Isa::kAvx512))
        if (const detail::AttnKernels* kk = detail::attn_kernels_avx512_avx2_scores(c.type, c.hd))
          for (ThreadPool* pool : {&pool1, &pool2}) {
            const double e = max_err(run(Isa::kAvx512, *pool, c, x, scale, in_place, kk), want);
            worst_ = std::max(worst_, e);
            ASSERT_LE(e, tol) << c.name() << " avx512 with avx2 scores threads=" << pool->size();
          }
#endif
      return;
    }
    const auto want16 = reference_f16(c, x, scale);
    // Half precision is still close to the exact softmax (a sanity bound on
    // the definition; V is in [-1, 1]).
    const double e_exact = max_err(want16, want);
    worst_half_vs_exact_ = std::max(worst_half_vs_exact_, e_exact);
    ASSERT_LE(e_exact, 2e-2) << c.name();
    for (Isa isa : supported_isas()) {
      std::vector<float> first;
      for (ThreadPool* pool : {&pool1, &pool2}) {
        const auto got = run(isa, *pool, c, x, scale, in_place);
        const HalfDiff d = half_diff(got, want16);
        worst_half_max_ = std::max(worst_half_max_, d.max_rel);
        worst_half_mean_ = std::max(worst_half_mean_, d.mean_rel);
        ASSERT_LE(d.max_rel, kHalfMaxRel) << c.name() << " " << isa_name(isa) << " threads=" << pool->size();
        ASSERT_LE(d.mean_rel, kHalfMeanRel) << c.name() << " " << isa_name(isa) << " threads=" << pool->size();
        // Sequential by definition: the thread count changes nothing.
        if (first.empty())
          first = got;
        else
          ASSERT_TRUE(got == first) << c.name() << " " << isa_name(isa) << ": 1 and 2 threads differ";
      }
    }
  }
  void TearDown() override {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", worst_);
    RecordProperty("worst_abs_error", buf);
    std::snprintf(buf, sizeof buf, "%.3g", worst_half_max_);
    RecordProperty("f16_worst_max_rel", buf);
    std::snprintf(buf, sizeof buf, "%.3g", worst_half_mean_);
    RecordProperty("f16_worst_mean_rel", buf);
    std::snprintf(buf, sizeof buf, "%.3g", worst_half_vs_exact_);
    RecordProperty("f16_ref_vs_exact_abs", buf);
    if (std::getenv("EBB_ATTN_VERBOSE"))
      std::printf("worst: f32 abs %.3g; f16 max rel %.3g, mean rel %.3g; f16 ref vs exact %.3g\n", worst_,
                  worst_half_max_, worst_half_mean_, worst_half_vs_exact_);
  }
  double worst_ = 0, worst_half_max_ = 0, worst_half_mean_ = 0, worst_half_vs_exact_ = 0;
};

const int64_t kChunkSizes[] = {1, 4, 16, 256};
struct Heads {
  int64_t n_heads, n_kv;
};
// GQA ratios 1, 2, 4; the last has one KV head, so 2 threads split the context.
const Heads kHeads[] = {{2, 2}, {4, 2}, {8, 2}, {4, 1}};

TEST_F(AttentionTest, PrefillMatchesReference) {
  for (int64_t cs : kChunkSizes)
    for (Heads h : kHeads)
      for (int64_t hd : {64, 128})
        for (int64_t n_q : {1, 13, 40})
          for (DType t : {DType::kF16, DType::kF32})
            check({.n_heads = h.n_heads, .n_kv = h.n_kv, .hd = hd, .pos0 = 0, .n_q = n_q, .cs = cs, .type = t});
}

TEST_F(AttentionTest, DecodeMatchesReference) {
  for (int64_t cs : kChunkSizes)
    for (Heads h : kHeads)
      for (int64_t hd : {64, 128})
        for (int64_t pos0 : {1, 5, 255, 256, 300, 1000})
          for (DType t : {DType::kF16, DType::kF32})
            check({.n_heads = h.n_heads, .n_kv = h.n_kv, .hd = hd, .pos0 = pos0, .n_q = 1, .cs = cs, .type = t});
}

TEST_F(AttentionTest, ChunkedPrefillMatchesReference) {
  for (int64_t cs : kChunkSizes)
    for (Heads h : kHeads)
      for (int64_t hd : {64, 128})
        for (int64_t pos0 : {3, 37, 300, 700})
          for (DType t : {DType::kF16, DType::kF32})
            check({.n_heads = h.n_heads, .n_kv = h.n_kv, .hd = hd, .pos0 = pos0, .n_q = 5, .cs = cs, .type = t});
}

TEST_F(AttentionTest, RealModelShapes) {
  // Qwen3-0.6B (16/8 heads, 128), Llama-3.2-1B (32/8, 64), a ratio-8 model, MHA.
  const Heads heads[] = {{16, 8}, {32, 8}, {16, 2}, {6, 6}};
  const int64_t hds[] = {128, 64, 128, 64};
  for (int i = 0; i < 4; ++i)
    for (int64_t n_q : {1, 17})
      check({.n_heads = heads[i].n_heads, .n_kv = heads[i].n_kv, .hd = hds[i], .pos0 = 517, .n_q = n_q, .cs = 256});
}

TEST_F(AttentionTest, GroupLargerThanATile) {
  // 32 query heads on one KV head: more rows than one work item holds.
  for (int64_t n_q : {1, 3})
    check({.n_heads = 32, .n_kv = 1, .hd = 64, .pos0 = 600, .n_q = n_q, .cs = 16});
}

TEST_F(AttentionTest, HeadDimNotMultipleOfEight) {
  for (int64_t hd : {4, 20, 36})
    for (DType t : {DType::kF16, DType::kF32})
      check({.n_heads = 4, .n_kv = 2, .hd = hd, .pos0 = 70, .n_q = 9, .cs = 16, .type = t});
}

TEST_F(AttentionTest, HeadDimMultipleOfSixteen) {
  // The AVX-512 kernels' shapes: head_dim with a tail past its last 64 (16,
  // 48, 80) or none (64, 128); blocks of odd lengths (chunk sizes 7 and 13);
  // item rows in groups of 4, 2 and 1 (GQA 1, 2, 3: up to 16, 16 and 15 rows).
  const Heads heads[] = {{6, 6}, {4, 2}, {3, 1}};
  for (int64_t hd : {16, 48, 64, 80, 128})
    for (Heads h : heads)
      for (int64_t cs : {7, 13})
        for (DType t : {DType::kF16, DType::kF32}) {
          const Case c{.n_heads = h.n_heads, .n_kv = h.n_kv, .hd = hd, .cs = cs, .type = t};
          for (auto [pos0, n_q] : {std::pair<int64_t, int64_t>{0, 11}, {37, 1}, {70, 9}}) {
            Case ci = c;
            ci.pos0 = pos0;
            ci.n_q = n_q;
            check(ci);
          }
        }
}

// a and b bit for bit (NaN never appears in these outputs).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(AttentionTest, HeadDimMultipleOfEightNotSixteen) {
  // The AVX-512 target runs the AVX2 kernels for these: the same bits.
  for (int64_t hd : {8, 24, 40})
    for (DType t : {DType::kF16, DType::kF32}) {
      const Case c{.n_heads = 4, .n_kv = 2, .hd = hd, .pos0 = 70, .n_q = 9, .cs = 16, .type = t};
      check(c);
      if (!isa_supported(Isa::kAvx512)) continue;
      for (bool f16_acc : {true, false}) {
        Case ci = c;
        ci.f16_acc = f16_acc;
        const Data x = make_data(ci, 23);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        EXPECT_TRUE(same_bits(run(Isa::kAvx512, pool1, ci, x, scale), run(Isa::kAvx2, pool1, ci, x, scale)))
            << ci.name();
      }
    }
}

TEST_F(AttentionTest, Avx512HalfMatchesAvx2WhenScoresAreExact) {
  // q and K values i / 8 (|i| <= 8): every product and partial sum of a dot is
  // exact in F32, so the scores do not depend on the summation order. The F16
  // arithmetic's output is then decided by seq_weights and pv_seq alone, and
  // AVX-512's are AVX2's lane for lane (same exp, same fma, same roundings).
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const Heads heads[] = {{16, 8}, {6, 6}, {3, 1}};
  for (int64_t hd : {16, 48, 64, 128})
    for (Heads h : heads)
      for (auto [pos0, n_q] : {std::pair<int64_t, int64_t>{0, 13}, {300, 1}, {70, 9}}) {
        const Case c{.n_heads = h.n_heads, .n_kv = h.n_kv, .hd = hd, .pos0 = pos0, .n_q = n_q, .cs = 7};
        Data x = make_data(c, 5);
        std::mt19937 rng(9);
        std::uniform_int_distribution<int> eighths(-8, 8);
        for (auto* a : {&x.q, &x.k})
          for (auto& e : *a) e = eighths(rng) / 8.0f;
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        check_data(c, x, scale, 1e-6);
        for (ThreadPool* pool : {&pool1, &pool2})
          ASSERT_TRUE(same_bits(run(Isa::kAvx512, *pool, c, x, scale), run(Isa::kAvx2, *pool, c, x, scale)))
              << c.name() << " threads=" << pool->size();
      }
}

#if defined(EBB_ARCH_X86)
TEST(AttentionKernels, Avx512ScoresSumInTheReferenceEnginesOrder) {
  // attention_avx512.cpp sums an F16 dot as the reference engine does
  // (attention_ref_engine.cpp); with head_dim a multiple of 64 nothing is
  // left over for its double-precision tail, so the scores are its scores
  // bit for bit, whichever rows and positions a call groups together.
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t hd : {64, 128, 192}) {
    const int64_t stride = 3 * hd;  // one KV head of 3
    std::vector<uint16_t> k(40 * stride);
    for (auto& e : k) e = fp32_to_fp16(d(rng));
    std::vector<float> q(16 * hd);
    for (auto& e : q) e = f16_round(d(rng));
    for (int nr : {1, 2, 3, 4, 7, 16})
      for (int np : {1, 2, 3, 5, 16, 37}) {
        std::vector<float> got(16 * 64, NAN), want(16 * 64, NAN);
        detail::attn_kernels_avx512(DType::kF16, hd)->qk(q.data(), nr, k.data(), stride, np, hd, got.data(), 64);
        detail::attn_kernels_ref_engine(DType::kF16).qk(q.data(), nr, k.data(), stride, np, hd, want.data(), 64);
        for (int r = 0; r < nr; ++r)
          for (int j = 0; j < np; ++j)
            ASSERT_EQ(fp32_to_bits(got[r * 64 + j]), fp32_to_bits(want[r * 64 + j]))
                << "hd=" << hd << " nr=" << nr << " np=" << np << " row " << r << " position " << j;
      }
  }
}
#endif

TEST(AttentionKernels, Avx512InHalvesOnlyOnAmdFamily19hWithAvx512) {
  EXPECT_TRUE(detail::avx512_in_halves_for(true, 0x19, true));    // Zen 4
  EXPECT_FALSE(detail::avx512_in_halves_for(true, 0x19, false));  // Zen 3: no AVX-512 at all
  EXPECT_FALSE(detail::avx512_in_halves_for(true, 0x1A, true));   // Zen 5: full-width units
  EXPECT_FALSE(detail::avx512_in_halves_for(false, 0x19, true));
  EXPECT_FALSE(detail::avx512_in_halves_for(false, 6, true));
}

#if defined(EBB_ARCH_X86)
TEST_F(AttentionTest, Avx512TargetTakesAvx2ScoresWhereAvx512RunsInHalves) {
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  // A prefill and a decode, F16 KV in both arithmetics and F32 KV: the
  // AVX-512 target gives exactly what its table for this CPU gives: AVX2's
  // scores in the F32 arithmetic where AVX-512 runs in halves, its own
  // otherwise and always in the half-precision arithmetic (whose scores are
  // the reference engine's).
  for (int64_t n_q : {8, 1})
    for (DType t : {DType::kF16, DType::kF32})
      for (bool f16_acc : {true, false}) {
        if (t == DType::kF32 && f16_acc) continue;
        const Case c{.n_heads = 16, .n_kv = 8, .hd = 128, .pos0 = 700, .n_q = n_q, .type = t, .f16_acc = f16_acc};
        const Data x = make_data(c, 23);
        const float scale = 1.0f / std::sqrt(128.0f);
        const bool half = t == DType::kF16 && f16_acc;
        const detail::AttnKernels* want = !half && avx512_in_halves()
                                              ? detail::attn_kernels_avx512_avx2_scores(t, c.hd)
                                              : detail::attn_kernels_avx512(t, c.hd);
        ASSERT_NE(want, nullptr);
        for (ThreadPool* pool : {&pool1, &pool2})
          EXPECT_TRUE(same_bits(run(Isa::kAvx512, *pool, c, x, scale), run(Isa::kAvx512, *pool, c, x, scale, false, want)))
              << c.name() << " threads=" << pool->size();
      }
}
#endif

TEST_F(AttentionTest, LargeScoresStayFinite) {
  // Scores of several hundred: without the running max e^s would overflow.
  for (DType t : {DType::kF16, DType::kF32})
    check({.n_heads = 4, .n_kv = 2, .hd = 64, .pos0 = 400, .n_q = 8, .cs = 16, .type = t, .q_range = 300.0f}, 2e-5);
}

TEST_F(AttentionTest, OutMayAliasQ) {
  for (DType t : {DType::kF16, DType::kF32}) {
    const Case c{.n_heads = 8, .n_kv = 2, .hd = 64, .pos0 = 100, .n_q = 20, .cs = 16, .type = t};
    check_data(c, make_data(c, 7), 0.125f, 1e-6, /*in_place=*/true);
  }
}

TEST_F(AttentionTest, FewKvHeadsDecodeF16) {
  // One KV head and 2 threads: F16 KV spreads the query heads over the threads
  // (it never splits the context), down to one head per item.
  for (int64_t n_heads : {1, 2, 3, 16})
    for (int64_t pos0 : {0, 700})
      check({.n_heads = n_heads, .n_kv = 1, .hd = 128, .pos0 = pos0, .n_q = 1, .cs = 64});
}

TEST_F(AttentionTest, HalfAccumulatorSemantics) {
  // q = 0: every score is 0, so every position weighs 1 and l = 16. V column
  // 0 is 1 then 15 x 2^-12: an F16 accumulator at 1 (ulp 2^-10) drops every
  // 2^-12, so out = 1/16 exactly; F32 keeps them: (1 + 15 / 4096) / 16.
  // Column 1 is 2^-12 then 15 x 1 (the small value is held first, then lost).
  for (DType t : {DType::kF16, DType::kF32}) {
    const Case c{.n_heads = 2, .n_kv = 1, .hd = 8, .pos0 = 15, .n_q = 1, .cs = 4, .type = t};
    Data x;
    x.q.assign(c.n_heads * c.hd, 0.0f);
    x.k.assign(16 * c.hd, 0.5f);
    x.v.assign(16 * c.hd, 0.0f);
    for (int j = 0; j < 16; ++j) {
      x.v[j * c.hd + 0] = j == 0 ? 1.0f : 0x1p-12f;
      x.v[j * c.hd + 1] = j == 0 ? 0x1p-12f : 1.0f;
    }
    for (Isa isa : supported_isas()) {
      const auto got = run(isa, pool1, c, x, 1.0f);
      for (int h = 0; h < 2; ++h) {
        if (t == DType::kF16) {
          EXPECT_EQ(got[h * c.hd + 0], 1.0f / 16) << isa_name(isa);
          EXPECT_EQ(got[h * c.hd + 1], 15.0f / 16) << isa_name(isa);  // 2^-12 + 1 rounds to 1, then + 14
        } else {
          EXPECT_FLOAT_EQ(got[h * c.hd + 0], (1.0f + 15 * 0x1p-12f) / 16) << isa_name(isa);
          EXPECT_FLOAT_EQ(got[h * c.hd + 1], (15.0f + 0x1p-12f) / 16) << isa_name(isa);
        }
        EXPECT_EQ(got[h * c.hd + 2], 0.0f) << isa_name(isa);
      }
    }
  }
}

TEST_F(AttentionTest, HalfRescalesOnNewMax) {
  // Rising scores: every position is a new max, so the accumulator is rescaled
  // (and rounded) at each; then falling ones. Against the literal reference.
  const Case c{.n_heads = 2, .n_kv = 1, .hd = 16, .pos0 = 99, .n_q = 1, .cs = 16, .type = DType::kF16};
  Data x = make_data(c, 5);
  for (int64_t j = 0; j < 100; ++j)
    for (int64_t e = 0; e < c.hd; ++e) x.k[j * c.hd + e] = f16_round(0.01f * (j < 60 ? j : 120 - j));
  check_data(c, x, 0.25f, 0);
}

TEST_F(AttentionTest, ChunkSizeDoesNotChangeResult) {
  // Chunk sizes 3, 4 and 7 cut the blocks short at different places, so a
  // score is computed by other paths of the qk kernels (4, 2 or 1 rows; a
  // group of positions or one alone) than with 256; GQA 4, 2 and 3 give row
  // groups of every kind. F16 KV must not see the difference at all.
  const Heads heads[] = {{8, 2}, {4, 2}, {3, 1}};
  for (Heads h : heads)
    for (DType t : {DType::kF16, DType::kF32})
      for (int64_t pos0 : {0, 300, 1000})
        for (int64_t n_q : {1, 40}) {
          Case c{.n_heads = h.n_heads, .n_kv = h.n_kv, .hd = 128, .pos0 = pos0, .n_q = n_q, .type = t};
          const Data x = make_data(c, 11);
          for (Isa isa : supported_isas())
            for (ThreadPool* pool : {&pool1, &pool2}) {
              const float scale = 1.0f / std::sqrt(128.0f);
              c.cs = 256;
              const auto b = run(isa, *pool, c, x, scale);
              double mag = 0;
              for (float e : b) mag = std::max(mag, double(std::fabs(e)));
              // F16 KV is position-sequential by definition: identical.
              const double tol = t == DType::kF16 ? 0.0 : 1e-6 * mag;
              // F32 sums more roundings with more, shorter blocks: its bound
              // holds for chunks of 4 (the scalar target measured 1.07e-6 of the
              // magnitude with chunks of 3).
              for (int64_t cs : {3, 4, 7}) {
                if (t == DType::kF32 && cs != 4) continue;
                c.cs = cs;
                const auto a = run(isa, *pool, c, x, scale);
                for (size_t i = 0; i < a.size(); ++i)
                  ASSERT_LE(std::fabs(a[i] - b[i]), tol)
                      << c.name() << " " << isa_name(isa) << " threads=" << pool->size() << " at " << i;
              }
            }
        }
}

// One call of a batch: its KV, query and output, kept alive together.
struct BatchCall {
  Case c;
  Data x;
  ChunkedKv kv;
  std::vector<float> out;
  AttentionArgs args(float* scratch) {
    return args_for(c, kv, x.q.data(), out.data(), 1.0f / std::sqrt(static_cast<float>(c.hd)), scratch);
  }
};

std::vector<BatchCall> batch_calls(const std::vector<Case>& cases) {
  std::vector<BatchCall> calls;
  uint32_t seed = 900;
  for (const Case& c : cases) {
    BatchCall b{c, make_data(c, seed++), {}, {}};
    b.kv = make_chunks(b.x.k, b.x.v, c.pos0 + c.n_q, c.cs, c.n_kv, c.hd, c.type);
    b.out.assign(b.x.q.size(), NAN);
    calls.push_back(std::move(b));
  }
  return calls;
}

// Runs attention_batch over calls[idx...] (one scratch for all, as a step's
// calls share one) and returns each call's output.
std::vector<std::vector<float>> run_batch(Isa isa, ThreadPool& pool, std::vector<BatchCall>& calls,
                                          const std::vector<size_t>& idx) {
  std::vector<float> scratch(attention_scratch_floats(pool.size(), 128, 256), NAN);
  std::vector<AttentionArgs> args;
  for (size_t i : idx) {
    calls[i].out.assign(calls[i].out.size(), NAN);
    args.push_back(calls[i].args(scratch.data()));
  }
  attention_batch(isa, args, pool);
  std::vector<std::vector<float>> outs;
  for (size_t i : idx) outs.push_back(calls[i].out);
  return outs;
}

// The calls of one step in one batch: a lone call is attention() exactly; in
// a batch, calls that are not decode rows compute as attention() does, bit
// for bit, and each decode row (swept whole) stays within the F32 bound of
// the exact softmax and does not depend on the other calls or the thread
// count.
TEST_F(AttentionTest, BatchOfCallsMatchesEachCall) {
  const std::vector<Case> cases = {
      {.n_heads = 8, .n_kv = 2, .hd = 128, .pos0 = 40, .n_q = 1, .cs = 16, .type = DType::kF16, .f16_acc = false},
      {.n_heads = 8, .n_kv = 2, .hd = 128, .pos0 = 700, .n_q = 1, .cs = 256, .type = DType::kF16, .f16_acc = false},
      {.n_heads = 4, .n_kv = 2, .hd = 128, .pos0 = 20, .n_q = 13, .cs = 16, .type = DType::kF16, .f16_acc = false},
      {.n_heads = 4, .n_kv = 1, .hd = 128, .pos0 = 300, .n_q = 1, .cs = 4, .type = DType::kF32},
      {.n_heads = 4, .n_kv = 2, .hd = 128, .pos0 = 90, .n_q = 1, .cs = 16, .type = DType::kF16, .f16_acc = true},
  };
  std::vector<BatchCall> calls = batch_calls(cases);
  const auto decode_row = [&](size_t i) { return cases[i].n_q == 1 && !(cases[i].type == DType::kF16 && cases[i].f16_acc); };
  for (Isa isa : supported_isas()) {
    std::vector<std::vector<float>> first;  // all five, one thread
    for (ThreadPool* pool : {&pool1, &pool2}) {
      const std::string at = std::string(isa_name(isa)) + " threads=" + std::to_string(pool->size());
      // Alone: attention() itself.
      for (size_t i = 0; i < calls.size(); ++i) {
        const auto alone = run_batch(isa, *pool, calls, {i})[0];
        const auto want = run(isa, *pool, cases[i], calls[i].x, 1.0f / std::sqrt(static_cast<float>(cases[i].hd)));
        ASSERT_TRUE(same_bits(alone, want)) << cases[i].name() << " alone " << at;
      }
      const auto all = run_batch(isa, *pool, calls, {0, 1, 2, 3, 4});
      const auto some = run_batch(isa, *pool, calls, {4, 1, 2});
      for (size_t i = 0; i < calls.size(); ++i) {
        const float scale = 1.0f / std::sqrt(static_cast<float>(cases[i].hd));
        if (decode_row(i)) {
          EXPECT_LE(max_err(all[i], reference(cases[i], calls[i].x, scale)), 1e-6) << cases[i].name() << " " << at;
        } else {
          EXPECT_TRUE(same_bits(all[i], run(isa, *pool, cases[i], calls[i].x, scale)))
              << cases[i].name() << " in a batch " << at;
        }
      }
      // The other calls of the batch change nothing.
      EXPECT_TRUE(same_bits(some[1], all[1]) && same_bits(some[0], all[4]) && same_bits(some[2], all[2])) << at;
      // Neither does the thread count.
      if (first.empty()) {
        first = all;
      } else {
        for (size_t i = 0; i < calls.size(); ++i)
          if (decode_row(i)) EXPECT_TRUE(same_bits(all[i], first[i])) << cases[i].name() << " " << at;
      }
    }
  }
}

TEST_F(AttentionTest, ScratchDoesNotGrowWithContextOrQueries) {
  EXPECT_EQ(attention_scratch_floats(2, 128, 256), 2 * attention_scratch_floats(1, 128, 256));
  EXPECT_EQ(attention_scratch_floats(1, 128, 4), attention_scratch_floats(1, 128, 256));
}

}  // namespace
}  // namespace ebb
