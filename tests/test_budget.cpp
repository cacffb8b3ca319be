// Budget mode (FlexInfer): size parsing, the planner's rules, and logits that
// are bit-identical to the fully resident run under every budget and system.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "memory/budget_plan.h"
#include "memory/weight_streamer.h"
#include "platform/error.h"
#include "runtime/budget_mode.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

TEST(BudgetSize, ParsesUnitsAndPercent) {
  EXPECT_EQ(parse_size("600MiB", 0), 600ull << 20);
  EXPECT_EQ(parse_size("1.5GiB", 0), 3ull << 29);
  EXPECT_EQ(parse_size("2G", 0), 2ull << 30);
  EXPECT_EQ(parse_size("900MB", 0), 900000000ull);
  EXPECT_EQ(parse_size("4096", 0), 4096ull);
  EXPECT_EQ(parse_size("40%", 1000000), 400000ull);
  EXPECT_THROW(parse_size("lots", 0), Error);
  EXPECT_THROW(parse_size("12XB", 0), Error);
  EXPECT_THROW(parse_size("0", 0), Error);
}

std::unique_ptr<Engine> make(const std::string& model, const BudgetOptions& b = {}, int64_t batch = 4) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 1;
  o.prefill_batch = batch;
  o.budget = b;
  return std::make_unique<Engine>(o);
}

