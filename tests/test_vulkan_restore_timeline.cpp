// The restore's timeline waits and direct reads (runtime/device_restore.h,
// DeviceForward::restore_layer): a step with k dropped layers is submitted
// in segments that wait on the device (k + 1 submissions when resident
// layers come first, one host wait: the logits), with the never-evicted
// logits bit for bit; a read that fails on a middle layer (a hook throws)
// fails the step naming the layer after the queue drained, frees what it
// allocated for the layers not back (the device ledger says so) and leaves
// the engine able to step; a layer read straight from the file into its
// mapped device buffer holds the same bytes as one read into a host copy
// and uploaded. Skips without a Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"
#include "vulkan_engine_support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::error_of;
using test::prefill;

// Whether the device offers timeline semaphores (lavapipe does: Vulkan 1.3).
bool has_timeline(Backend& be) { return be.new_timeline() != nullptr && be.new_stream()->supports_timeline(); }

int64_t direct_layers(Engine& e, int from, int to) {
  int64_t n = 0;
  for (int l = from; l < to; ++l) n += e.device()->layer_direct(l) ? 1 : 0;
  return n;
}

class VulkanRestoreTimeline : public ::testing::TestWithParam<const char*> {};

// The last half evicted: one segment of the resident layers, then one per
// dropped layer (each waiting on the device), one host wait; the same
// logits as never evicted, and the same through the host-wait path.
TEST_P(VulkanRestoreTimeline, SegmentsNotHostWaits) {
  EBB_REQUIRE_VULKAN(be);
  const std::string path = test::model_path(std::string(GetParam()) + ".gguf");
  const std::vector<int32_t> prompt = test::load_golden(GetParam())[0].prompt_tokens;
  Engine gpu(test::device_options(path, be));
  const int nl = static_cast<int>(gpu.config().n_layer);
  ASSERT_GE(nl, 2);
  const std::vector<float> want = prefill(gpu, prompt);
  const DeviceRestoreStats resident = gpu.device()->restore_stats();
  EXPECT_EQ(resident.layers, 0);
  EXPECT_EQ(resident.submissions, 1);  // nothing dropped: one submission
  EXPECT_EQ(resident.host_waits, 1);
  const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
  const std::vector<uint64_t> per_layer = gpu.footprint().device->weights_per_layer;
  uint64_t half = 0;
  for (int l = nl / 2; l < nl; ++l) half += per_layer[static_cast<size_t>(l)];
  const int64_t k = gpu.evict(half).weights_dropped;
  ASSERT_EQ(k, nl - nl / 2);

  EXPECT_EQ(prefill(gpu, prompt), want);  // bit-exact
  DeviceRestoreStats st = gpu.device()->restore_stats();
  EXPECT_EQ(st.layers, k);
  EXPECT_EQ(st.direct_layers + st.staged_layers, k);
  EXPECT_EQ(st.direct_layers, direct_layers(gpu, nl / 2, nl));
  if (!has_timeline(*be)) GTEST_SKIP() << be->info().name << " has no timeline semaphores: the host-wait path ran";
  EXPECT_TRUE(st.timeline);
  EXPECT_EQ(st.submissions, k + 1);
  EXPECT_EQ(st.host_waits, 1);
  EXPECT_EQ(gpu.device()->n_dropped(), 0);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers);

  // Every layer dropped: the first segment begins with layer 0's wait, so k
  // submissions in all.
  EXPECT_EQ(gpu.evict(UINT64_MAX).weights_dropped, nl);
  EXPECT_EQ(prefill(gpu, prompt), want);
  st = gpu.device()->restore_stats();
  EXPECT_TRUE(st.timeline);
  EXPECT_EQ(st.submissions, nl);
  EXPECT_EQ(st.host_waits, 1);

  // The host-wait path (what a device without timelines runs): the same
  // logits, a host wait per layer not back yet plus the logits'.
  gpu.evict(half);
  DeviceRestoreHooks h;
  h.host_waits = true;
  gpu.device()->set_restore_hooks(h);
  EXPECT_EQ(prefill(gpu, prompt), want);
  st = gpu.device()->restore_stats();
  EXPECT_FALSE(st.timeline);
  EXPECT_EQ(st.layers, k);
  EXPECT_GE(st.host_waits, 1);
  EXPECT_LE(st.host_waits, k + 1);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, VulkanRestoreTimeline, ::testing::Values("tiny-llama-f16", "tiny-qwen3-q4_k_m"));

