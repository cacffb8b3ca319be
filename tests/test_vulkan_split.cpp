// A split of the layers between the CPU and a Vulkan device (llama.cpp's
// -ngl N < n_layers: the first layers on the CPU, the last N and the output
// head on the device; runtime/device_plan.h) and -ngl auto within a device
// memory budget. Against ebb's CPU engine and the all-device engine on the
// same model files: a prefill, decode steps and a step of two sessions; the
// footprint split between host and device; auto picking the layers a budget
// fits; evict -> restore -> generate on both sides; the KV of a split
// meeting the host (the prefix cache and its persistent tier, forks, session
// files saved on a split and loaded on the CPU and the reverse); the command
// line.
// Skips without a Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "memory/prefix_cache.h"
#include "platform/error.h"
#include "runtime/batch.h"
#include "runtime/device_plan.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"
#include "vulkan_engine_support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::chunked;
using test::copy;
using test::long_tokens;
using test::nmse;
using test::argmax;
using test::cpu_options;

EngineOptions device_options(const std::string& model, Backend* be, int ngl) {
  EngineOptions eo = cpu_options(model);
  eo.backend = be;
  eo.n_gpu_layers = ngl;
  return eo;
}

// The bytes of layers [0, first)'s units (the CPU's part of a split).
uint64_t host_layer_bytes(const Engine& e, int first) {
  uint64_t t = 0;
  for (int l = 0; l < first; ++l) t += e.model().layer_unit(l).bytes();
  return t;
}

// Logits of a prefill and then `steps` decode steps of the given tokens.
std::vector<std::vector<float>> run_steps(Engine& e, const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& next) {
  Session s(e);
  std::vector<std::vector<float>> out;
  out.push_back(copy(s.feed(prompt)));
  for (int32_t t : next) out.push_back(copy(s.feed({&t, 1})));
  return out;
}

// Logits of two sessions stepped together (run_step: one step for both rows).
std::vector<std::vector<float>> run_two(Engine& e, const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  Session s0(e), s1(e);
  s0.append(a);
  s1.append(b);
  Session* both[] = {&s0, &s1};
  while (s0.n_pending() > 0 || s1.n_pending() > 0)
    if (run_step(e, both) <= 0) ADD_FAILURE() << "run_step made no progress";
  return {copy(s0.last_logits()), copy(s1.last_logits())};
}

struct SplitCase {
  const char* model;
  double max_nmse;  // per step, against the CPU engine and the all-device one (test_vulkan_engine's tolerances)
  double min_top1;  // share of steps whose top token is the CPU's
  bool best_isa = false;  // the CPU's best target (packed quantised layers) instead of scalar
};

class VulkanSplit : public ::testing::TestWithParam<SplitCase> {};

