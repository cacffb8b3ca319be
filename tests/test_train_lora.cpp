// The LoRA backward (TrainOpsKernels::lora_backward) and the gradient
// through a frozen weight (matmul_t), kernels/train_ops.h:
//  - lora_backward on every supported target against the scalar reference,
//    within a tolerance relative to the sum of the magnitudes of the terms;
//  - the scalar reference against its definition in double (dt too) and
//    against central finite differences of L = Σ dy · s·B(A x) in double;
//  - matmul_t on real tensors of the shared model files (every format they
//    hold, plain and packed) and on quantized random rows of odd widths,
//    every target, against a double product of the dequantized weight.
// Accumulating outputs start from random values, which must be kept.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cctype>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/packing.h"
#include "kernels/quantize.h"
#include "kernels/train_lora_internal.h"
#include "kernels/train_ops.h"
#include "model/gguf.h"
#include "platform/thread_pool.h"
#include "support.h"

namespace ebb {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kGuard = 12345.0f;

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

std::string param_name(const ::testing::TestParamInfo<Isa>& info) {
  std::string s(isa_name(info.param));
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// Pools shared by the tests. As in test_matmul.cpp: a run() issued before a
// worker thread has started can be missed, so the workers get time to start.
ThreadPool& test_pool(int threads) {
  static std::map<int, ThreadPool*> pools;
  ThreadPool*& p = pools[threads];
  if (!p) {
    p = new ThreadPool(ThreadPoolOptions{threads, 1000});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return *p;
}

// ---- lora_backward --------------------------------------------------------------------

using LoraBackwardFn = decltype(&detail::lora_backward_scalar);

LoraBackwardFn lora_backward_of(Isa isa) {
  switch (isa) {
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2: return detail::lora_backward_avx2;
    case Isa::kAvx512: return detail::lora_backward_avx512;
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: return detail::lora_backward_neon;
#endif
    default: return detail::lora_backward_scalar;
  }
}

struct LoraShape {
  int64_t T, r, n_in, n_out;
  float s;
  std::string str() const {
    return "T=" + std::to_string(T) + " r=" + std::to_string(r) + " n_in=" + std::to_string(n_in) +
           " n_out=" + std::to_string(n_out) + " s=" + std::to_string(s);
  }
};

// Tails of every vector width and block of rows; n_out past one chunk of
// dt's dot products (r = 64: 512 columns, r = 8: 4096).
const LoraShape kLoraShapes[] = {
    {1, 1, 1, 1, 0.5f},       {1, 4, 7, 17, -1.75f},     {3, 5, 33, 100, 0.5f},    {37, 8, 260, 1000, 2.0f},
    {37, 64, 33, 1000, 0.5f}, {3, 8, 7, 5000, -0.25f},   {37, 5, 96, 33, 1.0f},    {2, 16, 1000, 7, 0.5f},
    {37, 1, 260, 260, -1.0f}, {6, 6, 64, 64, 0.75f},     {13, 64, 257, 129, 0.5f}, {7, 13, 17, 31, 1.5f},
};

// The inputs (t = A x, as the forward saved it) and the starting values of
// the accumulated gradients.
struct LoraData {
  std::vector<float> x, t, dy, a, bt, da0, dbt0, dx0;
};
LoraData lora_data(const LoraShape& sh, uint32_t seed) {
  LoraData d;
  d.x = uniform(sh.T * sh.n_in, -2, 2, seed);
  d.dy = uniform(sh.T * sh.n_out, -1, 1, seed + 1);
  d.a = uniform(sh.r * sh.n_in, -0.5f, 0.5f, seed + 2);
  d.bt = uniform(sh.r * sh.n_out, -1, 1, seed + 3);
  d.da0 = uniform(sh.r * sh.n_in, -1, 1, seed + 4);
  d.dbt0 = uniform(sh.r * sh.n_out, -1, 1, seed + 5);
  d.dx0 = uniform(sh.T * sh.n_in, -1, 1, seed + 6);
  d.t.resize(sh.T * sh.r);
  for (int64_t i = 0; i < sh.T; ++i)
    for (int64_t j = 0; j < sh.r; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < sh.n_in; ++k) acc += double(d.a[j * sh.n_in + k]) * d.x[i * sh.n_in + k];
      d.t[i * sh.r + j] = static_cast<float>(acc);
    }
  return d;
}

struct LoraGrads {
  std::vector<float> da, dbt, dt, dx;
};
LoraGrads run_lora(LoraBackwardFn fn, const LoraShape& sh, const LoraData& d, bool want_dx = true) {
  LoraGrads g{d.da0, d.dbt0, std::vector<float>(sh.T * sh.r, kNaN), d.dx0};
  fn(d.x.data(), d.t.data(), d.dy.data(), d.a.data(), d.bt.data(), sh.s, sh.T, sh.r, sh.n_in, sh.n_out, g.da.data(),
     g.dbt.data(), g.dt.data(), want_dx ? g.dx.data() : nullptr);
  return g;
}

// The gradients in double from their definitions (dt from dy and bt, da and
// dx from that dt), and for each element the sum of the magnitudes of its
// terms (the scale of its rounding errors; for da and dx with the error dt
// carries in). Starting values included.
struct LoraRef {
  std::vector<double> da, dbt, dt, dx;
  std::vector<double> m_da, m_dbt, m_dt, m_dx;
};
LoraRef lora_ref(const LoraShape& sh, const LoraData& d) {
  const int64_t T = sh.T, r = sh.r, n_in = sh.n_in, n_out = sh.n_out;
  const double s = sh.s, as = std::fabs(s);
  LoraRef f;
  f.dbt.assign(d.dbt0.begin(), d.dbt0.end());
  f.m_dbt.resize(r * n_out);
  for (int64_t j = 0; j < r; ++j)
    for (int64_t c = 0; c < n_out; ++c) {
      double acc = 0, mag = 0;
      for (int64_t i = 0; i < T; ++i) {
        const double p = double(d.t[i * r + j]) * d.dy[i * n_out + c];
        acc += p;
        mag += std::fabs(p);
      }
      f.dbt[j * n_out + c] += s * acc;
      f.m_dbt[j * n_out + c] = std::fabs(d.dbt0[j * n_out + c]) + as * mag;
    }
  f.dt.resize(T * r);
  f.m_dt.resize(T * r);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < r; ++j) {
      double acc = 0, mag = 0;
      for (int64_t c = 0; c < n_out; ++c) {
        const double p = double(d.dy[i * n_out + c]) * d.bt[j * n_out + c];
        acc += p;
        mag += std::fabs(p);
      }
      f.dt[i * r + j] = s * acc;
      f.m_dt[i * r + j] = as * mag;
    }
  f.da.assign(d.da0.begin(), d.da0.end());
  f.m_da.resize(r * n_in);
  for (int64_t j = 0; j < r; ++j)
    for (int64_t k = 0; k < n_in; ++k) {
      double acc = 0, mag = 0;
      for (int64_t i = 0; i < T; ++i) {
        acc += f.dt[i * r + j] * d.x[i * n_in + k];
        mag += (std::fabs(f.dt[i * r + j]) + f.m_dt[i * r + j]) * std::fabs(d.x[i * n_in + k]);
      }
      f.da[j * n_in + k] += acc;
      f.m_da[j * n_in + k] = std::fabs(d.da0[j * n_in + k]) + mag;
    }
  f.dx.assign(d.dx0.begin(), d.dx0.end());
  f.m_dx.resize(T * n_in);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t k = 0; k < n_in; ++k) {
      double acc = 0, mag = 0;
      for (int64_t j = 0; j < r; ++j) {
        acc += f.dt[i * r + j] * d.a[j * n_in + k];
        mag += (std::fabs(f.dt[i * r + j]) + f.m_dt[i * r + j]) * std::fabs(d.a[j * n_in + k]);
      }
      f.dx[i * n_in + k] += acc;
      f.m_dx[i * n_in + k] = std::fabs(d.dx0[i * n_in + k]) + mag;
    }
  return f;
}

