// The engine on a Vulkan device (runtime/device_forward.h): weights and KV
// in device memory, prefill and decode steps recorded on one stream, logits
// read back and sampled on the host. Against ebb's CPU engine on the same
// model files: greedy continuations token by token, a session continued
// over several calls (and truncated), two sessions in one step, the device
// ledger back where it was once the engine is gone, and the command line
// (--device, -ngl, --verbose, bench speed). Skips without a Vulkan device
// unless EBB_TEST_REQUIRE_VULKAN=1 (vulkan_support.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "platform/error.h"
#include "runtime/batch.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"
#include "vulkan_engine_support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::nmse;
using test::argmax;
using test::cpu_options;

EngineOptions device_options(const std::string& model, Backend* be) {
  EngineOptions eo = cpu_options(model);
  eo.backend = be;
  return eo;
}

struct ModelCase {
  const char* model;
  double max_nmse;     // per decode step, against ebb's CPU engine
  double min_top1;     // share of steps whose top token agrees with the CPU's
  int exact_greedy;    // this many greedy tokens must equal the CPU's exactly
};

class VulkanEngine : public ::testing::TestWithParam<ModelCase> {};

// Greedy decoding on the device against the CPU engine: the CPU's greedy
// continuation is fed to both one token at a time (each a decode step on
// the device's matvec path after one prefill), and the logits of every step
// are compared; then the device decodes greedily on its own for
// `exact_greedy` tokens, which must be the CPU's.
TEST_P(VulkanEngine, GreedyDecodeMatchesTheCpuEngine) {
  EBB_REQUIRE_VULKAN(be);
  const ModelCase mc = GetParam();
  const std::vector<test::GoldenCase> golden = test::load_golden(mc.model);
  ASSERT_FALSE(golden.empty());
  const std::vector<int32_t>& prompt = golden[0].prompt_tokens;
  const int n_gen = 16;
  Engine cpu(cpu_options(mc.model));
  Engine gpu(device_options(mc.model, be));
  ASSERT_NE(gpu.device(), nullptr);
  EXPECT_EQ(gpu.device_id(), be->info().id);
  Session cs(cpu), gs(gpu);
  const std::span<const float> c0 = cs.feed(prompt);
  std::vector<float> c_logits(c0.begin(), c0.end());
  std::span<const float> g = gs.feed(prompt);
  double worst = nmse(g, c_logits);
  int agree = argmax(g) == argmax(c_logits), steps = 1;
  std::vector<int32_t> cpu_tokens;
  for (int i = 0; i < n_gen; ++i) {
    const int32_t next = argmax(c_logits);
    cpu_tokens.push_back(next);
    const std::span<const float> c = cs.feed({&next, 1});
    c_logits.assign(c.begin(), c.end());
    g = gs.feed({&next, 1});
    const double e = nmse(g, c_logits);
    worst = std::max(worst, e);
    EXPECT_LE(e, mc.max_nmse) << mc.model << " step " << i;
    agree += argmax(g) == argmax(c_logits);
    ++steps;
  }
  std::printf("%s: %d decode steps, worst NMSE vs ebb CPU %.3g, top token agrees at %d of %d\n", mc.model, n_gen,
              worst, agree, steps);
  EXPECT_GE(agree, mc.min_top1 * steps);
  // Free-running greedy decode on the device.
  Session free(gpu);
  std::span<const float> l = free.feed(prompt);
  for (int i = 0; i < mc.exact_greedy; ++i) {
    const int32_t next = argmax(l);
    ASSERT_EQ(next, cpu_tokens[i]) << mc.model << " greedy token " << i;
    l = free.feed({&next, 1});
  }
}