// -ngl 1, n/2 and n-1: each step's logits (a prefill, decode steps, and a
// step of two sessions) equal the all-CPU and the all-device engines' within
// the F16 tolerance (Q8_0's for a Q8_0 model), and the greedy token is theirs.
TEST_P(VulkanSplit, LayersOnBothSidesMatchCpuAndDevice) {
  EBB_REQUIRE_VULKAN(be);
  const SplitCase sc = GetParam();
  const std::vector<test::GoldenCase> golden = test::load_golden(sc.model);
  ASSERT_GE(golden.size(), 2u);
  const std::vector<int32_t>& prompt = golden[0].prompt_tokens;
  auto options = [&](int ngl) {
    EngineOptions eo = ngl == 0 ? cpu_options(sc.model) : device_options(sc.model, be, ngl);
    if (sc.best_isa) eo.isa.reset();
    return eo;
  };
  Engine cpu(options(0));
  const int nl = cpu.model().n_layers();
  ASSERT_GE(nl, 3) << "a split needs a model of several layers";
  // The CPU's greedy continuation, fed to every engine.
  std::vector<int32_t> next;
  {
    Session s(cpu);
    std::span<const float> l = s.feed(prompt);
    for (int i = 0; i < 6; ++i) {
      next.push_back(argmax(l));
      l = s.feed({&next.back(), 1});
    }
  }
  const auto ref_cpu = run_steps(cpu, prompt, next);
  const auto two_cpu = run_two(cpu, golden[0].prompt_tokens, golden[1].prompt_tokens);
  std::vector<std::vector<float>> ref_dev;
  {
    Engine dev(options(99));
    ASSERT_EQ(dev.device()->first_layer(), 0);
    ref_dev = run_steps(dev, prompt, next);
  }
  for (const int ngl : {1, nl / 2, nl - 1}) {
    Engine split(options(ngl));
    ASSERT_NE(split.device(), nullptr);
    ASSERT_EQ(split.device()->first_layer(), nl - ngl) << "llama.cpp's order: the last N layers on the GPU";
    ASSERT_EQ(split.device_plan()->n_device(), ngl);
    const auto got = run_steps(split, prompt, next);
    // The CPU's layers run with the CPU engine's kernels: packed where its target packs.
    int packed = 0;
    for (int l = 0; l < nl - ngl; ++l) {
      const std::vector<TensorSlot>& got_slots = split.model().layer_unit(l).slots();
      const std::vector<TensorSlot>& cpu_slots = cpu.model().layer_unit(l).slots();
      ASSERT_EQ(got_slots.size(), cpu_slots.size());
      for (size_t i = 0; i < got_slots.size(); ++i) {
        EXPECT_EQ(got_slots[i].packing, cpu_slots[i].packing) << "layer " << l << " " << got_slots[i].name;
        packed += got_slots[i].packing != Packing::kRows;
      }
    }
    double worst = 0;
    int agree = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e_cpu = nmse(got[i], ref_cpu[i]), e_dev = nmse(got[i], ref_dev[i]);
      worst = std::max({worst, e_cpu, e_dev});
      EXPECT_LE(e_cpu, sc.max_nmse) << sc.model << " -ngl " << ngl << " step " << i << " vs CPU";
      EXPECT_LE(e_dev, sc.max_nmse) << sc.model << " -ngl " << ngl << " step " << i << " vs device";
      agree += argmax(got[i]) == argmax(ref_cpu[i]);
    }
    EXPECT_GE(agree, sc.min_top1 * static_cast<double>(got.size())) << sc.model << " -ngl " << ngl;
    // Two sessions in one step: each as the CPU's (the first alone is got[0]).
    const auto two = run_two(split, golden[0].prompt_tokens, golden[1].prompt_tokens);
    EXPECT_LE(nmse(two[0], got[0]), 1e-10) << sc.model << " -ngl " << ngl;
    for (int i = 0; i < 2; ++i)
      EXPECT_LE(nmse(two[i], two_cpu[i]), sc.max_nmse) << sc.model << " -ngl " << ngl << " session " << i;
    if (ngl == nl / 2) {
      // Evicted on both sides, the next step restores them (the CPU's
      // layers packed again on the way) and computes the same prefill.
      const EvictReport r = split.evict(UINT64_MAX);
      EXPECT_EQ(r.weights_dropped, nl);
      EXPECT_LE(nmse(run_steps(split, prompt, {})[0], got[0]), 0.0) << sc.model << " after evict";
    }
    std::printf("%s -ngl %d of %d: worst NMSE vs CPU or device over %zu steps %.3g, top token = CPU's at %d; "
                "%d matrices of the CPU's layers packed\n",
                sc.model, ngl, nl, got.size(), worst, agree, packed);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, VulkanSplit,
                         ::testing::Values(SplitCase{"stories260K-f16", 2e-5, 1.0}, SplitCase{"tiny-llama-f16", 2e-5, 1.0},
                                           SplitCase{"tiny-qwen2-f16", 2e-5, 1.0},
                                           // Q8_0 on the CPU's best target: its layers packed, activations
                                           // quantised to Q8_0 (the shaders multiply F32 ones).
                                           SplitCase{"tiny-llama-q8_0", 4e-3, 0.8, true}),
                         [](const auto& info) {
                           std::string s = info.param.model;
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// The footprint splits: the host holds the CPU layers' weights and KV, the
// device the rest (each layer's device bytes as the plan counted them), and
// the device ledger is back where it was once the engine has gone.
TEST(VulkanSplitMemory, FootprintSplitsBetweenHostAndDevice) {
  EBB_REQUIRE_VULKAN(be);
  const MemoryLedger before = be->ledger(MemoryPlace::kDevice);
  {
    Engine e(device_options("tiny-llama-f16", be, 2));
    const int nl = e.model().n_layers(), first = nl - 2;
    ASSERT_EQ(e.device()->first_layer(), first);
    Session s(e);
    s.feed(test::load_golden("tiny-llama-f16")[0].prompt_tokens);
    const Footprint f = e.footprint();
    ASSERT_TRUE(f.device.has_value());
    for (int l = 0; l < nl; ++l) {
      const bool host = l < first;
      EXPECT_EQ(f.weights_per_layer[l] > 0, host) << "layer " << l;
      EXPECT_EQ(f.kv_per_layer[l] > 0, host) << "layer " << l;
      EXPECT_EQ(f.device->weights_per_layer[l] > 0, !host) << "layer " << l;
      if (!host) {
        EXPECT_EQ(f.device->weights_per_layer[l], device_layer_weight_bytes(*be, e.model(), l, 64)) << "layer " << l;
      }
    }
    EXPECT_GT(f.device->kv, 0u);
    EXPECT_EQ(f.weights(), host_layer_bytes(e, first));
    const DevicePlan& p = *e.device_plan();
    EXPECT_FALSE(p.automatic);
    EXPECT_NE(p.summary(e.device_id()).find("2 of " + std::to_string(nl) + " layers"), std::string::npos)
        << p.summary(e.device_id());
    EXPECT_NE(p.summary(e.device_id()).find(std::to_string(first) + " on the CPU"), std::string::npos);
  }
  const MemoryLedger after = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(after.buffer_bytes, before.buffer_bytes);
  EXPECT_EQ(after.n_buffers, before.n_buffers);
}

// -ngl auto: a budget that fits the head, the scratch and k layers (weights
// and KV at the context) puts exactly the last k layers on the device.
TEST(VulkanSplitMemory, AutoPicksTheLayersTheBudgetFits) {
  EBB_REQUIRE_VULKAN(be);
  const std::string model = "stories260K-f16";
  EngineOptions all = device_options(model, be, 99);
  all.device_context = 128;
  DevicePlan p;
  {
    Engine e(all);
    p = *e.device_plan();
  }
  const int nl = p.n_layers;
  ASSERT_GE(nl, 3);
  for (const int k : {1, 2, nl}) {
    uint64_t budget = p.fixed;
    for (int l = nl - k; l < nl; ++l) budget += p.layer_bytes[l];
    // Room for half another layer, not a whole one.
    if (k < nl) budget += p.layer_bytes[nl - k - 1] / 2;
    EngineOptions eo = device_options(model, be, -1);
    eo.device_context = 128;
    eo.device_memory = budget;
    Engine e(eo);
    EXPECT_EQ(e.device()->first_layer(), nl - k) << "budget " << budget;
    EXPECT_TRUE(e.device_plan()->automatic);
    EXPECT_LE(e.device_plan()->device_bytes(), budget);
    Session s(e);
    EXPECT_EQ(s.feed(test::load_golden(model)[0].prompt_tokens).size(), static_cast<size_t>(e.config().n_vocab));
  }
  // Less than the head, the scratch and one layer: refused, naming the sizes.
  EngineOptions eo = device_options(model, be, -1);
  eo.device_context = 128;
  eo.device_memory = p.fixed + p.layer_bytes.back() - 1;
  try {
    Engine e(eo);
    ADD_FAILURE() << "a budget that holds no layer was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("holds no layer"), std::string::npos) << err.what();
  }
}

// Elastic memory on a split engine: evict() drops the device's layers (the
// last first), then the session's device KV (read back to the host), then
// the CPU's layers (the CPU layers' KV stays in the host cache); restore()
// brings all back with both ledgers exactly where they were; the next step
// after an eviction restores first and computes the same logits.
TEST(VulkanSplitMemory, EvictRestoreGenerate) {
  EBB_REQUIRE_VULKAN(be);
  Engine e(device_options("tiny-llama-f16", be, 2));
  const int nl = e.model().n_layers(), first = nl - 2;
  const std::vector<int32_t> prompt = test::load_golden("tiny-llama-f16")[0].prompt_tokens;
  Session s(e);
  const std::vector<float> logits = copy(s.feed(prompt));
  const int32_t next = argmax(logits);
  const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
  const int64_t host_held = e.ledger().total();
  const Footprint f = e.footprint();
  EvictReport r = e.evict(1);  // one byte: the last layer, on the device
  EXPECT_EQ(r.weights_dropped, 1);
  EXPECT_EQ(r.freed, held.buffer_bytes - be->ledger(MemoryPlace::kDevice).buffer_bytes);
  EXPECT_EQ(e.footprint().weights(), f.weights()) << "the CPU's layers stay while the device gives enough";
  const uint64_t dev_after_one = be->ledger(MemoryPlace::kDevice).buffer_bytes;
  r = e.evict(UINT64_MAX);  // everything: the other device layer, then the CPU's
  EXPECT_EQ(r.weights_dropped, nl - 1);
  EXPECT_EQ(e.footprint().device->weights(), 0u);
  EXPECT_EQ(e.footprint().weights(), 0u);
  EXPECT_EQ(e.footprint().weights_stored, f.weights()) << "the CPU's dropped layers, backed by the GGUF";
  // What it reports: the device ledger's delta (the device KV's bytes
  // among them) and the CPU layers' host bytes; the host ledger gives those
  // back and takes the device layers' KV rows, parked.
  EXPECT_EQ(r.freed, (dev_after_one - be->ledger(MemoryPlace::kDevice).buffer_bytes) + f.weights());
  EXPECT_GE(held.buffer_bytes - be->ledger(MemoryPlace::kDevice).buffer_bytes, f.device->weights() + f.device->kv);
  const uint64_t parked = static_cast<uint64_t>(2 * 2 * s.n_processed() * e.config().kv_dim()) * 2;  // 2 device layers
  EXPECT_EQ(e.footprint().device->kv, 0u);
  EXPECT_EQ(e.footprint().device->kv_parked, parked);
  EXPECT_EQ(host_held - e.ledger().total(), static_cast<int64_t>(f.weights()) - static_cast<int64_t>(parked));
  EXPECT_EQ(e.footprint().kv(), f.kv()) << "the CPU layers' KV stays in the host cache";
  const RestoreReport rr = e.restore();
  EXPECT_EQ(rr.weights_loaded, nl);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, held.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers);
  EXPECT_EQ(e.ledger().total(), host_held);
  EXPECT_EQ(e.footprint().weights(), f.weights());
  EXPECT_EQ(e.footprint().device->weights(), f.device->weights());
  EXPECT_EQ(e.footprint().device->kv, f.device->kv);
  EXPECT_EQ(e.footprint().device->kv_parked, 0u);
  EXPECT_EQ(e.footprint().weights_stored, 0u);
  // Evicted again: the next step brings both sides back first.
  e.evict(UINT64_MAX);
  EXPECT_EQ(e.device()->n_dropped(), nl);
  {
    Session t(e);
    EXPECT_LE(nmse(t.feed(prompt), logits), 0.0);
    EXPECT_EQ(e.device()->n_dropped(), 0);
    const std::vector<float> l1 = copy(s.feed({&next, 1}));
    std::vector<int32_t> longer = prompt;
    longer.push_back(next);
    Session u(e);
    EXPECT_LE(nmse(l1, u.feed(longer)), 1e-10);
  }
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, held.n_buffers);
  EXPECT_EQ(e.ledger().total(), host_held);
  EXPECT_EQ(e.footprint().weights(), host_layer_bytes(e, first));
}

