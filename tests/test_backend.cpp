// The backend interface's registry and its CPU backend (ebb's CPU kernels
// behind backend.h), in every build; the Vulkan backend's own tests are the
// test_vulkan_*.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_backend.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "platform/error.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

TEST(Backend, RegistryRejectsUnknownIds) {
  for (const char* id : {"", "cuda", "vulkan:", "vulkan:-1", "vulkan:1x", "vulkanx", "CPU"}) {
    EXPECT_THROW(open_backend(id), Error) << id;
  }
  std::string why;
  if (list_gpu_devices(&why).empty()) {
    EXPECT_FALSE(why.empty());  // says why there is none
    try {
      open_backend("vulkan");
      FAIL() << "opened a Vulkan device that the list does not have";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("vulkan"), std::string::npos) << e.what();
    }
  }
}

TEST(CpuBackend, BuffersAreCountedAndChecked) {
  auto be = open_backend("cpu");
  EXPECT_EQ(be->info().id, "cpu");
  EXPECT_EQ(be->info().kind, DeviceKind::kCpu);
  EXPECT_TRUE(be->info().caps.unified_memory);
  {
    auto a = be->alloc(1000, MemoryPlace::kDevice);
    auto b = be->alloc(100000, MemoryPlace::kHost);
    EXPECT_GE(be->ledger(MemoryPlace::kDevice).buffer_bytes, 101000u);
    ASSERT_NE(a->host_data(), nullptr);
    char c[8] = {};
    EXPECT_THROW(a->write(996, c, 8), Error);
    EXPECT_THROW(be->alloc(0, MemoryPlace::kDevice), Error);
  }
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, 0u);
}

// The ops run at once through the CPU kernels: the scalar target gives
// exactly the scalar kernels' results.
TEST(CpuBackend, OpsAreTheCpuKernels) {
  auto be = open_cpu_backend({Isa::kScalar, 1});
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t rows = 8, cols = 64, n = rows * cols;
  std::vector<float> wf(n), x(cols), w2(cols);
  for (auto& v : wf) v = d(rng);
  for (auto& v : x) v = d(rng);
  for (auto& v : w2) v = d(rng);
  std::vector<uint8_t> w(row_bytes(DType::kQ8_0, cols) * rows);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(DType::kQ8_0, wf.data() + r * cols, w.data() + r * row_bytes(DType::kQ8_0, cols), cols);
  auto wb = be->alloc(w.size(), MemoryPlace::kDevice);
  wb->write(0, w.data(), w.size());
  auto xb = be->alloc(4 * cols, MemoryPlace::kDevice);
  xb->write(0, x.data(), 4 * cols);
  auto nb = be->alloc(4 * cols, MemoryPlace::kDevice);
  nb->write(0, w2.data(), 4 * cols);
  auto yb = be->alloc(4 * rows, MemoryPlace::kDevice);
  auto s = be->new_stream();
  MatmulOp op;
  op.w_type = DType::kQ8_0;
  op.rows = rows;
  op.cols = cols;
  op.w = {wb.get(), 0};
  op.x = {xb.get(), 0};
  op.y = {yb.get(), 0};
  s->matmul(op);
  s->rms_norm({{xb.get(), 0}, {nb.get(), 0}, {xb.get(), 0}, 1, cols, 1e-5f});
  s->submit();
  s->wait();

  const FormatKernels* fk = kernel_set(Isa::kScalar).format(DType::kQ8_0);
  std::vector<uint8_t> act(row_bytes(fk->act, cols));
  fk->quantize_act(x.data(), act.data(), cols);
  std::vector<float> y(rows), want(rows);
  yb->read(0, y.data(), 4 * rows);
  for (int64_t r = 0; r < rows; ++r)
    fk->vec_dot(cols, w.data() + r * row_bytes(DType::kQ8_0, cols), act.data(), &want[r]);
  EXPECT_EQ(y, want);
  std::vector<float> xn(cols), got(cols);
  ops_kernels(Isa::kScalar).rmsnorm(x.data(), w2.data(), xn.data(), cols, 1e-5f);
  xb->read(0, got.data(), 4 * cols);
  EXPECT_EQ(got, xn);

  op.w_type = DType::kQ8_0;
  op.cols = 48;  // not whole blocks
  EXPECT_THROW(s->matmul(op), Error);
  op.cols = 128;  // x holds 64
  EXPECT_THROW(s->matmul(op), Error);
}