// Tolerances (NMSE per step; measured on lavapipe in the test's output).
// As test_vulkan_model: ebb's CPU engine pairs F16 weights with activations
// rounded to F16, BF16 with activations rounded to BF16, Q8_0/Q4_0 with
// activations quantised to Q8_0 and the K-quants (Q4_K_M: Q4_K and Q6_K;
// Q5_K_M: Q5_K and Q6_K, so every K-quant shader runs in a whole model) with
// activations quantised to Q8_K, where the
// shaders read the same blocks and multiply F32 activations. Both sides keep
// the KV in F16.
INSTANTIATE_TEST_SUITE_P(Models, VulkanEngine,
                         ::testing::Values(ModelCase{"stories260K", 1e-6, 1.0, 16},
                                           ModelCase{"stories260K-f16", 2e-5, 0.95, 8},
                                           ModelCase{"tiny-llama-f16", 2e-5, 0.9, 0},
                                           ModelCase{"tiny-qwen2-f16", 2e-5, 0.9, 0},
                                           ModelCase{"tiny-qwen3-f16", 2e-5, 0.9, 0},
                                           ModelCase{"tiny-llama-q8_0", 4e-3, 0.8, 0},
                                           ModelCase{"tiny-qwen3-q4_k_m", 4e-3, 0.8, 0},
                                           ModelCase{"tiny-qwen3-q5_k_m", 4e-3, 0.8, 0},
                                           ModelCase{"tiny-qwen3-bf16", 5e-4, 0.9, 0}),
                         [](const auto& info) {
                           std::string s = info.param.model;
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// A conversation over several calls: prefill in pieces (micro-batches of 4,
// a batch smaller than the prompt), decode steps, a truncation and a
// re-run of what was cut; every logits row against one CPU feed of it all.
TEST(VulkanEngineSession, ContinuedAcrossCallsAndTruncated) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<test::GoldenCase> golden = test::load_golden("stories260K");
  std::vector<int32_t> all = golden[0].prompt_tokens;
  for (int32_t t : golden[0].greedy_tokens) all.push_back(t);
  ASSERT_GE(all.size(), 12u);
  Engine cpu(cpu_options("stories260K"));
  EngineOptions eo = device_options("stories260K", be);
  eo.prefill_batch = 4;
  Engine gpu(eo);
  std::vector<float> ref;
  Session cs(cpu);
  cs.feed(all, &ref);
  const int64_t V = cpu.config().n_vocab;
  auto row = [&](size_t pos) { return std::span<const float>(ref.data() + pos * V, static_cast<size_t>(V)); };
  SessionOptions so;
  so.kv_chunk_size = 4;  // the device KV grows over several chunks
  Session gs(gpu, so);
  const size_t a = 5, b = 9;
  std::vector<float> rows;
  gs.feed({all.data(), a}, &rows);  // prefill 5 tokens in micro-batches of 4 + 1
  for (size_t p = 0; p < a; ++p)
    EXPECT_LE(nmse({rows.data() + p * V, static_cast<size_t>(V)}, row(p)), 1e-6) << "position " << p;
  EXPECT_LE(nmse(gs.feed({all.data() + a, b - a}), row(b - 1)), 1e-6);
  for (size_t p = b; p < all.size(); ++p) EXPECT_LE(nmse(gs.feed({&all[p], 1}), row(p)), 1e-6) << "position " << p;
  EXPECT_EQ(gs.n_processed(), static_cast<int64_t>(all.size()));
  // Cut back to 7 tokens and run the rest again: the device KV past 7 is rewritten.
  gs.truncate(7);
  EXPECT_LE(nmse(gs.feed({all.data() + 7, all.size() - 7}), row(all.size() - 1)), 1e-6);
}

// Two sessions in one step (run_step: one submission for both): each gets
// the logits it gets alone.
TEST(VulkanEngineSession, TwoSessionsInOneStep) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<test::GoldenCase> golden = test::load_golden("stories260K-f16");
  ASSERT_GE(golden.size(), 2u);
  Engine gpu(device_options("stories260K-f16", be));
  std::vector<std::vector<float>> alone;
  for (int i = 0; i < 2; ++i) {
    Session s(gpu);
    const std::span<const float> l = s.feed(golden[i].prompt_tokens);
    alone.emplace_back(l.begin(), l.end());
  }
  Session s0(gpu), s1(gpu);
  s0.append(golden[0].prompt_tokens);
  s1.append(golden[1].prompt_tokens);
  Session* both[] = {&s0, &s1};
  while (s0.n_pending() > 0 || s1.n_pending() > 0) ASSERT_GT(run_step(gpu, both), 0);
  EXPECT_LE(nmse(s0.last_logits(), alone[0]), 1e-10);
  EXPECT_LE(nmse(s1.last_logits(), alone[1]), 1e-10);
  EXPECT_EQ(argmax(s0.last_logits()), argmax(alone[0]));
  EXPECT_EQ(argmax(s1.last_logits()), argmax(alone[1]));
}