// ---- the KV of a split meets the host (runtime/device_kv.h) ----
// stories260K (5 layers) at -ngl 2: layers 0-2 keep their KV in the host
// cache's chunks, layers 3-4 on the device; chunks of 4 tokens.

constexpr int kKvNgl = 2;

EngineOptions split_kv_options(Backend* be, bool prefix_cache = false) {
  EngineOptions eo = device_options("stories260K", be, kKvNgl);
  eo.prefix_cache = prefix_cache;
  return eo;
}

// A prefix published by one session on a split (the CPU layers' chunks
// shared, the device layers' read back) is taken by another (the CPU
// layers' chunks adopted, the device layers' uploaded; counted as reused,
// not run): its logits equal a cold prefill's on the split and the CPU
// engine's, after a decode step too.
TEST(VulkanSplitKv, APrefixCachedOnASplitIsReusedByAnotherSession) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<int32_t> all = long_tokens();
  ASSERT_GE(all.size(), 13u);
  const std::vector<int32_t> toks(all.begin(), all.begin() + 13);
  const std::vector<int32_t> first(all.begin(), all.begin() + 9);  // 2 whole chunks of 4
  Engine split(split_kv_options(be, /*prefix_cache=*/true));
  ASSERT_EQ(split.device()->first_layer(), split.model().n_layers() - kKvNgl);
  PrefixCache* pc = split.prefix_cache();
  ASSERT_NE(pc, nullptr) << "the prefix cache runs on a split";
  Session a(split, chunked());
  a.feed(first);
  EXPECT_EQ(pc->stats().inserted_chunks, 2);
  EXPECT_EQ(pc->covered(a.cache_key(), first), 8);
  Session b(split, chunked());
  const std::vector<float> lb = copy(b.feed(toks));
  EXPECT_EQ(b.reused_tokens(), 8);
  EXPECT_EQ(b.tokens_run(), 5);
  EXPECT_EQ(pc->stats().inserted_chunks, 3) << "b's third chunk is published";
  SessionOptions cold = chunked();
  cold.use_prefix_cache = false;
  Session c(split, cold);
  const std::vector<float> lc = copy(c.feed(toks));
  EXPECT_EQ(c.reused_tokens(), 0);
  EXPECT_LE(nmse(lb, lc), 1e-9);
  Engine cpu(cpu_options("stories260K"));
  Session r(cpu, chunked());
  const std::vector<float> lr = copy(r.feed(toks));
  EXPECT_LE(nmse(lb, lr), 1e-5);
  const int32_t next = argmax(lb);
  const std::vector<float> nb = copy(b.feed({&next, 1}));
  EXPECT_LE(nmse(nb, c.feed({&next, 1})), 1e-9);
  EXPECT_LE(nmse(nb, r.feed({&next, 1})), 1e-5);
  // The reused session's CPU layers hold the cache's chunks (shared), its
  // device layers their own copy on the device.
  EXPECT_GT(split.footprint().device->kv, 0u);
  EXPECT_GT(split.footprint().kv(), 0u);
}