// |got - want| <= tol · mag element by element.
template <class W>
void expect_close(const std::vector<float>& got, const std::vector<W>& want, const std::vector<double>& mag, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t e = 0; e < got.size(); ++e)
    ASSERT_LE(std::fabs(double(got[e]) - double(want[e])), tol * mag[e] + 1e-30)
        << what << " at " << e << ": " << got[e] << " vs " << want[e] << " (magnitude " << mag[e] << ")";
}

class TrainLoraTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    isa_ = GetParam();
    if (!isa_supported(isa_)) GTEST_SKIP() << isa_name(isa_) << " not supported on this machine";
  }
  std::string tag(const std::string& s) const { return std::string(isa_name(isa_)) + " " + s; }
  Isa isa_ = Isa::kScalar;
};

TEST_P(TrainLoraTest, TableHoldsTheTargetsKernel) {
  EXPECT_EQ(train_ops_kernels(isa_).lora_backward, lora_backward_of(isa_));
}

TEST_P(TrainLoraTest, LoraBackwardMatchesScalar) {
  uint32_t seed = 1000;
  for (const LoraShape& sh : kLoraShapes) {
    const LoraData d = lora_data(sh, seed += 10);
    const LoraRef f = lora_ref(sh, d);  // for the magnitudes
    const LoraGrads want = run_lora(detail::lora_backward_scalar, sh, d);
    const LoraGrads got = run_lora(lora_backward_of(isa_), sh, d);
    expect_close(got.dt, want.dt, f.m_dt, 1e-5, tag(sh.str() + " dt"));
    expect_close(got.dbt, want.dbt, f.m_dbt, 1e-5, tag(sh.str() + " dbt"));
    expect_close(got.da, want.da, f.m_da, 1e-5, tag(sh.str() + " da"));
    expect_close(got.dx, want.dx, f.m_dx, 1e-5, tag(sh.str() + " dx"));
  }
}

