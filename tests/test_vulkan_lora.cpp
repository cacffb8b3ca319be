// LoRA adapters on a Vulkan device (runtime/device_lora.h): a step whose
// sequences bind adapters computes what ebb's CPU engine computes, for
// every adapted projection (q k v o gate up down, the output head, and
// token_embd on the host's lookup), F16 and F32 pairs, odd ranks, several
// adapters per sequence, and different adapters (or none) per sequence in
// one batched step; each adapter version is uploaded once through the
// device's ledger and freed when it is replaced or unloaded; `ebb run
// --device vulkan --lora` gives the CPU's text. Skips without a Vulkan
// device unless EBB_TEST_REQUIRE_VULKAN=1 (vulkan_support.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "model/lora.h"
#include "platform/fp16.h"
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

std::string lora_path(const std::string& name) { return test::shared_path("golden/lora/" + name); }

EngineOptions device_options(const std::string& model, Backend* be) {
  EngineOptions eo = cpu_options(model);
  eo.backend = be;
  return eo;
}

// One synthesised pair: random A (std 1/sqrt(n_in)) and B (std b_std), in
// F32 or F16 (values rounded to F16 first, so both engines hold the same).
LoraPair random_pair(const ModelConfig& c, Allocator& alloc, int layer, LoraTarget t, int64_t rank, DType type,
                     float b_std, std::mt19937_64& rng) {
  LoraPair p;
  p.layer = layer;
  p.target = t;
  p.rank = rank;
  lora_expected_shape(c, t, &p.n_in, &p.n_out);
  p.scale = 1.5f / static_cast<float>(rank);
  p.dtype = type;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t esz = type == DType::kF16 ? 2 : 4;
  p.a = alloc.allocate(static_cast<size_t>(rank * p.n_in) * esz, MemCategory::kAdapter);
  p.bt = alloc.allocate(static_cast<size_t>(rank * p.n_out) * esz, MemCategory::kAdapter);
  const float a_std = t == LoraTarget::kTokenEmbd ? 0.5f : 1.0f / std::sqrt(static_cast<float>(p.n_in));
  auto fill = [&](Buffer& b, int64_t n, float sd) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = sd * normal(rng);
      if (type == DType::kF16) b.as<uint16_t>()[i] = fp32_to_fp16(v);
      else b.as<float>()[i] = v;
    }
  };
  fill(p.a, rank * p.n_in, a_std);
  fill(p.bt, rank * p.n_out, b_std);
  return p;
}

// An adapter on every target: the layers' seven with an odd rank (the
// device pads it to even) in F32, the output head in F16, token_embd in F32
// (as the loaders keep it).
std::unique_ptr<LoraAdapter> synth_all_targets(const ModelConfig& c, Allocator& alloc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto ad = std::make_unique<LoraAdapter>();
  ad->source = "(test)";
  ad->format = "gguf";
  for (int l = 0; l < c.n_layer; ++l)
    for (int t = 0; t < kLoraLayerTargets; ++t)
      ad->pairs.push_back(random_pair(c, alloc, l, static_cast<LoraTarget>(t), 3, DType::kF32, 0.05f, rng));
  ad->pairs.push_back(random_pair(c, alloc, -1, LoraTarget::kOutput, 5, DType::kF16, 0.05f, rng));
  ad->pairs.push_back(random_pair(c, alloc, -1, LoraTarget::kTokenEmbd, 4, DType::kF32, 0.05f, rng));
  ad->digest = seed;
  ad->index(static_cast<int>(c.n_layer));
  return ad;
}

// A rank-4 adapter on q and down only, F32: a new version each seed.
std::unique_ptr<LoraAdapter> synth_small(const ModelConfig& c, Allocator& alloc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto ad = std::make_unique<LoraAdapter>();
  ad->source = "(test)";
  ad->format = "gguf";
  for (int l = 0; l < c.n_layer; ++l) {
    ad->pairs.push_back(random_pair(c, alloc, l, LoraTarget::kQ, 4, DType::kF32, 0.05f, rng));
    ad->pairs.push_back(random_pair(c, alloc, l, LoraTarget::kDown, 4, DType::kF32, 0.05f, rng));
  }
  ad->digest = seed;
  ad->index(static_cast<int>(c.n_layer));
  return ad;
}

struct LoraCase {
  const char* name;
  const char* model;
  // Files in golden/lora with their scales; "synth": synth_all_targets at 0.8.
  std::vector<std::pair<std::string, float>> adapters;
  double max_nmse;  // per step, against ebb's CPU engine with the same adapters
};