// The persistent tier on a split: chunks published by one engine are
// written to the directory, and a second engine (another process's place)
// reads them back from there, the CPU layers' into its host cache and the
// device layers' up to the device.
TEST(VulkanSplitKv, ThePersistentTierSurvivesAnEngineRestart) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vksplitkv");
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> toks(all.begin(), all.begin() + 13);
  std::vector<float> ref;
  {
    EngineOptions eo = split_kv_options(be, true);
    eo.cache_dir = dir.path();
    Engine e(eo);
    Session a(e, chunked());
    ref = copy(a.feed(toks));
    EXPECT_EQ(a.reused_tokens(), 0);
    EXPECT_EQ(e.prefix_cache()->stats().inserted_chunks, 3);
  }
  EngineOptions eo = split_kv_options(be, true);
  eo.cache_dir = dir.path();
  Engine e(eo);
  Session b(e, chunked());
  EXPECT_LE(nmse(b.feed(toks), ref), 1e-9);
  EXPECT_EQ(b.reused_tokens(), 12);
  EXPECT_EQ(b.tokens_run(), 1);
  EXPECT_EQ(e.prefix_cache()->stats().read_from_store, 3);
}

// A fork on a split: the CPU layers' chunks shared copy-on-write, the device
// layers' copied on the device. The fork and the original continue
// differently, each equal to an unforked run; a fork before the end runs
// the rest; the device's KV bytes go with the sessions.
TEST(VulkanSplitKv, ForkThenTwoContinuationsEachEqualAnUnforkedRun) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 9);
  const std::vector<int32_t> cont1 = {all[9], all[10]}, cont2 = {all[11]};
  Engine e(split_kv_options(be));
  const MemoryLedger loaded = be->ledger(MemoryPlace::kDevice);
  {
    Session a(e, chunked());
    a.feed(prompt);
    Session b(e, chunked());
    b.fork_from(a, static_cast<int64_t>(prompt.size()));
    ASSERT_TRUE(b.has_logits());
    EXPECT_EQ(b.tokens(), a.tokens());
    EXPECT_EQ(b.n_processed(), a.n_processed());
    const std::vector<float> l1 = copy(b.feed(cont1));
    const std::vector<float> l2 = copy(a.feed(cont2));
    auto unforked = [&](const std::vector<int32_t>& tail) {
      std::vector<int32_t> t = prompt;
      t.insert(t.end(), tail.begin(), tail.end());
      Session s(e, chunked());
      return copy(s.feed(t));
    };
    EXPECT_LE(nmse(l1, unforked(cont1)), 1e-9);
    EXPECT_LE(nmse(l2, unforked(cont2)), 1e-9);
    EXPECT_GT(nmse(l1, l2), 1e-3) << "the two continuations differ";
    Session c(e, chunked());
    c.fork_from(a, 6);
    EXPECT_FALSE(c.has_logits());
    const std::vector<int32_t> rest(all.begin() + 6, all.begin() + 11);
    const std::vector<float> l3 = copy(c.feed(rest));
    EXPECT_EQ(c.tokens_run(), 5);
    EXPECT_LE(nmse(l3, unforked(cont1)), 1e-9);
  }
  EXPECT_EQ(e.footprint().device->kv, 0u);
  EXPECT_EQ(e.footprint().kv(), 0u);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, loaded.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, loaded.n_buffers);
}