// Formats with a shader are uploaded as stored, not widened: each layer's
// device buffer is its matrices' bytes in the file's format and its norm
// vectors (qwen3: no biases), each piece aligned to 256 bytes, so a Q4_K_M
// model's layers take about a third of its F16 twin's.
TEST(VulkanEngineMemory, QuantisedWeightsKeepTheirStoredSize) {
  EBB_REQUIRE_VULKAN(be);
  auto aligned = [](uint64_t b) { return (b + 255) / 256 * 256; };
  auto device_weights = [&](const char* model) {
    Engine cpu(cpu_options(model));  // the shapes and formats, as the file stores them
    uint64_t want = 0;
    for (int l = 0; l < cpu.config().n_layer; ++l) {
      const LayerWeights w = cpu.model().layer(l);
      for (const WeightView* m : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down})
        want += aligned(row_bytes(m->type, m->cols) * static_cast<uint64_t>(m->rows));
      want += 2 * aligned(4 * static_cast<uint64_t>(cpu.config().n_embd)) +
              2 * aligned(4 * static_cast<uint64_t>(cpu.config().head_dim));
    }
    Engine gpu(device_options(model, be));
    EXPECT_TRUE(gpu.device()->converted().empty()) << model;
    const uint64_t got = gpu.footprint().device->weights();
    EXPECT_EQ(got, want) << model;
    return got;
  };
  const uint64_t f16 = device_weights("tiny-qwen3-f16");
  const uint64_t q4km = device_weights("tiny-qwen3-q4_k_m");
  device_weights("tiny-qwen3-q5_k_m");
  const uint64_t bf16 = device_weights("tiny-qwen3-bf16");
  EXPECT_LT(q4km, f16 * 0.4) << "Q4_K_M layers widened on the device";
  EXPECT_EQ(bf16, f16);
}

// Every device byte goes through the ledger: the engine's footprint says
// what the device holds, a session's KV is freed with it, and the ledger is
// back where it was once the engine is gone. The host keeps no layer.
TEST(VulkanEngineMemory, LedgerReturnsToWhereItWas) {
  EBB_REQUIRE_VULKAN(be);
  const MemoryLedger before = be->ledger(MemoryPlace::kDevice);
  {
    Engine gpu(device_options("tiny-llama-f16", be));
    Footprint f = gpu.footprint();
    ASSERT_TRUE(f.device.has_value());
    EXPECT_EQ(f.device->id, be->info().id);
    EXPECT_EQ(f.weights(), 0u) << "the host still holds layers";
    EXPECT_EQ(f.kv(), 0u);
    EXPECT_EQ(f.device->weights_per_layer.size(), static_cast<size_t>(gpu.config().n_layer));
    EXPECT_GE(f.device->weights(), gpu.model().weight_bytes() / 2);  // F16 layers (the head and embedding are globals)
    EXPECT_EQ(f.device->kv, 0u);
    const MemoryLedger loaded = be->ledger(MemoryPlace::kDevice);
    // Buffers are handed out whole (rounded up to the slab's alignment).
    EXPECT_GE(loaded.buffer_bytes - before.buffer_bytes, f.device->total());
    EXPECT_LE(loaded.buffer_bytes - before.buffer_bytes, f.device->total() + 4096 * (loaded.n_buffers - before.n_buffers));
    {
      Session s(gpu);
      s.feed(test::load_golden("tiny-llama-f16")[0].prompt_tokens);
      f = gpu.footprint();
      EXPECT_GT(f.device->kv, 0u);
      EXPECT_EQ(f.kv(), 0u) << "the KV is on the device, not the host";
      EXPECT_GT(be->ledger(MemoryPlace::kDevice).buffer_bytes, loaded.buffer_bytes);
    }
    EXPECT_EQ(gpu.footprint().device->kv, 0u);
    EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, loaded.buffer_bytes);
    EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, loaded.n_buffers);
  }
  const MemoryLedger after = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(after.buffer_bytes, before.buffer_bytes);
  EXPECT_EQ(after.n_buffers, before.n_buffers);
  EXPECT_EQ(after.slab_bytes, before.slab_bytes);
  EXPECT_EQ(after.n_slabs, before.n_slabs);
}

