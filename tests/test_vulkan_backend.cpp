// The Vulkan backend's device list, capabilities, memory ledger, streams and
// errors (its kernels: test_vulkan_ops.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include "platform/error.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::download;
using test::upload;

TEST(VulkanBackend, ListsDevicesWithProbedCapabilities) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<DeviceInfo> devs = list_gpu_devices();
  ASSERT_FALSE(devs.empty());
  for (size_t i = 0; i < devs.size(); ++i) {
    const DeviceInfo& d = devs[i];
    std::printf("%s: %s [%s] %s; unified %d f16 %d int8 %d int8-dot %d subgroup %u coopmat %d, %.1f GiB\n",
                d.id.c_str(), d.name.c_str(), std::string(device_kind_name(d.kind)).c_str(), d.driver.c_str(),
                d.caps.unified_memory, d.caps.f16_arithmetic, d.caps.int8_arithmetic, d.caps.int8_dot_product,
                d.caps.subgroup_size, d.caps.cooperative_matrix, d.caps.device_memory_bytes / 1073741824.0);
    EXPECT_EQ(d.id, "vulkan:" + std::to_string(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.caps.subgroup_size, 0u);
    EXPECT_GT(d.caps.device_memory_bytes, 0u);
    EXPECT_GE(d.caps.max_buffer_range, 1u << 27);  // Vulkan guarantees 2^27 bytes
    EXPECT_GT(d.caps.max_allocations, 0u);
  }
  EXPECT_EQ(be->info().id, "vulkan:0");
  EXPECT_EQ(be->info().name, devs[0].name);
  if (devs[0].kind == DeviceKind::kCpuDriver) {
    EXPECT_TRUE(devs[0].caps.unified_memory);
  }
}

TEST(VulkanBackend, OpenRejectsBadIds) {
  EBB_REQUIRE_VULKAN(be);
  const size_t n = list_gpu_devices().size();
  try {
    open_backend("vulkan:" + std::to_string(n));
    FAIL() << "opened a device past the list";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(open_backend("vulkan:x"), Error);
  EXPECT_THROW(open_backend("vulkan:"), Error);
  EXPECT_THROW(open_backend("cuda:0"), Error);
}

// Small buffers share one slab; the ledger counts exactly what is held and
// returns to zero (the slab back to the driver) when the last one goes.
TEST(VulkanBackend, BuffersComeFromSlabsAndTheLedgerStaysExact) {
  EBB_REQUIRE_VULKAN(be);
  const MemoryLedger before = be->ledger(MemoryPlace::kDevice);
  ASSERT_EQ(before.n_buffers, 0u) << "another test leaked buffers";
  std::vector<std::unique_ptr<BackendBuffer>> bufs;
  uint64_t asked = 0;
  for (int i = 0; i < 100; ++i) {
    const uint64_t n = 1000 + 37 * i;
    bufs.push_back(be->alloc(n, MemoryPlace::kDevice));
    asked += n;
  }
  MemoryLedger l = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(l.n_buffers, 100u);
  EXPECT_EQ(l.n_slabs, 1u);  // sub-allocated, not 100 driver allocations
  EXPECT_GE(l.buffer_bytes, asked);
  EXPECT_LT(l.buffer_bytes, asked + 100 * 256);  // at most an alignment's padding each (<= 256 bytes)
  EXPECT_EQ(l.slab_bytes, 64ull << 20);

  // Free every other buffer, then allocate the same sizes again: the holes
  // are reused, no new slab.
  for (int i = 0; i < 100; i += 2) bufs[i].reset();
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, 50u);
  for (int i = 0; i < 100; i += 2) bufs[i] = be->alloc(1000 + 37 * i, MemoryPlace::kDevice);
  l = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(l.n_slabs, 1u);
  EXPECT_EQ(l.n_buffers, 100u);

  // A buffer larger than a slab gets one of its own.
  auto big = be->alloc((64ull << 20) + 4096, MemoryPlace::kDevice);
  l = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(l.n_slabs, 2u);
  EXPECT_GE(l.slab_bytes, (128ull << 20) + 4096);

  // Contents survive the neighbours' churn.
  std::vector<uint32_t> pattern(250);
  std::iota(pattern.begin(), pattern.end(), 7u);
  bufs[1]->write(0, pattern.data(), 1000);
  bufs[0].reset();
  bufs[2].reset();
  EXPECT_EQ(download<uint32_t>(*bufs[1], 250), pattern);

  big.reset();
  bufs.clear();
  l = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(l.n_buffers, 0u);
  EXPECT_EQ(l.buffer_bytes, 0u);
  EXPECT_EQ(l.n_slabs, 0u);  // eviction returns memory to the driver
  EXPECT_EQ(l.slab_bytes, 0u);
}