// Session files on a split: the CPU layers' rows from the host cache, the
// device layers' read back, in the CPU's file format. Saved on a split,
// loaded on the CPU and on the whole device; saved on the CPU (F16 and F32
// rows), loaded on a split: same tokens, only the new token run, and its
// logits within F16 tolerance of a run on the loading side.
TEST(VulkanSplitKv, SaveOnASplitLoadOnTheCpuAndTheReverse) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vksplitkv");
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 10);
  const int32_t next = all[10];
  std::vector<int32_t> longer = prompt;
  longer.push_back(next);
  Engine cpu(cpu_options("stories260K"));
  Engine split(split_kv_options(be));
  std::vector<float> cpu_ref, split_ref;
  {
    Session s(cpu);
    cpu_ref = copy(s.feed(longer));
    Session t(split);
    split_ref = copy(t.feed(longer));
  }
  // Split -> CPU, split -> split, split -> the whole device.
  Session g(split, chunked());
  g.feed(prompt);
  g.save(dir.file("split.ebbs"));
  Session c(cpu);
  c.load(dir.file("split.ebbs"));
  EXPECT_EQ(c.tokens(), prompt);
  EXPECT_EQ(c.n_processed(), static_cast<int64_t>(prompt.size()));
  EXPECT_LE(nmse(c.feed({&next, 1}), cpu_ref), 1e-5);
  EXPECT_EQ(c.tokens_run(), 1) << "the KV came from the file";
  Session h(split, chunked(8));
  h.load(dir.file("split.ebbs"));
  EXPECT_LE(nmse(h.feed({&next, 1}), split_ref), 1e-9);
  EXPECT_EQ(h.tokens_run(), 1);
  {
    EngineOptions eo = cpu_options("stories260K");
    eo.backend = be;
    Engine whole(eo);
    ASSERT_EQ(whole.device()->first_layer(), 0);
    Session w(whole);
    w.load(dir.file("split.ebbs"));
    EXPECT_LE(nmse(w.feed({&next, 1}), split_ref), 1e-5);
    EXPECT_EQ(w.tokens_run(), 1);
  }
  // CPU -> split (F16 and F32 files).
  for (const DType type : {DType::kF16, DType::kF32}) {
    SessionOptions so;
    so.kv_type = type;
    Session s(cpu, so);
    s.feed(prompt);
    const std::string f = dir.file(std::string("cpu_") + std::string(dtype_name(type)) + ".ebbs");
    s.save(f);
    Session d(split, chunked(8));
    d.feed(std::vector<int32_t>{all[0], all[1], all[2]});  // something to replace
    d.load(f);
    EXPECT_EQ(d.tokens(), prompt);
    EXPECT_EQ(d.n_processed(), static_cast<int64_t>(prompt.size()));
    EXPECT_LE(nmse(d.feed({&next, 1}), split_ref), 1e-5) << dtype_name(type);
    EXPECT_EQ(d.tokens_run(), 3 + 1) << "3 before the load, then the new token only";
  }
}