// Elastic memory on the device: evict() gives back whole layers' device
// buffers, then the session's KV (read back to the host: the host ledger
// grows by its rows, exactly; the ledger's delta is what it reports), a
// step after it uploads them again and computes the same logits, and
// restore() brings both ledgers back to exactly where they were.
TEST(VulkanEngineMemory, EvictRestoreGenerate) {
  EBB_REQUIRE_VULKAN(be);
  Engine gpu(device_options("tiny-llama-f16", be));
  const int64_t nl = gpu.config().n_layer;
  const std::vector<int32_t> prompt = test::load_golden("tiny-llama-f16")[0].prompt_tokens;
  Session s(gpu);
  const std::span<const float> l0 = s.feed(prompt);
  const std::vector<float> first(l0.begin(), l0.end());
  const int32_t next = argmax(first);
  const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
  const Footprint f = gpu.footprint();
  const int64_t host_before = gpu.ledger().total();
  // One byte: the last layer goes.
  EvictReport r = gpu.evict(1);
  EXPECT_EQ(r.weights_dropped, 1);
  EXPECT_EQ(r.freed, held.buffer_bytes - be->ledger(MemoryPlace::kDevice).buffer_bytes);
  EXPECT_GE(r.freed, f.device->weights_per_layer.back());
  EXPECT_EQ(gpu.footprint().device->weights_per_layer.back(), 0u);
  EXPECT_EQ(gpu.footprint().device->kv, f.device->kv) << "the weights gave enough";
  // All of them, then the KV: K and V of every layer and the chunk table leave the device.
  r = gpu.evict(UINT64_MAX);
  EXPECT_EQ(r.weights_dropped, nl - 1);
  EXPECT_EQ(gpu.footprint().device->weights(), 0u);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers - nl - (2 * nl + 1));
  EXPECT_GE(held.buffer_bytes - be->ledger(MemoryPlace::kDevice).buffer_bytes, f.device->weights() + f.device->kv);
  EXPECT_EQ(gpu.footprint().device->kv, 0u);
  EXPECT_EQ(gpu.device()->n_parked(), 1);
  const uint64_t rows = static_cast<uint64_t>(2 * nl * s.n_processed() * gpu.config().kv_dim()) * 2;
  EXPECT_EQ(gpu.footprint().device->kv_parked, rows) << "the positions held, K and V of every layer, F16";
  EXPECT_EQ(gpu.ledger().total() - host_before, static_cast<int64_t>(rows));
  // restore(): the device ledger exactly as it was, the host's too (its
  // transient copies of the layers are freed).
  const RestoreReport rr = gpu.restore();
  EXPECT_EQ(rr.weights_loaded, nl);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers);
  EXPECT_EQ(gpu.footprint().device->weights(), f.device->weights());
  EXPECT_EQ(gpu.footprint().device->kv, f.device->kv);
  EXPECT_EQ(gpu.footprint().device->kv_parked, 0u);
  EXPECT_EQ(gpu.device()->n_parked(), 0);
  EXPECT_EQ(gpu.ledger().total(), host_before);
  // Evicted again, a step uploads the layers first and computes what it did.
  gpu.evict(UINT64_MAX);
  {
    Session t(gpu);
    EXPECT_LE(nmse(t.feed(prompt), first), 0.0);
    EXPECT_EQ(gpu.footprint().device->weights(), f.device->weights());
    EXPECT_EQ(gpu.device()->n_parked(), 1) << "the first session's KV waits for its own step";
    // The first session continues on them (its KV uploaded first) as a fresh one runs it all.
    const std::span<const float> l1 = s.feed({&next, 1});
    EXPECT_EQ(gpu.device()->n_parked(), 0);
    std::vector<int32_t> longer = prompt;
    longer.push_back(next);
    Session u(gpu);
    EXPECT_LE(nmse(l1, u.feed(longer)), 1e-10);
  }
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers);
  EXPECT_EQ(gpu.ledger().total(), host_before);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// What the device path does not do yet is refused, naming why. (A split of
