// A memory limit on a device engine (DeviceForward::set_memory_limit): a
// limit below what the engine holds drops device layers now, every step
// under it stays under it (the layers that fit come back, the rest stream
// through a one-layer window) and gives the tokens of an engine without a
// limit; lifting it and restoring gives the never-evicted logits bit for bit
// (same shaders, same weights); a limit no step could run under is refused
// naming the sizes, and a step whose KV growth no longer fits is refused
// before anything grows. Wholly on the device and on a split (-ngl 4).
// Skips without a Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "support.h"
#include "vulkan_engine_support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::argmax;
using test::greedy;
using test::Greedy;
using test::chunked;
using test::copy;
using test::cpu_options;
using test::long_tokens;

EngineOptions device_options(Backend* be, int ngl = -1) {
  EngineOptions eo = cpu_options("stories260K");
  eo.backend = be;
  eo.n_gpu_layers = ngl;
  return eo;
}

// The smallest limit set_memory_limit takes, from the engine's own figures:
// what it holds without any device layer, plus a layer's device buffer and
// its host copy (the streaming window).
uint64_t floor_of(Engine& e) {
  const DeviceFootprint d = *e.footprint().device;
  uint64_t dev = 0, host = 0;
  for (int l = e.device()->first_layer(); l < e.model().n_layers(); ++l) {
    dev = std::max(dev, d.weights_per_layer[static_cast<size_t>(l)]);
    host = std::max(host, e.model().layer_unit(l).bytes());
  }
  return e.device()->held() - d.weights() + dev + host;
}

class VulkanLimit : public ::testing::TestWithParam<int> {};  // -ngl: -1 all layers, 4 a split (layer 0 on the CPU)

TEST_P(VulkanLimit, StepsStayUnderTheLimitWithTheSameTokensAndLiftingItRestoresExactly) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 6);
  constexpr int kTokens = 10;
  Greedy want;
  {
    Engine ref(device_options(be, GetParam()));
    Session s(ref, chunked());
    want = greedy(s, prompt, kTokens, [] {});
  }
  const uint64_t ledger0 = be->ledger(MemoryPlace::kDevice).buffer_bytes;
  Engine gpu(device_options(be, GetParam()));
  DeviceForward& dev = *gpu.device();
  Session s(gpu, chunked());
  s.feed(prompt);
  const uint64_t held = dev.held();
  const DeviceFootprint d0 = *gpu.footprint().device;
  // The device ledger holds the footprint's buffers (each rounded up to the device's alignment).
  EXPECT_GE(be->ledger(MemoryPlace::kDevice).buffer_bytes - ledger0, d0.total());
  // Room for one layer beside the window, and for the KV to double twice:
  // the rest of the layers must go, and come back one at a time.
  const uint64_t limit = floor_of(gpu) + d0.weights_per_layer.back() + 3 * (d0.kv + 4096);
  ASSERT_LT(limit, held) << "the limit must force an eviction";
  const uint64_t before = be->ledger(MemoryPlace::kDevice).buffer_bytes;
  const EvictReport r = gpu.set_memory_limit(limit);
  EXPECT_EQ(gpu.memory_limit(), limit);
  EXPECT_GT(r.weights_dropped, 0);
  EXPECT_EQ(r.freed, before - be->ledger(MemoryPlace::kDevice).buffer_bytes) << "the device ledger's delta";
  EXPECT_LE(dev.held(), limit);
  EXPECT_EQ(gpu.footprint().device->weights_dropped, d0.weights() - gpu.footprint().device->weights());
  // Generation under the limit: the same greedy tokens, every step under it.
  s.clear();
  int64_t streamed = 0;
  const Greedy got = greedy(s, prompt, kTokens, [&] {
    EXPECT_LE(dev.held(), limit);
    const DeviceFootprint d = *gpu.footprint().device;
    EXPECT_GE(be->ledger(MemoryPlace::kDevice).buffer_bytes - ledger0, d.total());
    streamed += dev.n_streamed_last_step();
  });
  EXPECT_EQ(got.tokens, want.tokens);
  for (size_t i = 0; i < got.logits.size(); ++i) EXPECT_EQ(got.logits[i], want.logits[i]) << "step " << i;
  EXPECT_GT(streamed, 0) << "some layer had to stream through the window";
  EXPECT_GT(dev.n_dropped(), 0) << "streamed layers leave again";
  // restore() under the limit brings back only what fits.
  gpu.restore();
  EXPECT_LE(dev.held(), limit);
  EXPECT_GT(dev.n_dropped(), 0);
  // Lifted: restore() brings everything back, and the logits are those of
  // an engine never evicted, bit for bit.
  EXPECT_EQ(gpu.set_memory_limit(0).freed, 0u);
  EXPECT_EQ(gpu.memory_limit(), 0u);
  gpu.restore();
  EXPECT_EQ(dev.n_dropped(), 0);
  EXPECT_EQ(gpu.footprint().device->weights(), d0.weights());
  s.clear();
  const Greedy again = greedy(s, prompt, kTokens, [&] { EXPECT_EQ(dev.n_streamed_last_step(), 0); });
  EXPECT_EQ(again.tokens, want.tokens);
  for (size_t i = 0; i < again.logits.size(); ++i) EXPECT_EQ(again.logits[i], want.logits[i]) << "step " << i;
}