// ---- the command line ----

using test::run_cli;

TEST(VulkanSplitCli, NglSplitsAndAutoFitsTheBudget) {
  EBB_REQUIRE_VULKAN(be);
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " -p Lily --temp 0 -n 24 --threads 1 ";
  const test::CliResult cpu = run_cli(m);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  // stories260K has 5 layers.
  for (const std::string ngl : {"1", "3", "4"}) {
    const test::CliResult r = run_cli(m + "-ngl " + ngl);
    EXPECT_EQ(r.status, 0) << ngl << ": " << r.err;
    EXPECT_EQ(r.out, cpu.out) << "-ngl " << ngl;
    EXPECT_NE(r.err.find(be->info().id + ": " + ngl + " of 5 layers"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::to_string(5 - std::stoi(ngl)) + " on the CPU"), std::string::npos) << r.err;
  }
  const test::CliResult a = run_cli(m + "-ngl auto");
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, cpu.out);
  EXPECT_NE(a.err.find("5 of 5 layers"), std::string::npos) << a.err;
  test::CliResult r = run_cli(m + "--device vulkan --device-memory 1K");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("holds no layer"), std::string::npos) << r.err;
  r = run_cli(m + "--device vulkan --device-memory 10%");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("not a percentage"), std::string::npos) << r.err;
  r = run_cli(m + "-ngl 2 --device-memory 1G");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("fixes the layers"), std::string::npos) << r.err;
  // bench speed on a split: the decode bound adds the CPU's layers at the host's bandwidth.
  r = run_cli("bench speed -m " + test::model_path("stories260K.gguf") +
              " -p 16 -n 4 --reps 1 --membw-mib 8 --threads 1 -ngl 2 --device-gbps 100 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["host_layer_bytes_per_token"].get<double>(), 0);
  EXPECT_GT(j["device_bytes_per_token"].get<double>(), 0);
  EXPECT_GT(j["mem_bw_gbps"].get<double>(), 0);
  const double bound = 1.0 / (j["device_bytes_per_token"].get<double>() / 100e9 +
                              j["host_layer_bytes_per_token"].get<double>() / (j["mem_bw_gbps"].get<double>() * 1e9));
  EXPECT_NEAR(j["device_decode_bound_tok_s"].get<double>(), bound, bound * 1e-9);
  r = run_cli(m + "-ngl lots");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("or auto"), std::string::npos) << r.err;
}