// the layers, -ngl N < n_layers, runs: test_vulkan_split.)
TEST(VulkanEngineErrors, WhatIsNotSupportedYetIsRefused) {
  EBB_REQUIRE_VULKAN(be);
  const std::string none = error_of([] {
    EngineOptions eo = cpu_options("stories260K");
    eo.device = "vulkan:7";
    Engine e(eo);
  });
  EXPECT_NE(none.find("vulkan:7"), std::string::npos) << none;
  EngineOptions eo = device_options("stories260K", be);
  eo.n_gpu_layers = 99;  // more than the model's layers: all
  Engine gpu(eo);
  EXPECT_EQ(gpu.elastic(), nullptr);  // the host's elastic memory; the device evicts its own layers
  // A memory limit works on the device (test_vulkan_limit); one no step could run under is refused.
  EXPECT_NE(error_of([&] { gpu.set_memory_limit(1); }).find("is below what a step needs"), std::string::npos);
  SessionOptions f32;
  f32.kv_type = DType::kF32;
  EXPECT_NE(error_of([&] { Session s(gpu, f32); }).find("F16 only"), std::string::npos);
}

// ---- the command line ----

using test::run_cli;

TEST(VulkanEngineCli, RunOnTheDeviceGivesTheCpuText) {
  EBB_REQUIRE_VULKAN(be);
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " -p Lily --temp 0 -n 24 --threads 1 ";
  const test::CliResult cpu = run_cli(m);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  for (const std::string dev : {"--device vulkan", "--device vulkan:0", "-ngl 99", "--device vulkan -ngl 5"}) {
    const test::CliResult r = run_cli(m + dev);
    EXPECT_EQ(r.status, 0) << dev << ": " << r.err;
    EXPECT_EQ(r.out, cpu.out) << dev;
  }
  const test::CliResult v = run_cli(m + "--device vulkan --verbose");
  EXPECT_EQ(v.status, 0) << v.err;
  EXPECT_NE(v.err.find("device: " + be->info().id), std::string::npos) << v.err;
  EXPECT_NE(v.err.find("holds weights"), std::string::npos) << v.err;
  // Formats without shaders are widened at load, said once, naming them
  // (Q5_0; not the file's Q6_K output head, which has a shader); formats
  // with shaders are uploaded as stored, and nothing is said.
  const test::CliResult k = run_cli("run -m " + test::model_path("tiny-qwen3-q5_0.gguf") +
                                    " -p Hi --temp 0 -n 2 --threads 1 --device vulkan");
  EXPECT_EQ(k.status, 0) << k.err;
  EXPECT_NE(k.err.find("no matrix kernels for Q5_0: those weights were dequantised to F16 at load"),
            std::string::npos)
      << k.err;
  for (const char* m : {"tiny-qwen3-q4_k_m.gguf", "tiny-qwen3-q5_k_m.gguf", "tiny-qwen3-bf16.gguf"}) {
    const test::CliResult q =
        run_cli("run -m " + test::model_path(m) + " -p Hi --temp 0 -n 2 --threads 1 --device vulkan");
    EXPECT_EQ(q.status, 0) << m << ": " << q.err;
    EXPECT_EQ(q.err.find("dequantised"), std::string::npos) << m << ": " << q.err;
  }
}

TEST(VulkanEngineCli, DeviceErrors) {
  EBB_REQUIRE_VULKAN(be);
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " -p Lily -n 2 --threads 1 ";
  test::CliResult r = run_cli(m + "--device vulkan:7");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("vulkan:7"), std::string::npos) << r.err;
  r = run_cli(m + "-ngl 2");  // stories260K has 5 layers: a split (test_vulkan_split), no longer refused
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(VulkanEngineCli, BenchSpeedRunsOnTheDevice) {
  EBB_REQUIRE_VULKAN(be);
  const test::CliResult r = run_cli("bench speed -m " + test::model_path("stories260K.gguf") +
                                    " -p 16 -n 4 --reps 1 --membw-mib 8 --threads 1 --device vulkan --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], be->info().id);
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_GT(j["device_bytes_per_token"].get<double>(), 0);
  // The bound is the host's bandwidth where the device shares its memory
  // (lavapipe), else unknown unless given.
  if (be->info().caps.unified_memory) {
    EXPECT_GT(j["device_decode_bound_tok_s"].get<double>(), 0);
  } else {
    EXPECT_NE(j["device_gbps_source"].get<std::string>().find("unknown"), std::string::npos);
  }
  const test::CliResult t = run_cli("bench speed -m " + test::model_path("stories260K.gguf") +
                                    " -p 16 -n 4 --reps 1 --membw-mib 0 --threads 1 --device vulkan --device-gbps 100");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("decode bound tok/s"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("--device-gbps"), std::string::npos) << t.out;
}

}  // namespace
}  // namespace ebb