// Prompt in batches of 4 (several passes, all logits), then 4 decode steps.
std::vector<float> run_logits(Engine& e) {
  Session s(e);
  std::vector<TokenId> prompt = e.tokenizer().encode("Once upon a time there was a little");
  std::vector<float> all;
  s.feed(prompt, &all);
  for (TokenId t : {5, 17, 3, 42}) {
    auto l = s.feed(std::span<const TokenId>(&t, 1));
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

struct Bounds {
  uint64_t min = 0, all = 0;  // smallest possible plan; plan holding every tensor
};

Bounds bounds(Engine& ref) {
  BudgetOptions b;
  b.budget = std::numeric_limits<uint64_t>::max() / 4;
  b.system = BudgetSystem::kPrefetch;
  Bounds r;
  r.min = plan_for(ref.model(), ref.forward(), b, ref.options().kv_chunk_size).total();
  b.system = BudgetSystem::kEbb;
  r.all = plan_for(ref.model(), ref.forward(), b, ref.options().kv_chunk_size).total();
  return r;
}

uint64_t kind_bytes(const BudgetPlan& p, const WeightLayout& lay, std::initializer_list<int> kinds, bool preserved) {
  uint64_t t = 0;
  for (size_t l = 0; l < p.layers.size(); ++l)
    for (int k : kinds)
      if (p.layers[l].preserved[k] == preserved) t += lay.layers[l].slots()[k].file_bytes;
  return t;
}

TEST(BudgetPlanner, Algorithm1RulesAndWithinBudget) {
  auto ref = make("tiny-qwen3-f16.gguf");
  const Bounds bd = bounds(*ref);
  ASSERT_LT(bd.min, bd.all);
  const LayerLayout& ls = ref->model().layout().layer_slots[0];
  uint64_t prev_streamed = std::numeric_limits<uint64_t>::max();
  bool saw_partial = false;
  for (int i = 0; i <= 20; ++i) {
    BudgetOptions b;
    b.budget = bd.min + (bd.all - bd.min) * i / 20;
    const BudgetPlan p = plan_for(ref->model(), ref->forward(), b, ref->options().kv_chunk_size);
    EXPECT_LE(p.total(), b.budget) << "budget step " << i;
    // Balanced: layers differ by at most one preserved tensor.
    size_t lo = SIZE_MAX, hi = 0;
    for (const LayerPlan& lp : p.layers) {
      size_t n = 0;
      for (bool x : lp.preserved) n += x;
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    EXPECT_LE(hi - lo, 1u) << "budget step " << i;
    // FFN tensors are whole kinds: the same in every layer.
    for (int f : {ls.ffn_gate, ls.ffn_up, ls.ffn_down})
      for (const LayerPlan& lp : p.layers) EXPECT_EQ(lp.preserved[f], p.layers[0].preserved[f]);
    // Algorithm 1: all FFN kept while some attention streams only when the
    // FFN tensors fit together with half of the attention tensors.
    const WeightLayout& lay = ref->model().layout();
    const auto attn = {ls.attn_q, ls.attn_k, ls.attn_v, ls.attn_output};
    const auto ffn = {ls.ffn_gate, ls.ffn_up, ls.ffn_down};
    if (kind_bytes(p, lay, ffn, false) == 0 && kind_bytes(p, lay, attn, false) > 0) {
      const uint64_t attn_all = kind_bytes(p, lay, attn, false) + kind_bytes(p, lay, attn, true);
      const uint64_t head = p.head_preserved ? p.head_bytes : 0;
      EXPECT_GE(b.budget - (p.total() - p.resident_weight_bytes()) - head,
                kind_bytes(p, lay, ffn, true) + attn_all / 2)
          << "budget step " << i;
    }
    saw_partial |= p.streamed_per_token() > 0 && p.resident_weight_bytes() > 0;
    // More budget never streams more.
    EXPECT_LE(p.streamed_per_token(), prev_streamed) << "budget step " << i;
    prev_streamed = p.streamed_per_token();
  }
  EXPECT_TRUE(saw_partial);
  EXPECT_EQ(prev_streamed, 0u);  // the last budget holds everything

  BudgetOptions tiny;
  tiny.budget = bd.min - 1;
  try {
    plan_for(ref->model(), ref->forward(), tiny, ref->options().kv_chunk_size);
    FAIL() << "an impossible budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("below the minimum"), std::string::npos) << e.what();
  }
}

TEST(BudgetPlanner, VariantsFollowTheirOrder) {
  auto ref = make("tiny-qwen3-f16.gguf");
  const Bounds bd = bounds(*ref);
  const WeightLayout& lay = ref->model().layout();
  const LayerLayout& ls = lay.layer_slots[0];
  const auto attn = {ls.attn_q, ls.attn_k, ls.attn_v, ls.attn_output};
  const auto ffn = {ls.ffn_gate, ls.ffn_up, ls.ffn_down};
  for (int i = 1; i < 10; ++i) {
    BudgetOptions b;
    b.budget = bd.min + (bd.all - bd.min) * i / 10;
    b.system = BudgetSystem::kAttnFirst;
    const BudgetPlan pa = plan_for(ref->model(), ref->forward(), b, 256);
    b.system = BudgetSystem::kFfnFirst;
    const BudgetPlan pf = plan_for(ref->model(), ref->forward(), b, 256);
    b.system = BudgetSystem::kUnbalanced;
    const BudgetPlan pu = plan_for(ref->model(), ref->forward(), b, 256);
    // attn-first: an FFN tensor is kept only once every attention tensor is.
    if (kind_bytes(pa, lay, ffn, true) > 0) {
      EXPECT_EQ(kind_bytes(pa, lay, attn, false), 0u) << i;
    }
    // ffn-first keeps at least as many FFN bytes as attn-first.
    EXPECT_GE(kind_bytes(pf, lay, ffn, true), kind_bytes(pa, lay, ffn, true)) << i;
    // unbalanced: whole layers in order; only the last partly kept layer is partial.
    bool seen_partial = false;
    for (size_t l = 0; l < pu.layers.size(); ++l) {
      size_t kept = 0, big = 0;
      for (size_t s = 0; s < pu.layers[l].preserved.size(); ++s) {
        if (lay.layers[l].slots()[s].dims.size() < 2) continue;
        ++big;
        kept += pu.layers[l].preserved[s];
      }
      if (seen_partial) {
        EXPECT_EQ(kept, 0u) << "layer " << l << " at step " << i;
      }
      if (kept < big) seen_partial = true;
    }
    EXPECT_LE(pa.total(), b.budget);
    EXPECT_LE(pf.total(), b.budget);
    EXPECT_LE(pu.total(), b.budget);
  }
}

struct Case {
  const char* model;
};

class BudgetLogits : public testing::TestWithParam<Case> {};

TEST_P(BudgetLogits, BitIdenticalToResidentUnderEveryBudgetAndSystem) {
  auto ref = make(GetParam().model);
  const std::vector<float> want = run_logits(*ref);
  const Bounds bd = bounds(*ref);
  bool head_streamed = false, embd_streamed = false;
  const std::vector<BudgetSystem> all = {BudgetSystem::kEbb,       BudgetSystem::kSync,      BudgetSystem::kPrefetch,
                                         BudgetSystem::kUnbalanced, BudgetSystem::kAttnFirst, BudgetSystem::kFfnFirst,
                                         BudgetSystem::kMmap};
  for (double f : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    // Every system at the minimum, half way and everything; ebb in between too.
    const bool every = f == 0.0 || f == 0.5 || f == 1.0;
    for (BudgetSystem sys : every ? all : std::vector<BudgetSystem>{BudgetSystem::kEbb}) {
      BudgetOptions b;
      b.budget = bd.min + static_cast<uint64_t>((bd.all - bd.min) * f);
      b.system = sys;
      auto e = make(GetParam().model, b);
      const std::vector<float> got = run_logits(*e);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << budget_system_name(sys) << " at budget " << b.budget;
      if (auto* st = dynamic_cast<WeightStreamer*>(e->budget_source())) {
        head_streamed |= !st->plan().head_preserved;
        embd_streamed |= !st->plan().embd_preserved;
        // Everything the LLM holds went through the allocator and fits.
        EXPECT_LE(static_cast<uint64_t>(e->ledger().total()), b.budget) << budget_system_name(sys) << " " << f;
        if (st->plan().streamed_per_token() > 0) {
          EXPECT_GE(st->bytes_streamed(), st->plan().streamed_per_token());
        }
      }
    }
  }
  EXPECT_TRUE(head_streamed);
  EXPECT_TRUE(embd_streamed);
}

INSTANTIATE_TEST_SUITE_P(Models, BudgetLogits,
                         testing::Values(Case{"tiny-qwen3-f16.gguf"}, Case{"tiny-llama-q4_k_m.gguf"}, Case{"tiny-qwen3-q4_0.gguf"}, Case{"tiny-llama-q8_0.gguf"},
                                         Case{"tiny-qwen3-q5_k_m.gguf"}, Case{"stories260K.gguf"}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace ebb

namespace ebb {
namespace {

// Within budget for real: `ebb run --memory-budget` inside a memory cgroup
// (v1) whose limit is the budget plus the process's non-LLM memory, measured
// as the peak usage of the same command on stories260K (whose LLM memory is
// about 2 MiB): binary, libraries, tokenizer, thread stacks, page tables.
std::string cg_read(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

test::CliResult run_in_cgroup(const std::string& cg, uint64_t limit, const std::string& args) {
  std::filesystem::create_directory(cg);
  std::ofstream(cg + "/memory.limit_in_bytes") << limit;
  // run_cli prefixes the binary: let it print its help, then run ours in the cgroup.
  return test::run_cli("--help >/dev/null; sh -c 'echo $$ > " + cg + "/cgroup.procs && exec " + EBB_CLI_PATH +
                       " " + args + "'");
}

TEST(BudgetCgroup, RunStaysWithinBudgetUnderMemoryCgroup) {
  const std::string root = "/sys/fs/cgroup/memory";
  if (::access((root + "/cgroup.procs").c_str(), W_OK) != 0) GTEST_SKIP() << "cgroup v1 memory controller not writable";
  const std::string cg = root + "/ebb-test-budget-" + std::to_string(::getpid());
  const std::string gen = " -p \"Once upon a time\" -n 12 --temp 0 --seed 1 -t 1 -c 128";
  // Non-LLM allowance: the larger of two runs, so that one run's cold or
  // warm page cache does not decide it.
  uint64_t allowance = 0;
  for (int i = 0; i < 2; ++i) {
    auto base = run_in_cgroup(cg, 1ull << 34, "run -m " + test::model_path("stories260K.gguf") + gen);
    ASSERT_EQ(base.status, 0) << base.err;
    allowance = std::max<uint64_t>(allowance, std::stoull(cg_read(cg + "/memory.max_usage_in_bytes")));
    std::filesystem::remove(cg);
  }
  std::printf("non-LLM allowance (peak of ebb run on stories260K): %.1f MiB\n", allowance / 1048576.0);

  const std::string model = test::model_path("tiny-qwen3-f16.gguf");
  auto want = run_in_cgroup(cg, 1ull << 34, "run -m " + model + gen);
  ASSERT_EQ(want.status, 0) << want.err;
  const uint64_t unbudgeted_peak = std::stoull(cg_read(cg + "/memory.max_usage_in_bytes"));
  std::filesystem::remove(cg);
  for (const char* budget : {"4MiB", "5MiB"}) {
    const uint64_t b = parse_size(budget, 0);
    // The limit binds: the unbudgeted run needed more.
    EXPECT_GT(unbudgeted_peak, allowance + b) << budget;
    auto got = run_in_cgroup(cg, allowance + b, "run -m " + model + " --budget-window 1 --memory-budget " + budget + gen);
    std::string all;
    {
      std::ifstream f(cg + "/memory.oom_control");
      std::stringstream ss;
      ss << f.rdbuf();
      all = ss.str();
    }
    std::filesystem::remove(cg);
    EXPECT_EQ(got.status, 0) << budget << ": " << got.err;
    EXPECT_EQ(got.out, want.out) << budget;
    EXPECT_NE(all.find("oom_kill 0"), std::string::npos) << all;
  }
}

}  // namespace
}  // namespace ebb
