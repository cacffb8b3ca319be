// Restoration overlapped with the device's step (runtime/device_restore.h):
// a step that finds weight layers dropped by evict() runs the layers it has
// while a restore thread reads the others back. Against an engine that never
// evicted: the same logits bit for bit (same shaders, same weights), the
// ledgers back where they were; that the device is given work before the
// last dropped layer's read starts (a gate in the restore thread opened by
// the step's submission, not a clock); and a read that fails (file
// truncated, a byte changed) fails the step naming the layer, leaving the
// engine able to step again once the file is as it was. Skips without a
// Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
using test::read_all;
using test::rewrite_in_place;

// The restore thread holds layer `gate_layer`'s read until the step has
// submitted work to the device (or a deadlock breaker fires, which the
// tests report as "no overlap"): a synchronous restore never opens it.
struct OverlapGate {
  std::mutex mu;
  std::condition_variable cv;
  int gate_layer = -1;
  std::vector<int> submitted;  // the last layer of each submission before the last one
  std::vector<int> read;       // layers whose read started, in order
  bool opened = false;         // the gate opened because work was submitted
  DeviceRestoreHooks hooks() {
    DeviceRestoreHooks h;
    h.before_read = [this](int l) {
      std::unique_lock lock(mu);
      read.push_back(l);
      if (l != gate_layer) return;
      opened = cv.wait_for(lock, std::chrono::seconds(60), [&] { return !submitted.empty(); });
    };
    h.after_submit = [this](int l) {
      std::lock_guard lock(mu);
      submitted.push_back(l);
      cv.notify_all();
    };
    return h;
  }
};

class VulkanRestore : public ::testing::TestWithParam<const char*> {};

// Every layer evicted: the step reads layer 0, runs it while the later
// layers are read (the last layer's read waits for that submission), and
// computes the never-evicted engine's logits exactly.
TEST_P(VulkanRestore, EvictAllThenOverlappedPrefillIsExact) {
  EBB_REQUIRE_VULKAN(be);
  const std::string path = test::model_path(std::string(GetParam()) + ".gguf");
  const std::vector<int32_t> prompt = test::load_golden(GetParam())[0].prompt_tokens;
  std::vector<float> want;
  {
    Engine ref(test::device_options(path, be));
    want = prefill(ref, prompt);
  }
  Engine gpu(test::device_options(path, be));
  const int nl = static_cast<int>(gpu.config().n_layer);
  ASSERT_GE(nl, 2);
  const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
  const int64_t host_before = gpu.ledger().total();
  const uint64_t weights = gpu.footprint().device->weights();
  EXPECT_EQ(gpu.evict(UINT64_MAX).weights_dropped, nl);
  OverlapGate gate;
  gate.gate_layer = nl - 1;
  gpu.device()->set_restore_hooks(gate.hooks());
  EXPECT_EQ(prefill(gpu, prompt), want);  // bit-exact
  EXPECT_TRUE(gate.opened) << "the last layer's read started before any layer was submitted";
  ASSERT_FALSE(gate.submitted.empty());
  EXPECT_LT(gate.submitted.front(), nl - 1);
  std::vector<int> all(static_cast<size_t>(nl));
  for (int l = 0; l < nl; ++l) all[static_cast<size_t>(l)] = l;
  EXPECT_EQ(gate.read, all);  // each dropped layer read once, lowest first
  EXPECT_EQ(gpu.device()->n_dropped(), 0);
  EXPECT_EQ(gpu.footprint().device->weights(), weights);
  // The session is gone: both ledgers exactly as before the eviction.
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers);
  EXPECT_EQ(gpu.ledger().total(), host_before);
}

// The last half of the layers evicted: the resident half is submitted
// before the first dropped layer's read starts; the logits are exact and a
// second step (nothing dropped) needs no restore.
TEST_P(VulkanRestore, EvictPartThenOverlappedPrefillIsExact) {
  EBB_REQUIRE_VULKAN(be);
  const std::string path = test::model_path(std::string(GetParam()) + ".gguf");
  const std::vector<int32_t> prompt = test::load_golden(GetParam())[0].prompt_tokens;
  Engine gpu(test::device_options(path, be));
  const int nl = static_cast<int>(gpu.config().n_layer);
  const std::vector<float> want = prefill(gpu, prompt);
  const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
  const int64_t host_before = gpu.ledger().total();
  const std::vector<uint64_t> per_layer = gpu.footprint().device->weights_per_layer;
  uint64_t half = 0;
  for (int l = nl / 2; l < nl; ++l) half += per_layer[static_cast<size_t>(l)];
  const int dropped = static_cast<int>(gpu.evict(half).weights_dropped);
  ASSERT_EQ(dropped, nl - nl / 2);
  OverlapGate gate;
  gate.gate_layer = nl / 2;  // the first dropped layer
  gpu.device()->set_restore_hooks(gate.hooks());
  EXPECT_EQ(prefill(gpu, prompt), want);
  EXPECT_TRUE(gate.opened) << "the first dropped layer's read started before the resident layers were submitted";
  ASSERT_FALSE(gate.submitted.empty());
  EXPECT_EQ(gate.submitted.front(), nl / 2 - 1);  // every resident layer in the first submission
  EXPECT_EQ(static_cast<int>(gate.read.size()), dropped);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
  EXPECT_EQ(gpu.ledger().total(), host_before);
  gate.read.clear();
  EXPECT_EQ(prefill(gpu, prompt), want);
  EXPECT_TRUE(gate.read.empty());
}