// Layer m's read fails (the hook throws as a failed read would) with every
// layer dropped: the step throws naming m once the device is done with the
// segments (the restore thread raised the timeline past them), layers
// [0, m) are back, [m, nl) dropped with their buffers freed; the next step
// restores them and computes the same logits.
TEST(VulkanRestoreTimelineErrors, MiddleLayerReadFailsThenNextStepMatches) {
  EBB_REQUIRE_VULKAN(be);
  const std::string path = test::model_path("tiny-llama-f16.gguf");
  const std::vector<int32_t> prompt = test::load_golden("tiny-llama-f16")[0].prompt_tokens;
  Engine gpu(test::device_options(path, be));
  const int nl = static_cast<int>(gpu.config().n_layer);
  ASSERT_GE(nl, 3);
  const std::vector<float> want = prefill(gpu, prompt);
  const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
  const int64_t host_before = gpu.ledger().total();
  const std::vector<uint64_t> per_layer = gpu.footprint().device->weights_per_layer;
  const int m = nl / 2;
  gpu.evict(UINT64_MAX);

  std::vector<int> read;
  DeviceRestoreHooks h;
  h.before_read = [&](int l) {
    read.push_back(l);
    if (l == m) throw Error("injected read error");
  };
  gpu.device()->set_restore_hooks(h);
  const std::string err = error_of([&] { prefill(gpu, prompt); });
  EXPECT_NE(err.find("layer " + std::to_string(m) + " could not be restored"), std::string::npos) << err;
  EXPECT_NE(err.find("injected read error"), std::string::npos) << err;
  std::vector<int> want_read;
  for (int l = 0; l <= m; ++l) want_read.push_back(l);
  EXPECT_EQ(read, want_read);  // the restore stopped at the failure
  EXPECT_EQ(gpu.device()->restore_stats().timeline, has_timeline(*be));
  EXPECT_EQ(gpu.device()->n_dropped(), nl - m);
  // The device holds the layers that came back and nothing for the others
  // (the session's KV went with it).
  uint64_t dropped = 0;
  for (int l = m; l < nl; ++l) dropped += per_layer[static_cast<size_t>(l)];
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes - dropped);
  const DeviceFootprint fp = gpu.footprint().device.value();
  EXPECT_EQ(fp.weights(), held.buffer_bytes - dropped - fp.globals - fp.kv - fp.adapters - fp.scratch);
  EXPECT_EQ(fp.weights_dropped, dropped);

  gpu.device()->set_restore_hooks({});
  EXPECT_EQ(prefill(gpu, prompt), want);
  EXPECT_EQ(gpu.device()->restore_stats().layers, nl - m);
  EXPECT_EQ(gpu.device()->n_dropped(), 0);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
  EXPECT_EQ(gpu.ledger().total(), host_before);
}

// restore() and a step, each once through the direct path and once through
// the host copy (staged_only): every device layer holds the bytes the load
// uploaded, and the step's logits are the same.
TEST(VulkanRestoreTimelineDirect, DirectBytesEqualStaged) {
  EBB_REQUIRE_VULKAN(be);
  for (const char* name : {"tiny-llama-f16", "tiny-qwen3-q4_k_m"}) {
    SCOPED_TRACE(name);
    const std::string path = test::model_path(std::string(name) + ".gguf");
    const std::vector<int32_t> prompt = test::load_golden(name)[0].prompt_tokens;
    Engine gpu(test::device_options(path, be));
    const int nl = static_cast<int>(gpu.config().n_layer);
    std::vector<std::vector<uint8_t>> loaded;
    for (int l = 0; l < nl; ++l) loaded.push_back(gpu.device()->read_layer(l));
    const std::vector<float> want = prefill(gpu, prompt);
    const int64_t n_direct = direct_layers(gpu, 0, nl);
    if (be->info().caps.unified_memory && std::string(name) == "tiny-llama-f16") {
      EXPECT_EQ(n_direct, nl) << "F16 matrices and F32 norms are the file's bytes on the device";
    }
    auto check_bytes = [&] {
      for (int l = 0; l < nl; ++l) EXPECT_EQ(gpu.device()->read_layer(l), loaded[static_cast<size_t>(l)]) << l;
    };
    for (bool staged : {false, true}) {
      SCOPED_TRACE(staged ? "staged" : "direct");
      DeviceRestoreHooks h;
      h.staged_only = staged;
      gpu.device()->set_restore_hooks(h);
      gpu.evict(UINT64_MAX);
      EXPECT_EQ(gpu.restore().weights_loaded, nl);
      DeviceRestoreStats st = gpu.device()->restore_stats();
      EXPECT_EQ(st.direct_layers, staged ? 0 : n_direct);
      EXPECT_EQ(st.staged_layers, staged ? nl : nl - n_direct);
      check_bytes();
      gpu.evict(UINT64_MAX);
      EXPECT_EQ(prefill(gpu, prompt), want);
      st = gpu.device()->restore_stats();
      EXPECT_EQ(st.direct_layers, staged ? 0 : n_direct);
      check_bytes();
    }
  }
}

}  // namespace
}  // namespace ebb