// dx == nullptr: the other gradients are the same bits, and dx is not touched.
TEST_P(TrainLoraTest, LoraBackwardWithoutDx) {
  const LoraShape sh{5, 8, 100, 77, 0.5f};
  const LoraData d = lora_data(sh, 77);
  const LoraGrads with = run_lora(lora_backward_of(isa_), sh, d, true);
  const LoraGrads without = run_lora(lora_backward_of(isa_), sh, d, false);
  EXPECT_EQ(std::memcmp(with.da.data(), without.da.data(), with.da.size() * 4), 0);
  EXPECT_EQ(std::memcmp(with.dbt.data(), without.dbt.data(), with.dbt.size() * 4), 0);
  EXPECT_EQ(std::memcmp(with.dt.data(), without.dt.data(), with.dt.size() * 4), 0);
  EXPECT_EQ(std::memcmp(without.dx.data(), d.dx0.data(), d.dx0.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(All, TrainLoraTest, ::testing::ValuesIn(supported_isas()), param_name);

TEST(TrainLoraScalar, MatchesDefinitionInDouble) {
  uint32_t seed = 2000;
  for (const LoraShape& sh : kLoraShapes) {
    const LoraData d = lora_data(sh, seed += 10);
    const LoraRef f = lora_ref(sh, d);
    const LoraGrads g = run_lora(detail::lora_backward_scalar, sh, d);
    expect_close(g.dt, f.dt, f.m_dt, 4e-6, sh.str() + " dt");
    expect_close(g.dbt, f.dbt, f.m_dbt, 4e-6, sh.str() + " dbt");
    expect_close(g.da, f.da, f.m_da, 4e-6, sh.str() + " da");
    expect_close(g.dx, f.dx, f.m_dx, 4e-6, sh.str() + " dx");
  }
}

// L = s Σ_i Σ_j (Σ_c dy[i, c] bt[j, c]) (Σ_k a[j, k] x[i, k]) in double:
// linear in each of x, a and bt, so a central difference is exact but for
// double rounding.
double lora_loss(const LoraShape& sh, const std::vector<double>& x, const std::vector<double>& a,
                 const std::vector<double>& bt, const std::vector<float>& dy) {
  double L = 0;
  for (int64_t i = 0; i < sh.T; ++i)
    for (int64_t j = 0; j < sh.r; ++j) {
      double u = 0, t = 0;
      for (int64_t c = 0; c < sh.n_out; ++c) u += double(dy[i * sh.n_out + c]) * bt[j * sh.n_out + c];
      for (int64_t k = 0; k < sh.n_in; ++k) t += a[j * sh.n_in + k] * x[i * sh.n_in + k];
      L += u * t;
    }
  return sh.s * L;
}

TEST(TrainLoraScalar, MatchesFiniteDifferences) {
  for (const LoraShape& sh : {LoraShape{3, 5, 33, 17, 0.5f}, LoraShape{4, 2, 9, 40, -1.25f}}) {
    LoraData d = lora_data(sh, 3000);
    std::fill(d.da0.begin(), d.da0.end(), 0.0f);  // the gradients alone
    std::fill(d.dbt0.begin(), d.dbt0.end(), 0.0f);
    std::fill(d.dx0.begin(), d.dx0.end(), 0.0f);
    const LoraGrads g = run_lora(detail::lora_backward_scalar, sh, d);
    std::vector<double> x(d.x.begin(), d.x.end()), a(d.a.begin(), d.a.end()), bt(d.bt.begin(), d.bt.end());
    const double h = 1e-3;
    // dL/dv[e] for every element of v (x, a or bt), against the kernel's.
    auto check = [&](std::vector<double>& v, const std::vector<float>& grad, const char* name) {
      double scale = 0;
      for (float e : grad) scale = std::max(scale, double(std::fabs(e)));
      for (size_t e = 0; e < v.size(); ++e) {
        const double v0 = v[e];
        v[e] = v0 + h;
        const double lp = lora_loss(sh, x, a, bt, d.dy);
        v[e] = v0 - h;
        const double lm = lora_loss(sh, x, a, bt, d.dy);
        v[e] = v0;
        const double fd = (lp - lm) / (2 * h);
        ASSERT_NEAR(grad[e], fd, 1e-5 * scale + 1e-9) << sh.str() << " d" << name << "[" << e << "]";
      }
    };
    check(a, g.da, "a");
    check(bt, g.dbt, "bt");
    check(x, g.dx, "x");
    // dt = dL/dt: L is s Σ u[i, j] t[i, j] with u = dy btᵀ, so dt is s u.
    for (int64_t i = 0; i < sh.T; ++i)
      for (int64_t j = 0; j < sh.r; ++j) {
        double u = 0;
        for (int64_t c = 0; c < sh.n_out; ++c) u += double(d.dy[i * sh.n_out + c]) * d.bt[j * sh.n_out + c];
        ASSERT_NEAR(g.dt[i * sh.r + j], sh.s * u, 1e-5 * std::fabs(sh.s * u) + 1e-6) << sh.str() << " dt";
      }
  }
}

// ---- matmul_t -------------------------------------------------------------------------

// One weight matrix: its bytes as stored (and packed, where the format
// packs) and its values, dequantized by the scalar reference.
struct Matrix {
  std::string name;
  DType type = DType::kF32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> raw, packed;
  std::vector<float> values;  // [rows, cols]
  Packing packing = Packing::kRows;

  WeightView view(bool pack) const {
    const uint64_t rb = row_bytes(type, cols);
    return {type, cols, rows, pack ? packed.data() : raw.data(), rb, pack ? packing : Packing::kRows};
  }
};

Matrix make_matrix(std::string name, DType type, int64_t rows, int64_t cols, std::vector<uint8_t> raw) {
  Matrix m;
  m.name = std::move(name);
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.raw = std::move(raw);
  m.packing = packing_for(type, rows, cols);
  if (m.packing != Packing::kRows) {
    m.packed = m.raw;
    pack_rows(m.packing, type, m.packed.data(), rows, cols);
  }
  m.values.resize(rows * cols);
  const WeightView v = m.view(false);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(kernel_set(Isa::kScalar), v, r, m.values.data() + r * cols);
  return m;
}

// Real tensors: per format, its widest matrix in the first shared model file
// that holds it, and for the formats that pack, its tallest too (every
// packed view also runs as plain rows).
std::vector<Matrix> model_matrices() {
  std::vector<Matrix> out;
  std::map<std::pair<DType, bool>, bool> seen;  // (format, tallest)
  for (std::string family : {"tiny-llama", "tiny-qwen3"})
    for (std::string q : {"f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k",
                          "q3_k_m", "iq4_nl", "iq4_xs"}) {
      auto f = GgufFile::open(test::model_path(family + "-" + q + ".gguf"));
      std::map<DType, const GgufTensorInfo*> widest, tallest;
      for (const auto& ti : f->tensors()) {
        if (ti.dims.size() != 2 || !type_info(ti.type).computable) continue;
        const GgufTensorInfo*& w = widest[ti.type];
        if (!w || ti.dims[0] > w->dims[0]) w = &ti;
        const GgufTensorInfo*& t = tallest[ti.type];
        if (!t || ti.dims[1] > t->dims[1]) t = &ti;
      }
      for (bool tall : {false, true})
        for (const auto& [type, ti] : tall ? tallest : widest) {
          if (seen[{type, tall}] || (tall && packing_for(type, ti->dims[1], ti->dims[0]) == Packing::kRows)) continue;
          seen[{type, tall}] = true;
          std::vector<uint8_t> raw(ti->n_bytes);
          f->read(ti->file_offset, raw.data(), raw.size());
          out.push_back(make_matrix(family + "-" + q + " " + ti->name, type, ti->dims[1], ti->dims[0], std::move(raw)));
        }
    }
  return out;
}

// Random rows quantized into every format, odd widths (F32 / F16 / BF16) or
// odd block counts, 21 rows (two packed groups and five plain rows).
std::vector<Matrix> random_matrices() {
  std::vector<Matrix> out;
  uint32_t seed = 4000;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL,
                  DType::kIQ4_XS}) {
    const int64_t b = type_info(t).block_size;
    for (int64_t cols : b == 1 ? std::vector<int64_t>{37, 101} : std::vector<int64_t>{3 * b, 5 * b}) {
      const int64_t rows = 21;
      const auto v = uniform(rows * cols, -1, 1, ++seed);
      const uint64_t rb = row_bytes(t, cols);
      std::vector<uint8_t> raw(rows * rb);
      for (int64_t r = 0; r < rows; ++r) quantize_row(t, v.data() + r * cols, raw.data() + r * rb, cols);
      out.push_back(make_matrix("random " + std::string(dtype_name(t)) + " cols=" + std::to_string(cols), t, rows,
                                cols, std::move(raw)));
    }
  }
  return out;
}

// dx = dx0 + dy W in double, and each element's sum of magnitudes.
void matmul_t_ref(const Matrix& m, const std::vector<float>& dy, int64_t T, const std::vector<float>& dx0,
                  std::vector<double>& want, std::vector<double>& mag) {
  want.assign(dx0.begin(), dx0.end());
  mag.resize(dx0.size());
  for (size_t e = 0; e < dx0.size(); ++e) mag[e] = std::fabs(dx0[e]);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < m.rows; ++o) {
      const double g = dy[t * m.rows + o];
      const float* w = m.values.data() + o * m.cols;
      double* y = want.data() + t * m.cols;
      double* my = mag.data() + t * m.cols;
      for (int64_t c = 0; c < m.cols; ++c) {
        y[c] += g * w[c];
        my[c] += std::fabs(g * w[c]);
      }
    }
}