INSTANTIATE_TEST_SUITE_P(Models, VulkanRestore, ::testing::Values("tiny-llama-f16", "tiny-qwen3-q4_k_m"));

// A read that fails fails the step naming the layer; the layers stay
// dropped (those before it are back), and once the file holds the bytes
// that were loaded a step restores the rest and computes what it did.
TEST(VulkanRestoreErrors, ReadErrorNamesTheLayerAndALaterStepWorks) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vk-restore");
  const std::string path = dir.file("model.gguf");
  std::filesystem::copy_file(test::model_path("tiny-llama-f16.gguf"), path);
  const std::vector<int32_t> prompt = test::load_golden("tiny-llama-f16")[0].prompt_tokens;
  const std::vector<char> original = read_all(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  Engine gpu(test::device_options(path, be));
  const int nl = static_cast<int>(gpu.config().n_layer);
  ASSERT_GE(nl, 2);
  const std::vector<float> want = prefill(gpu, prompt);
  const int64_t host_before = gpu.ledger().total();

  // Truncated: the file is not the one loaded; layer 0 (the first read) fails.
  gpu.evict(UINT64_MAX);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(original.size() / 2)), 0);
  std::string err = error_of([&] { prefill(gpu, prompt); });
  EXPECT_NE(err.find("layer 0 could not be restored"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("changed on disk"), std::string::npos) << err;
  EXPECT_EQ(gpu.device()->n_dropped(), nl);
  // The same through restore().
  err = error_of([&] { gpu.restore(); });
  EXPECT_NE(err.find("layer 0 could not be restored"), std::string::npos) << err;

  // Same size and mtime, one byte of layer 1's first tensor changed: layer 0
  // comes back, layer 1's checksum fails.
  std::vector<char> changed = original;
  const TensorSlot& t = gpu.model().layer_unit(1).slots().front();
  changed[t.file_offset + t.file_bytes / 2] ^= 0x40;
  rewrite_in_place(path, changed, st.st_mtim);
  err = error_of([&] { prefill(gpu, prompt); });
  EXPECT_NE(err.find("layer 1 could not be restored"), std::string::npos) << err;
  EXPECT_NE(err.find("CRC-32C"), std::string::npos) << err;
  EXPECT_EQ(gpu.device()->n_dropped(), nl - 1);

  // The loaded bytes again: the step restores the rest, the same logits.
  rewrite_in_place(path, original, st.st_mtim);
  EXPECT_EQ(prefill(gpu, prompt), want);
  EXPECT_EQ(gpu.device()->n_dropped(), 0);
  EXPECT_EQ(gpu.ledger().total(), host_before);
}

// `ebb bench ttft --device vulkan`: the resident row (the bound's prefill
// term), and per level the overlapped restore and the synchronous one, each
// with every dropped layer's bytes and the bound beside; the CPU systems'
// options are refused with --device.
TEST(VulkanRestoreBench, BenchTtftDeviceRows) {
  EBB_REQUIRE_VULKAN(be);
  const std::string model = test::model_path("tiny-llama-f16.gguf");
  const test::CliResult r = test::run_cli("bench ttft --device vulkan -m " + model +
                                          " --context 64 --remaining 0,100 --reps 1 --query 4 --storage-gbps 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(rows[0]["mode"], "resident");
  EXPECT_EQ(rows[0]["remaining_pct"], 100);
  const double prefill = rows[0]["ttft_s"];
  EXPECT_GT(prefill, 0.0);
  EXPECT_EQ(rows[1]["mode"], "overlap");
  EXPECT_EQ(rows[2]["mode"], "sync_restore");
  Engine e(test::device_options(model, nullptr));
  uint64_t file_bytes = 0;
  for (int l = 0; l < e.model().n_layers(); ++l) file_bytes += e.model().layer_unit(l).bytes();
  for (int i = 1; i <= 2; ++i) {
    const nlohmann::json& row = rows[static_cast<size_t>(i)];
    EXPECT_EQ(row["remaining_pct"], 0);
    EXPECT_EQ(row["context"], 64);
    EXPECT_EQ(row["layers_dropped"], e.model().n_layers());
    EXPECT_EQ(row["bytes_read"].get<uint64_t>(), file_bytes);
    EXPECT_DOUBLE_EQ(row["read_s"].get<double>(), static_cast<double>(file_bytes) / 1e9);
    EXPECT_DOUBLE_EQ(row["prefill_s"].get<double>(), prefill);
    EXPECT_DOUBLE_EQ(row["bound_s"].get<double>(), std::max(prefill, static_cast<double>(file_bytes) / 1e9));
    EXPECT_GT(row["ttft_s"].get<double>(), 0.0);
  }
  EXPECT_DOUBLE_EQ(rows[1]["gain_vs_sync"].get<double>(), rows[2]["ttft_s"].get<double>() / rows[1]["ttft_s"].get<double>());
  const test::CliResult bad = test::run_cli("bench ttft --device vulkan -m " + model + " --systems ebb");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--systems"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace ebb
