// Streaming under a device memory limit, overlapped with the step
// (runtime/device_stream.h): with room for two windows beside what is held,
// the read of the next streamed layer begins before the step waits on the
// submission that runs this one (a gate in the step's wait hook holds it
// until that read has begun, or a deadlock breaker fires, which the test
// reports); with room for one, each read begins only after the layer
// before it was waited on. Either way what is held, sampled at every read
// and every submission, stays under the limit, the window buffers are
// allocated once for a sequence of steps (not per layer per step), the
// tokens and logits are an unlimited engine's bit for bit, and a read that
// fails fails the step naming the layer while the next step works.
// stories260K, all layers on the device. Skips without a Vulkan device
// unless EBB_TEST_REQUIRE_VULKAN=1.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"
#include "vulkan_engine_support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::argmax;
using test::read_all;
using test::rewrite_in_place;
using test::greedy;
using test::Greedy;
using test::chunked;
using test::copy;
using test::cpu_options;
using test::long_tokens;

EngineOptions device_options(Backend* be, const std::string& path = "") {
  EngineOptions eo = cpu_options("stories260K");
  if (!path.empty()) eo.model_path = path;
  eo.backend = be;
  return eo;
}

// One layer's streaming window: its device buffer and its host copy (the largest of each).
uint64_t window_of(Engine& e) {
  const DeviceFootprint d = *e.footprint().device;
  uint64_t dev = 0, host = 0;
  for (int l = 0; l < e.model().n_layers(); ++l) {
    dev = std::max(dev, d.weights_per_layer[static_cast<size_t>(l)]);
    host = std::max(host, e.model().layer_unit(l).bytes());
  }
  return dev + host;
}

// What the engine holds without any device layer (every layer resident when called).
uint64_t base_of(Engine& e) { return e.device()->held() - e.footprint().device->weights(); }

std::vector<int> dropped_layers(Engine& e) {
  std::vector<int> out;
  const DeviceFootprint d = *e.footprint().device;
  for (int l = 0; l < e.model().n_layers(); ++l)
    if (d.weights_per_layer[static_cast<size_t>(l)] == 0) out.push_back(l);
  return out;
}

// The order of the reader's reads and the step's waits, and every sample of
// what is held. With the gate, the step's wait on streamed layer a holds
// until the read of the next streamed layer has begun (10 s breaker).
struct StreamLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<char, int>> events;  // ('r', l): l's read begins; ('w', l): the step waits on l's submission
  std::vector<uint64_t> held;
  std::vector<int> streamed;  // this step's streamed layers, ascending (for the gate)
  bool gate = false;
  int breaker_fired = 0;

  bool read_begun(int l) const {
    return std::find(events.begin(), events.end(), std::pair<char, int>{'r', l}) != events.end();
  }
  DeviceStreamHooks hooks() {
    DeviceStreamHooks h;
    h.before_read = [this](int l, uint64_t b) {
      std::lock_guard lock(mu);
      events.emplace_back('r', l);
      held.push_back(b);
      cv.notify_all();
    };
    h.after_read = [this](int, uint64_t b) {
      std::lock_guard lock(mu);
      held.push_back(b);
    };
    h.after_submit = [this](int, uint64_t b) {
      std::lock_guard lock(mu);
      held.push_back(b);
    };
    h.before_wait = [this](int l) {
      std::unique_lock lock(mu);
      const auto next = std::upper_bound(streamed.begin(), streamed.end(), l);
      if (gate && next != streamed.end() &&
          !cv.wait_for(lock, std::chrono::seconds(10), [&] { return read_begun(*next); }))
        ++breaker_fired;
      events.emplace_back('w', l);
    };
    return h;
  }
  // Position of an event in the log (events.size() when absent).
  size_t at(char kind, int l) const {
    return static_cast<size_t>(std::find(events.begin(), events.end(), std::pair<char, int>{kind, l}) -
                               events.begin());
  }
};