TEST(VulkanBackend, HostBuffersAreMappedAndCounted) {
  EBB_REQUIRE_VULKAN(be);
  auto b = be->alloc(4096, MemoryPlace::kHost);
  ASSERT_NE(b->host_data(), nullptr);
  EXPECT_EQ(be->ledger(MemoryPlace::kHost).n_buffers, 1u);
  static_cast<uint8_t*>(b->host_data())[10] = 42;
  uint8_t got = 0;
  b->read(10, &got, 1);
  EXPECT_EQ(got, 42);
  b.reset();
  EXPECT_EQ(be->ledger(MemoryPlace::kHost).slab_bytes, 0u);
}

TEST(VulkanBackend, BufferBoundsAreChecked) {
  EBB_REQUIRE_VULKAN(be);
  auto b = be->alloc(100, MemoryPlace::kDevice);
  char tmp[16] = {};
  EXPECT_THROW(b->write(90, tmp, 16), Error);
  EXPECT_THROW(b->read(101, tmp, 0), Error);
  EXPECT_THROW(be->alloc(0, MemoryPlace::kDevice), Error);
  EXPECT_THROW(be->alloc(be->info().caps.max_buffer_range + 1, MemoryPlace::kDevice), Error);
}

// Ops on one stream run in order, each seeing the previous one's result,
// across more dispatches than one descriptor pool holds.
TEST(VulkanBackend, StreamOrdersManyOps) {
  EBB_REQUIRE_VULKAN(be);
  const int64_t n = 300;
  std::vector<float> x(n), y(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7);
  auto xb = upload(*be, x);
  auto yb = upload(*be, y);
  auto s = be->new_stream();
  const int reps = 1200;
  for (int r = 0; r < reps; ++r) s->add({{yb.get(), 0}, {xb.get(), 0}, n});
  EXPECT_EQ(s->n_recorded(), reps);
  s->submit();
  s->wait();
  EXPECT_EQ(s->n_recorded(), 0);
  const auto got = download<float>(*yb, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], reps * x[i]) << "element " << i;  // small integers: exact
  // The stream records again after wait().
  s->add({{yb.get(), 0}, {xb.get(), 0}, n});
  s->wait();
  EXPECT_EQ(download<float>(*yb, 1, 4)[0], (reps + 1) * x[1]);
}

TEST(VulkanBackend, OpsRejectBadArguments) {
  EBB_REQUIRE_VULKAN(be);
  auto w = be->alloc(1 << 16, MemoryPlace::kDevice);
  auto x = be->alloc(1 << 12, MemoryPlace::kDevice);
  auto y = be->alloc(1 << 12, MemoryPlace::kDevice);
  auto s = be->new_stream();
  MatmulOp op;
  op.w_type = DType::kQ5_0;  // a format without a shader (dequantised to F16 at load)
  op.rows = 4;
  op.cols = 256;
  op.w = {w.get(), 0};
  op.x = {x.get(), 0};
  op.y = {y.get(), 0};
  try {
    s->matmul(op);
    FAIL() << "Q5_0 matmul accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(be->supports(OpKind::kMatmul, DType::kQ5_0));
  EXPECT_FALSE(be->supports(OpKind::kMatmul, DType::kIQ4_NL));
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K})
    EXPECT_TRUE(be->supports(OpKind::kMatmul, t)) << dtype_name(t);
  // A K-quant's row is whole 256-element super-blocks: 224 columns (a
  // multiple of 32) is refused, naming the multiple.
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    op.w_type = t;
    op.cols = 224;
    try {
      s->matmul(op);
      FAIL() << dtype_name(t) << " matmul with 224 columns accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a multiple of 256 for " + std::string(dtype_name(t))),
                std::string::npos)
          << e.what();
    }
  }
  op.w_type = DType::kBF16;
  op.cols = 255;  // odd
  EXPECT_THROW(s->matmul(op), Error);
  op.cols = 256;
  op.w_type = DType::kQ8_0;
  op.cols = 48;  // not a multiple of 32
  EXPECT_THROW(s->matmul(op), Error);
  op.w_type = DType::kF16;
  op.cols = 2048;  // x holds 1024 floats
  try {
    s->matmul(op);
    FAIL() << "x past its buffer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x needs bytes"), std::string::npos) << e.what();
  }
  op.cols = 256;
  op.x.offset = 2;  // floats at a byte offset that is not a multiple of 4
  EXPECT_THROW(s->matmul(op), Error);
  EXPECT_EQ(s->n_recorded(), 0);  // nothing half-recorded

  AttentionOp a;
  a.q = {x.get(), 0};
  a.out = {y.get(), 0};
  a.k = a.v = {w.get(), 0};
  a.chunk_offsets = {x.get(), 0};
  a.n_q = 1;
  a.n_heads = 3;
  a.n_kv_heads = 2;  // 3 % 2 != 0
  a.head_dim = 64;
  EXPECT_THROW(s->attention(a), Error);
}

}  // namespace
}  // namespace ebb