// Every target (but ref-engine, whose products are the scalar ones, when
// with_ref_engine is false), plain and packed views, T = 1, 3, 37, pools of
// 1 and 3 threads (3: more threads than chunks, so the rows are split in
// ranges summed through the partial buffers).
void check_matmul_t(const std::vector<Matrix>& ms, bool with_ref_engine) {
  uint32_t seed = 5000;
  for (const Matrix& m : ms)
    for (int64_t T : {1, 3, 37}) {
      const auto dy = uniform(T * m.rows, -1, 1, ++seed);
      const auto dx0 = uniform(T * m.cols, -1, 1, ++seed);
      std::vector<double> want, mag;
      matmul_t_ref(m, dy, T, dx0, want, mag);
      for (Isa isa : supported_isas())
        for (bool pack : {false, true}) {
          if (isa == Isa::kRefEngine && !with_ref_engine) continue;
          if (pack && m.packing == Packing::kRows) continue;
          for (int threads : {1, 3}) {
            if (threads == 1 && T != 37) continue;
            ThreadPool& pool = test_pool(threads);
            const WeightView w = m.view(pack);
            // The scratch as sized, and a guard past it that must stay as it was.
            const size_t floats = matmul_t_scratch_floats(w, T, pool.size());
            std::vector<float> scratch(floats + 64, kNaN);
            std::fill(scratch.begin() + floats, scratch.end(), kGuard);
            std::vector<float> dx = dx0;
            matmul_t(kernel_set(isa), w, dy.data(), T, dx.data(), scratch.data(), pool);
            for (size_t e = floats; e < scratch.size(); ++e) ASSERT_EQ(scratch[e], kGuard) << "scratch overrun";
            expect_close(dx, want, mag, 2e-5,
                         m.name + " " + std::string(dtype_name(m.type)) + (pack ? " packed" : "") + " " +
                             std::string(isa_name(isa)) + " T=" + std::to_string(T) +
                             " threads=" + std::to_string(threads));
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
    }
}

TEST(MatmulT, ModelTensorsEveryFormat) {
  const auto ms = model_matrices();
  std::map<DType, int> formats;
  int packed = 0;
  for (const Matrix& m : ms) {
    ++formats[m.type];
    packed += m.packing != Packing::kRows;
  }
  // F16, BF16, Q8_0, Q6_K, Q5_K, Q4_K, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS (F32 is not in the files).
  EXPECT_GE(formats.size(), 14u);
  EXPECT_GT(packed, 5);
  check_matmul_t(ms, false);
}

TEST(MatmulT, OddWidthsEveryFormat) { check_matmul_t(random_matrices(), true); }

// The plan splits the rows among the threads when the columns are too few:
// the scratch then holds partial sums. The size for T serves every smaller
// batch (one scratch for all of a trainer's batches).
TEST(MatmulT, ScratchCoversThePartials) {
  for (const WeightView& v : {WeightView{DType::kQ4_0, 1024, 3072, nullptr, row_bytes(DType::kQ4_0, 1024)},
                              WeightView{DType::kF16, 896, 4864, nullptr, row_bytes(DType::kF16, 896)}})
    for (int threads : {1, 3, 16})
      for (int64_t T = 2; T <= 300; ++T)
        ASSERT_GE(matmul_t_scratch_floats(v, T, threads), matmul_t_scratch_floats(v, T - 1, threads))
            << "T=" << T << " threads=" << threads;
  const WeightView w{DType::kQ4_0, 64, 4096, nullptr, row_bytes(DType::kQ4_0, 64)};
  EXPECT_GE(matmul_t_scratch_floats(w, 8, 4), size_t{3 * 8 * 64});
  EXPECT_LT(matmul_t_scratch_floats(w, 8, 1), matmul_t_scratch_floats(w, 8, 4));
  const WeightView wide{DType::kF16, 8192, 16, nullptr, row_bytes(DType::kF16, 8192)};
  EXPECT_LT(matmul_t_scratch_floats(wide, 64, 4), size_t{8192 * 64});  // enough chunks: no partials
}

}  // namespace
}  // namespace ebb