// A limit below a step's needs (what is held without any layer, plus one
// layer's window) is refused naming the sizes, and nothing changes; a
// limit that holds the window but not a KV that grows refuses that step
// (before it grows the KV), naming the limit.
TEST_P(VulkanLimit, AnImpossibleLimitIsRefusedNamingTheSizes) {
  EBB_REQUIRE_VULKAN(be);
  Engine gpu(device_options(be, GetParam()));
  DeviceForward& dev = *gpu.device();
  const uint64_t held = dev.held(), floor = floor_of(gpu);
  ASSERT_LT(floor, held);
  try {
    gpu.set_memory_limit(floor - 1);
    ADD_FAILURE() << "a limit under one layer's window was taken";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(be->info().id), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(floor - 1) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("the smallest limit is"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(floor) + " bytes"), std::string::npos) << m;
  }
  EXPECT_EQ(gpu.memory_limit(), 0u);
  EXPECT_EQ(dev.n_dropped(), 0);
  EXPECT_EQ(dev.held(), held);
  // At the floor: taken (layers go until the window's worth is left).
  const EvictReport r = gpu.set_memory_limit(floor);
  EXPECT_GT(r.weights_dropped, 0);
  EXPECT_LT(r.weights_dropped, dev.n_device_layers());
  EXPECT_LE(dev.held(), floor);
  const std::vector<int32_t> all = long_tokens();
  Session s(gpu, chunked(4));
  // The first step's KV (one chunk) does not fit beside the window: refused, naming the limit.
  try {
    s.feed({all.begin(), all.begin() + 3});
    ADD_FAILURE() << "a step over the limit ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("memory limit of"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(floor) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("streaming one layer takes"), std::string::npos) << m;
  }
  EXPECT_LE(dev.held(), floor);
  EXPECT_EQ(gpu.footprint().device->kv, 0u) << "nothing grew";
  EXPECT_EQ(dev.n_dropped(), dev.n_device_layers()) << "the resident layers made way for the window first";
}

// The scheduler admits foreground requests under the device's limit as it
// does under the host's: two requests whose projected KV fits the limit
// one at a time but not together run one after the other (the second
// deferred for memory), and each gives an unlimited engine's tokens.
TEST_P(VulkanLimit, TheSchedulerDefersARequestWhoseKvDoesNotFitBesideTheRunningOne) {
  EBB_REQUIRE_VULKAN(be);
  Engine gpu(device_options(be, GetParam()));
  const std::vector<int32_t> all = long_tokens();
  GenerationRequest r;
  r.prompt.assign(all.begin(), all.begin() + 6);
  r.options.max_tokens = 26;  // 32 positions: 2 chunks of 16
  r.options.sampling.temperature = 0;
  r.options.stop_at_eog = false;
  r.session = chunked();
  r.session.n_ctx = 128;
  const ModelConfig& c = gpu.config();
  const uint64_t kv = static_cast<uint64_t>(c.n_layer * c.kv_dim()) * 2 * 2 * 32;  // the scheduler's projection, F16
  std::vector<TokenId> want;
  {
    Session alone(gpu, r.session);
    want = generate(alone, r.prompt, r.options, nullptr).tokens;
  }
  // Room for one request's KV beside what is held, not for two.
  gpu.set_memory_limit(gpu.device()->held() + kv + kv / 2);
  Scheduler sched(&gpu);
  std::vector<std::shared_ptr<GenerationStream>> streams = {sched.submit_generation(r), sched.submit_generation(r)};
  for (auto& st : streams) {
    for (;;) {
      const std::optional<GenerationEvent> e = st->next(30.0);
      ASSERT_TRUE(e) << "no event within 30 s";
      ASSERT_NE(e->kind, GenerationEvent::Kind::kError) << e->error;
      if (e->kind == GenerationEvent::Kind::kDone) {
        EXPECT_EQ(e->stats.tokens, want);
        break;
      }
    }
  }
  EXPECT_GE(sched.metrics().fg_deferred_memory, 1) << "the second waited for the first";
  EXPECT_LE(gpu.device()->held(), gpu.memory_limit());
  sched.shutdown(0);
}

INSTANTIATE_TEST_SUITE_P(Layers, VulkanLimit, ::testing::Values(-1, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return i.param < 0 ? "all" : "split4"; });

}  // namespace
}  // namespace ebb