// Loads the case's adapters into an engine; returns the bindings.
std::vector<AdapterBinding> load_adapters(Engine& e, const LoraCase& lc) {
  std::vector<AdapterBinding> b;
  for (const auto& [file, scale] : lc.adapters) {
    if (file == "synth") {
      e.adapters().add("synth", synth_all_targets(e.config(), e.allocator(), 7), true);
      b.push_back({"synth", scale});
    } else {
      b.push_back({e.adapters().load(lora_path(file)).name, scale});
    }
  }
  return b;
}

class VulkanLora : public ::testing::TestWithParam<LoraCase> {};

// A prefill and 8 decode steps (the CPU's greedy tokens fed to both) with
// the adapters bound: every step's logits against the CPU engine's.
TEST_P(VulkanLora, StepsMatchTheCpuEngine) {
  EBB_REQUIRE_VULKAN(be);
  const LoraCase lc = GetParam();
  const std::vector<int32_t> prompt = test::load_golden(lc.model)[0].prompt_tokens;
  Engine cpu(cpu_options(lc.model));
  Engine gpu(device_options(lc.model, be));
  Session cs(cpu), gs(gpu), base(gpu);
  cs.set_adapters(load_adapters(cpu, lc));
  gs.set_adapters(load_adapters(gpu, lc));
  const std::span<const float> c0 = cs.feed(prompt);
  std::vector<float> c_logits(c0.begin(), c0.end());
  std::span<const float> g = gs.feed(prompt);
  double worst = nmse(g, c_logits);
  EXPECT_LE(worst, lc.max_nmse) << "prefill";
  int agree = argmax(g) == argmax(c_logits);
  // The adapters change the result (the comparison is not of the base model with itself).
  const std::span<const float> b = base.feed(prompt);
  const double moved = nmse(b, c_logits);
  EXPECT_GT(moved, 100 * lc.max_nmse) << "the adapters barely change the logits";
  const int n_gen = 8;
  for (int i = 0; i < n_gen; ++i) {
    const int32_t next = argmax(c_logits);
    const std::span<const float> c = cs.feed({&next, 1});
    c_logits.assign(c.begin(), c.end());
    g = gs.feed({&next, 1});
    const double e = nmse(g, c_logits);
    worst = std::max(worst, e);
    EXPECT_LE(e, lc.max_nmse) << lc.name << " decode step " << i;
    agree += argmax(g) == argmax(c_logits);
  }
  std::printf("%s: worst NMSE vs ebb CPU %.3g over a prefill and %d decode steps (base model vs adapted: %.3g), "
              "top token agrees at %d of %d\n",
              lc.name, worst, n_gen, moved, agree, n_gen + 1);
  EXPECT_GE(agree, n_gen);  // at most one near-tie may differ
  EXPECT_EQ(gpu.device()->n_adapter_uploads(), static_cast<int64_t>(lc.adapters.size()));
}

// Tolerances as test_vulkan_engine's for the same models: the adapters'
// products are F32 on both sides (F16 pairs widened exactly).
INSTANTIATE_TEST_SUITE_P(Adapters, VulkanLora,
                         ::testing::Values(LoraCase{"stories260K_golden_r4", "stories260K",
                                                    {{"stories260K.lora-r4.gguf", 1.0f}}, 1e-6},
                                           LoraCase{"tiny_qwen3_f16_two_adapters", "tiny-qwen3-f16",
                                                    {{"tiny-qwen3.lora-r8-f16.gguf", 1.0f},
                                                     {"tiny-qwen3.lora-r4-qv.gguf", -0.7f}},
                                                    2e-5},
                                           LoraCase{"tiny_llama_f16_every_target", "tiny-llama-f16",
                                                    {{"synth", 0.8f}}, 2e-5}),
                         [](const auto& info) { return std::string(info.param.name); });