// The CPU backend's low_rank_up (the scalar reference of the Vulkan
// shader): y's rows at their stride get alpha B t added, the padding between
// them is untouched, F16 B widened exactly; the sum in F32 within rank
// roundings of the double one.
TEST(CpuBackend, LowRankUpAddsTheScaledProductInPlace) {
  auto be = open_cpu_backend({Isa::kScalar, 1});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t n_out = 12, rank = 6, n_tokens = 3, y_stride = n_out + 4;
  for (const DType type : {DType::kF16, DType::kF32}) {
    std::vector<float> bf(n_out * rank), t(n_tokens * rank), y0(n_tokens * y_stride);
    std::vector<uint16_t> bh(bf.size());
    for (auto& v : bf) v = d(rng);
    for (auto& v : t) v = d(rng);
    for (auto& v : y0) v = d(rng);
    for (size_t i = 0; i < bf.size(); ++i) {
      bh[i] = fp32_to_fp16(bf[i]);
      if (type == DType::kF16) bf[i] = fp16_to_fp32(bh[i]);
    }
    auto bb = be->alloc(4 * bf.size(), MemoryPlace::kDevice);
    if (type == DType::kF16) bb->write(0, bh.data(), 2 * bh.size());
    else bb->write(0, bf.data(), 4 * bf.size());
    auto tb = be->alloc(4 * t.size(), MemoryPlace::kDevice);
    tb->write(0, t.data(), 4 * t.size());
    auto yb = be->alloc(4 * y0.size(), MemoryPlace::kDevice);
    yb->write(0, y0.data(), 4 * y0.size());
    LowRankUpOp op;
    op.b_type = type;
    op.n_out = n_out;
    op.rank = rank;
    op.b = {bb.get(), 0};
    op.t = {tb.get(), 0};
    op.n_tokens = n_tokens;
    op.y = {yb.get(), 0};
    op.y_stride = y_stride;
    op.alpha = -0.75f;
    auto s = be->new_stream();
    s->low_rank_up(op);
    std::vector<float> y(y0.size());
    yb->read(0, y.data(), 4 * y.size());
    for (int64_t r = 0; r < n_tokens; ++r)
      for (int64_t o = 0; o < y_stride; ++o) {
        const size_t i = static_cast<size_t>(r * y_stride + o);
        if (o >= n_out) {
          EXPECT_EQ(y[i], y0[i]) << "padding";
          continue;
        }
        double sum = 0, mag = 0;
        for (int64_t j = 0; j < rank; ++j) {
          sum += double(bf[o * rank + j]) * t[r * rank + j];
          mag += std::fabs(double(bf[o * rank + j]) * t[r * rank + j]);
        }
        const double u = 1.0 / (1 << 24);
        EXPECT_NEAR(y[i], y0[i] - 0.75 * sum, 2 * u * ((rank + 2) * 0.75 * mag + std::fabs(y0[i])) + 1e-30)
            << dtype_name(type) << " row " << r << " output " << o;
      }
    op.b_type = DType::kQ8_0;
    EXPECT_THROW(s->low_rank_up(op), Error);
    op.b_type = type;
    op.y_stride = n_out - 1;
    EXPECT_THROW(s->low_rank_up(op), Error);
  }
}

// The CPU backend's matmul takes every format the Vulkan backend has a
// shader for (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), as the CPU's
// kernels compute it, and refuses a row that is not whole blocks.
TEST(CpuBackend, MatmulTakesTheGpuFormats) {
  auto be = open_cpu_backend({Isa::kScalar, 1});
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t rows = 3, cols = 512;
  std::vector<float> wf(rows * cols), x(cols);
  for (auto& v : wf) v = d(rng);
  for (auto& v : x) v = d(rng);
  auto xb = be->alloc(4 * cols, MemoryPlace::kDevice);
  xb->write(0, x.data(), 4 * cols);
  auto yb = be->alloc(4 * rows, MemoryPlace::kDevice);
  auto s = be->new_stream();
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K}) {
    ASSERT_TRUE(be->supports(OpKind::kMatmul, t)) << dtype_name(t);
    const uint64_t rb = row_bytes(t, cols);
    std::vector<uint8_t> w(rb * rows);
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, wf.data() + r * cols, w.data() + r * rb, cols);
    auto wb = be->alloc(w.size(), MemoryPlace::kDevice);
    wb->write(0, w.data(), w.size());
    MatmulOp op;
    op.w_type = t;
    op.rows = rows;
    op.cols = cols;
    op.w = {wb.get(), 0};
    op.x = {xb.get(), 0};
    op.y = {yb.get(), 0};
    s->matmul(op);
    const FormatKernels* fk = kernel_set(Isa::kScalar).format(t);
    std::vector<uint8_t> act(row_bytes(fk->act, cols));
    fk->quantize_act(x.data(), act.data(), cols);
    std::vector<float> y(rows), want(rows);
    yb->read(0, y.data(), 4 * rows);
    for (int64_t r = 0; r < rows; ++r) fk->vec_dot(cols, w.data() + r * rb, act.data(), &want[r]);
    EXPECT_EQ(y, want) << dtype_name(t);
    if (type_info(t).block_size == 256) {
      op.cols = 224;  // a multiple of 32, not of the 256-element super-block
      EXPECT_THROW(s->matmul(op), Error) << dtype_name(t);
    }
  }
}

}  // namespace
}  // namespace ebb