// The KV of a split on the command line: `ebb run -ngl 2 --cache-dir DIR`
// run twice gives the CPU's text both times, and the second run takes the
// prompt's whole chunks from DIR (its summary's "prompt N tok" counts only
// the rest); `ebb chat`'s /save on a split loads on the CPU with the same
// next turn.
TEST(VulkanSplitCli, CacheDirAndSessionFilesOnASplit) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vksplitcli");
  const std::string run = "run -m " + test::model_path("stories260K.gguf") +
                          " -p 'Once upon a time there was a little girl named Lily' --temp 0 -n 4 --threads 1 ";
  const test::CliResult cpu = run_cli(run);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  auto prompt_run = [](const std::string& err) {
    const size_t at = err.find("| prompt ");
    return at == std::string::npos ? -1 : std::stoi(err.substr(at + 9));
  };
  std::vector<int> ran;
  for (int i = 0; i < 2; ++i) {
    const test::CliResult r = run_cli(run + "-ngl 2 --kv-chunk 4 --cache-dir " + dir.file("kv"));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, cpu.out);
    ran.push_back(prompt_run(r.err));
  }
  EXPECT_GT(ran[0], 8);
  EXPECT_EQ(ran[1], ran[0] - (ran[0] - 1) / 4 * 4) << "the second run takes the whole chunks from the directory";
  const std::string chat = "chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 8 --threads 1 --quiet";
  const test::CliResult saved = run_cli(chat + " -ngl 2", "Lily and the cat\n/save " + dir.file("s.bin") + "\n");
  ASSERT_EQ(saved.status, 0) << saved.err;
  const std::string turn = "/load " + dir.file("s.bin") + "\nThe dog\n";
  const test::CliResult on_cpu = run_cli(chat, turn), on_split = run_cli(chat + " -ngl 2", turn);
  ASSERT_EQ(on_cpu.status, 0) << on_cpu.err;
  ASSERT_EQ(on_split.status, 0) << on_split.err;
  EXPECT_FALSE(on_cpu.out.empty());
  EXPECT_EQ(on_split.out, on_cpu.out);
}

}  // namespace
}  // namespace ebb