// Four sessions in one batched step: two binding the same adapter (their
// rows share one product), one another adapter at a negative scale, one
// none. Each gets the logits the CPU engine gives it alone, after the
// prefill step and after a decode step of all four.
TEST(VulkanLoraBatch, DifferentAdaptersInOneStep) {
  EBB_REQUIRE_VULKAN(be);
  const std::string model = "tiny-qwen3-f16";
  const std::vector<test::GoldenCase> golden = test::load_golden(model);
  ASSERT_GE(golden.size(), 2u);
  Engine cpu(cpu_options(model));
  Engine gpu(device_options(model, be));
  for (Engine* e : {&cpu, &gpu}) {
    e->adapters().load(lora_path("tiny-qwen3.lora-r8-f16.gguf"), "a");
    e->adapters().load(lora_path("tiny-qwen3.lora-r4-qv.gguf"), "b");
  }
  const std::vector<std::vector<AdapterBinding>> binds = {{{"a", 1.0f}}, {{"a", 1.0f}}, {{"b", -0.7f}}, {}};
  const std::vector<const std::vector<int32_t>*> prompts = {&golden[0].prompt_tokens, &golden[1].prompt_tokens,
                                                            &golden[0].prompt_tokens, &golden[1].prompt_tokens};
  std::vector<std::vector<float>> want, want_next;
  std::vector<int32_t> next;
  for (size_t i = 0; i < binds.size(); ++i) {
    Session s(cpu);
    s.set_adapters(binds[i]);
    const std::span<const float> l = s.feed(*prompts[i]);
    want.emplace_back(l.begin(), l.end());
    next.push_back(argmax(l));
    const std::span<const float> l2 = s.feed({&next.back(), 1});
    want_next.emplace_back(l2.begin(), l2.end());
  }
  std::vector<std::unique_ptr<Session>> ss;
  std::vector<Session*> all;
  for (size_t i = 0; i < binds.size(); ++i) {
    ss.push_back(std::make_unique<Session>(gpu));
    ss.back()->set_adapters(binds[i]);
    ss.back()->append(*prompts[i]);
    all.push_back(ss.back().get());
  }
  auto pending = [&] {
    for (Session* s : all)
      if (s->n_pending() > 0) return true;
    return false;
  };
  while (pending()) ASSERT_GT(run_step(gpu, all), 0);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_LE(nmse(all[i]->last_logits(), want[i]), 2e-5) << "session " << i << " after the prefill";
    EXPECT_EQ(argmax(all[i]->last_logits()), argmax(want[i])) << "session " << i;
  }
  // One decode step of all four: one row each, one step.
  for (size_t i = 0; i < all.size(); ++i) all[i]->append({&next[i], 1});
  ASSERT_EQ(run_step(gpu, all), 4);
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_LE(nmse(all[i]->last_logits(), want_next[i]), 2e-5) << "session " << i << " after a decode step";
  EXPECT_EQ(gpu.device()->n_adapter_uploads(), 2);
  // That step's LoRA ops: two per term (t = A x; y += s B t at y's row
  // stride, one dispatch), sessions 0 and 1 together (the same terms), 2
  // on its own, none for 3. Before the fused up-projection: three per term,
  // or two and one add per row where y's rows were wider than the term.
  int64_t terms = 0;
  for (const char* name : {"a", "b"}) {
    const std::vector<AdapterBinding> bind = {{name, 1.0f}};
    for (const ActiveAdapter& a : gpu.adapters().resolve(bind))
      for (const LoraPair& p : a.v->lora->pairs) terms += p.target != LoraTarget::kTokenEmbd;
  }
  EXPECT_GT(terms, 0);
  EXPECT_EQ(gpu.device()->n_lora_ops_last_step(), 2 * terms);
}

// Versions come and go: each new published version is uploaded by the
// step that first binds it and the one it replaced is freed there; an
// unloaded version leaves the device as soon as nobody holds it; the
// device ledger ends where it was before any adapter, plus the adapters'
// step scratch (planned once, kept).
TEST(VulkanLoraMemory, ReplacedAndUnloadedVersionsAreFreed) {
  EBB_REQUIRE_VULKAN(be);
  const std::string model = "stories260K";
  Engine gpu(device_options(model, be));
  const std::vector<int32_t> prompt = test::load_golden(model)[0].prompt_tokens;
  {
    Session warm(gpu);  // the base step's own buffers (a session's KV comes and goes)
    warm.feed(prompt);
  }
  const MemoryLedger before = be->ledger(MemoryPlace::kDevice);
  const uint64_t scratch_before = gpu.footprint().device->scratch;
  uint64_t first_bytes = 0;
  std::vector<float> previous;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    gpu.adapters().add("learned", synth_small(gpu.config(), gpu.allocator(), seed), /*publish=*/true);
    Session s(gpu);
    s.set_adapters({{"learned", 1.0f}});
    const std::span<const float> l = s.feed(prompt);
    EXPECT_NE(std::vector<float>(l.begin(), l.end()), previous) << "version " << seed << " ran the old weights";
    previous.assign(l.begin(), l.end());
    const DeviceFootprint f = *gpu.footprint().device;
    EXPECT_EQ(gpu.device()->n_adapter_uploads(), 1) << "version " << seed;
    EXPECT_GT(f.adapters, 0u);
    if (seed == 1) first_bytes = f.adapters;
    EXPECT_EQ(f.adapters, first_bytes) << "version " << seed << ": one version on the device, not " << seed;
    const MemoryLedger now = be->ledger(MemoryPlace::kDevice);
    EXPECT_EQ(now.n_buffers, before.n_buffers + 1 + 1 + 2 * gpu.config().n_layer + 1)
        << "the upload, t, the session's K and V per layer and its chunk table";
  }
  // Unloaded while nobody holds it: gone from the device at once.
  gpu.adapters().unload("learned");
  EXPECT_EQ(gpu.device()->n_adapter_uploads(), 0);
  const DeviceFootprint f = *gpu.footprint().device;
  EXPECT_EQ(f.adapters, 0u);
  const uint64_t lora_scratch = f.scratch - scratch_before;
  EXPECT_GT(lora_scratch, 0u);
  const MemoryLedger after = be->ledger(MemoryPlace::kDevice);
  EXPECT_EQ(after.n_buffers, before.n_buffers + 1);  // t (y += s B t needs no u)
  EXPECT_GE(after.buffer_bytes - before.buffer_bytes, lora_scratch);
  EXPECT_LE(after.buffer_bytes - before.buffer_bytes, lora_scratch + 4096);  // rounded to the slab's alignment
  // Unloaded while a session holds it (its turn's version): kept while it
  // does, freed by the next step once it lets go.
  gpu.adapters().add("held", synth_small(gpu.config(), gpu.allocator(), 9), true);
  {
    Session s(gpu);
    s.set_adapters({{"held", 1.0f}});
    s.feed(prompt);
    gpu.adapters().unload("held");
    EXPECT_EQ(gpu.device()->n_adapter_uploads(), 1) << "the session still holds it";
  }
  {
    Session t(gpu);  // the base model's step
    t.feed(prompt);
    EXPECT_EQ(gpu.device()->n_adapter_uploads(), 0);
    EXPECT_EQ(gpu.footprint().device->adapters, 0u);
  }
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, before.n_buffers + 1);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, after.buffer_bytes);
}