// windows: 2, the limit holds two windows beside what is held; 1, only one.
void run_streaming(Backend* be, int windows) {
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 6);
  constexpr int kTokens = 8;
  Greedy want;
  {
    Engine ref(device_options(be));
    Session s(ref, chunked());
    want = greedy(s, prompt, kTokens, [] {});
  }
  Engine gpu(device_options(be));
  DeviceForward& dev = *gpu.device();
  const int nl = gpu.model().n_layers();
  Session s(gpu, chunked());
  s.feed(prompt);
  const uint64_t window = window_of(gpu), base = base_of(gpu);
  const uint64_t kv = gpu.footprint().device->kv;
  // Room for the KV to double twice, and for `windows` windows but not one more.
  const uint64_t margin = 3 * (kv + 4096);
  ASSERT_LT(margin, window) << "stories260K's KV margin must stay under a window for the test's limits";
  const uint64_t limit = base + static_cast<uint64_t>(windows) * window + margin;
  ASSERT_LT(limit, dev.held()) << "the limit must force an eviction";
  gpu.set_memory_limit(limit);
  ASSERT_GT(dev.n_dropped(), 0);
  ASSERT_LT(dev.n_dropped(), nl) << "some layers stay resident under the limit";
  s.clear();
  // A first step under the limit: it decides what streams and takes the windows.
  s.feed(prompt);
  EXPECT_EQ(dev.n_stream_windows(), windows);
  EXPECT_EQ(dev.n_stream_window_allocs(), windows);
  const std::vector<int> streamed = dropped_layers(gpu);
  ASSERT_GE(streamed.size(), 2u) << "two or more layers must stream for the order to show";
  ASSERT_LT(static_cast<int>(streamed.size()), nl + 1);
  EXPECT_EQ(dev.n_streamed_last_step(), static_cast<int64_t>(streamed.size()));

  StreamLog log;
  log.streamed = streamed;
  log.gate = windows == 2;
  dev.set_stream_hooks(log.hooks());
  s.clear();
  int steps = 0;
  const Greedy got = greedy(s, prompt, kTokens, [&] {
    ++steps;
    EXPECT_EQ(dev.n_streamed_last_step(), static_cast<int64_t>(streamed.size())) << "step " << steps;
    EXPECT_EQ(dev.n_stream_windows(), windows) << "step " << steps;
    EXPECT_LE(dev.held(), limit) << "step " << steps;
    std::lock_guard lock(log.mu);
    // This step's order: each streamed layer's read against the wait on the one before it.
    for (size_t i = 0; i + 1 < streamed.size(); ++i) {
      const int a = streamed[i], b = streamed[i + 1];
      ASSERT_LT(log.at('r', b), log.events.size()) << "layer " << b << " was not read (step " << steps << ")";
      ASSERT_LT(log.at('w', a), log.events.size()) << "layer " << a << " was not waited on (step " << steps << ")";
      if (windows == 2)
        EXPECT_LT(log.at('r', b), log.at('w', a)) << "read of layer " << b << " before the wait on layer " << a;
      else
        EXPECT_GT(log.at('r', b), log.at('w', a)) << "read of layer " << b << " after the wait on layer " << a;
    }
    log.events.clear();
  });
  EXPECT_EQ(log.breaker_fired, 0) << "the next layer's read never began while the step waited";
  EXPECT_EQ(got.tokens, want.tokens);
  for (size_t i = 0; i < got.logits.size(); ++i) EXPECT_EQ(got.logits[i], want.logits[i]) << "step " << i;
  // Every sample of what is held, at every read and submission, under the limit.
  ASSERT_GE(log.held.size(), static_cast<size_t>(3 * (kTokens + 1)) * streamed.size());
  for (uint64_t h : log.held) EXPECT_LE(h, limit);
  // The windows were taken once for all these steps and layers.
  EXPECT_EQ(dev.n_stream_window_allocs(), windows);
  // Lifted: the windows go with the next step, which streams nothing.
  gpu.set_memory_limit(0);
  s.clear();
  s.feed(prompt);
  EXPECT_EQ(dev.n_stream_windows(), 0);
  EXPECT_EQ(dev.n_streamed_last_step(), 0);
}

TEST(VulkanStream, TwoWindowsReadTheNextLayerWhileTheDeviceRunsThisOne) {
  EBB_REQUIRE_VULKAN(be);
  run_streaming(be, 2);
}

TEST(VulkanStream, OneWindowReadsEachLayerAfterTheOneBeforeIsWaitedOn) {
  EBB_REQUIRE_VULKAN(be);
  run_streaming(be, 1);
}

std::vector<float> prefill(Engine& e, const std::vector<int32_t>& prompt) {
  Session s(e, chunked());
  return copy(s.feed(prompt));
}

// A streamed layer whose read fails fails the step naming it; once the file
// holds the bytes that were loaded, the next step streams and computes what
// an unlimited engine does.
TEST(VulkanStream, AReadFailureNamesTheStreamedLayerAndTheNextStepWorks) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vk-stream");
  const std::string path = dir.file("model.gguf");
  std::filesystem::copy_file(test::model_path("stories260K.gguf"), path);
  const std::vector<char> original = read_all(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 6);
  Engine gpu(device_options(be, path));
  const std::vector<float> want = prefill(gpu, prompt);
  const uint64_t limit = base_of(gpu) + 2 * window_of(gpu) + 4 * (gpu.footprint().device->kv + 4096);
  gpu.set_memory_limit(limit);
  EXPECT_EQ(prefill(gpu, prompt), want);  // the dropped layers that fit come back; the rest stream
  const std::vector<int> streamed = dropped_layers(gpu);
  ASSERT_FALSE(streamed.empty());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(original.size() / 2)), 0);
  try {
    prefill(gpu, prompt);
    ADD_FAILURE() << "a step read a truncated file";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer " + std::to_string(streamed.front()) + " could not be streamed to the device"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("changed on disk"), std::string::npos) << m;
  }
  EXPECT_LE(gpu.device()->held(), limit);
  rewrite_in_place(path, original, st.st_mtim);
  EXPECT_EQ(prefill(gpu, prompt), want);
  EXPECT_GT(gpu.device()->n_streamed_last_step(), 0);
  EXPECT_LE(gpu.device()->held(), limit);
}

}  // namespace
}  // namespace ebb