// ---- the command line ----

// `ebb run --device vulkan --lora` greedy text equals the CPU's, with the
// golden adapter (its reference engine's greedy text too), and at a scale.
TEST(VulkanLoraCli, RunWithAnAdapterGivesTheCpuText) {
  EBB_REQUIRE_VULKAN(be);
  const test::GoldenCase golden = test::load_golden_file(lora_path("stories260K.lora-r4.jsonl"))[0];
  for (const std::string& lora : {"--lora " + lora_path("stories260K.lora-r4.gguf"),
                                 "--lora-scaled " + lora_path("stories260K.lora-r4.gguf") + " 0.5"}) {
    const std::string m = "run -m " + test::model_path("stories260K.gguf") + " -p '" + golden.prompt +
                          "' --temp 0 -n 24 --threads 1 " + lora + " ";
    const test::CliResult cpu = test::run_cli(m);
    ASSERT_EQ(cpu.status, 0) << cpu.err;
    const test::CliResult gpu = test::run_cli(m + "--device vulkan");
    ASSERT_EQ(gpu.status, 0) << gpu.err;
    EXPECT_EQ(gpu.out, cpu.out) << lora;
    if (lora.rfind("--lora ", 0) == 0) {  // at scale 1: the reference engine's greedy text, 24 tokens of it
      std::string text = gpu.out;
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      EXPECT_GT(text.size(), 40u);
      EXPECT_EQ(golden.greedy_text.rfind(text, 0), 0u) << text << "\nvs the golden\n" << golden.greedy_text;
    }
  }
}

// Training on an engine that runs on the device: it trains on the host's
// kernels over the base weights read from the GGUF's mapping, so the
// adapter it writes is the CPU engine's, byte for byte; then the device
// runs it as the CPU does.
TEST(VulkanLoraCli, TrainingOnADeviceEngineWritesTheCpusAdapter) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir d("ebb-vk-train");
  {
    std::ofstream f(d.file("train.jsonl"));
    for (const char* verb : {"ran", "sang", "jumped", "played"})
      f << "{\"text\": \"Once upon a time there was a fox named Zorbo. Zorbo " << verb << " in the park.\"}\n";
  }
  const std::string train = "train -m " + test::model_path("stories260K.gguf") + " --data " + d.file("train.jsonl") +
                            " --steps 3 --threads 1 -o ";
  const test::CliResult cpu = test::run_cli(train + d.file("cpu.gguf") + " --device cpu");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  const test::CliResult gpu = test::run_cli(train + d.file("gpu.gguf") + " --device vulkan");
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_FALSE(bytes(d.file("cpu.gguf")).empty());
  EXPECT_EQ(bytes(d.file("gpu.gguf")), bytes(d.file("cpu.gguf")));
  const std::string run = "run -m " + test::model_path("stories260K.gguf") +
                          " -p 'Once upon a time' --temp 0 -n 16 --threads 1 --lora " + d.file("gpu.gguf") + " ";
  const test::CliResult a = test::run_cli(run + "--device cpu"), b = test::run_cli(run + "--device vulkan");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(b.out, a.out);
}

}  // namespace
}  // namespace ebb
