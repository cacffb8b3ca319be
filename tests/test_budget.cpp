// Budget mode (FlexInfer): size parsing, the planner's rules, and logits that
// are bit-identical to the fully resident run under every budget and system.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
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

// Issue 21 item 7: a failed streamed read must not leave a slot whose unread
// buffer is used (here: acquiring the layer again after the failure).
namespace ebb {
namespace {

TEST(BudgetStreaming, FailedReadIsReadAgainNotUsedUnread) {
  const std::string name = "tiny-qwen3-f16.gguf";
  auto ref = make(name);
  BudgetOptions b;
  b.budget = bounds(*ref).min;
  b.system = BudgetSystem::kPrefetch;  // every 2-D tensor streamed
  auto e = make(name, b);
  auto* st = dynamic_cast<WeightStreamer*>(e->budget_source());
  ASSERT_NE(st, nullptr);
  const int q = e->model().layout().layer_slots[0].attn_q;
  ASSERT_FALSE(st->plan().layers[0].preserved[q]);
  const WeightUnit& ru = ref->model().layer_unit(0);
  const uint64_t q_bytes = ru.slots()[q].unit_bytes;

  const std::vector<int32_t> toks = {1, 2, 3};
  fail_reads_for_test(e->model().file().path(), 1);  // the pass's first read: layer 0
  st->begin_pass(toks);
  try {
    st->acquire_layer(0);
    FAIL() << "the injected fault was not reported";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("injected read fault"), std::string::npos) << err.what();
  }
  const LayerWeights w = st->acquire_layer(0);
  EXPECT_EQ(std::memcmp(w.q.data, ru.data(q), q_bytes), 0) << "layer 0 served from a buffer its failed read left";
  st->release_layer(0);
  st->end_pass();
  fail_reads_for_test("", 0);
  // Whole passes afterwards are exact.
  const std::vector<float> want = run_logits(*ref), got = run_logits(*e);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

// A model file rewritten in place with its size, inode and mtime kept
// (`rsync --inplace -t`): budget mode's streamed reads are checked against
// the first read of each step, so the next pass fails instead of computing
// with other weights.
TEST(BudgetStreaming, FileRewrittenInPlaceWithIdentityKeptFailsThePass) {
  test::TempDir dir("ebb-budget-rewrite");
  const std::string copy = dir.file("model.gguf");
  std::filesystem::copy_file(test::model_path("tiny-qwen3-f16.gguf"), copy);
  EngineOptions o;
  o.model_path = copy;
  o.n_threads = 1;
  o.prefill_batch = 4;
  o.budget.system = BudgetSystem::kPrefetch;
  o.budget.budget = std::numeric_limits<uint64_t>::max() / 4;  // kPrefetch streams every 2-D tensor anyway
  o.budget.window = 1;  // only the next pass's layer 0 is read ahead, before the file changes
  auto e = std::make_unique<Engine>(o);
  Session s(*e);
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time");
  s.feed(prompt);
  // Flip bytes in the middle of layer 1's FFN down matrix, keep the mtime.
  const TensorSlot& t = e->model().layer_unit(1).slots()[e->model().layout().layer_slots[1].ffn_down];
  struct stat before {};
  ASSERT_EQ(::stat(copy.c_str(), &before), 0);
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t.file_offset + t.file_bytes / 2));
    const char junk[4] = {0x11, 0x22, 0x33, 0x44};
    f.write(junk, 4);
  }
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
  struct stat after {};
  ASSERT_EQ(::stat(copy.c_str(), &after), 0);
  ASSERT_EQ(after.st_ino, before.st_ino);
  ASSERT_EQ(after.st_size, before.st_size);
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  // Each pass checks one step in rotation: the change is found within one rotation.
  auto* st = dynamic_cast<WeightStreamer*>(e->budget_source());
  ASSERT_NE(st, nullptr);
  const int rotation = st->plan().steps_per_pass();
  std::string m;
  for (int pass = 0; pass <= rotation && m.empty(); ++pass) {
    const TokenId next = 42;
    try {
      s.feed(std::span<const TokenId>(&next, 1));
    } catch (const Error& err) {
      m = err.what();
    }
  }
  ASSERT_FALSE(m.empty()) << "weights changed under the engine were used for a whole rotation";
  EXPECT_NE(m.find("differs from the weights loaded"), std::string::npos) << m;
  EXPECT_NE(m.find("layer 1"), std::string::npos) << m;
}

}  // namespace
}  // namespace ebb

// Issue 21 item 7: budget mode's KV takes what it uses. The plan starts with
// the KV of one batch and a chunk (more weights resident than a plan that
// reserves the whole context), follows the KV as it grows, chunk by chunk,
// and comes back down when a session ends; the logits stay bit-identical and
// the ledger within the budget throughout.
namespace ebb {
namespace {

std::unique_ptr<Engine> make_kv(const std::string& model, const BudgetOptions& b) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 1;
  o.prefill_batch = 8;
  o.kv_chunk_size = 16;
  o.budget = b;
  return std::make_unique<Engine>(o);
}

TEST(BudgetKv, PlanHoldsTheKvInUseAndFollowsItAsItGrows) {
  const std::string name = "tiny-qwen3-f16.gguf";
  BudgetOptions b;
  b.n_ctx = 512;
  auto ref = make_kv(name, {});
  // A budget half way between the up-front plans' minimum and everything.
  BudgetOptions probe = b;
  probe.kv_on_demand = false;
  probe.budget = std::numeric_limits<uint64_t>::max() / 4;
  probe.system = BudgetSystem::kPrefetch;
  const uint64_t lo = plan_for(ref->model(), ref->forward(), probe, 16).total();
  probe.system = BudgetSystem::kEbb;
  const uint64_t hi = plan_for(ref->model(), ref->forward(), probe, 16).total();
  b.budget = lo + (hi - lo) / 2;

  BudgetOptions upfront = b;
  upfront.kv_on_demand = false;
  auto e_up = make_kv(name, upfront);
  auto e = make_kv(name, b);
  auto* st_up = dynamic_cast<WeightStreamer*>(e_up->budget_source());
  auto* st = dynamic_cast<WeightStreamer*>(e->budget_source());
  ASSERT_TRUE(st && st_up);
  const uint64_t kv_512 = st_up->plan().kv;
  EXPECT_LT(st->plan().kv, kv_512 / 4) << "the plan reserves KV nobody uses yet";
  EXPECT_GT(st->plan().resident_weight_bytes(), st_up->plan().resident_weight_bytes());

  const std::vector<TokenId> toks = [] {
    std::vector<TokenId> t(400);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(1 + (i * 37) % 250);
    return t;
  }();
  SessionOptions so;
  so.n_ctx = 512;
  Session want(*ref, so);
  const uint64_t first_resident = st->plan().resident_weight_bytes();
  uint64_t grown_resident = 0;
  {
    Session s(*e, so);
    for (size_t at = 0; at < toks.size(); at += 25) {
      const std::span<const TokenId> part(toks.data() + at, std::min<size_t>(25, toks.size() - at));
      const auto w = want.feed(part);
      const std::vector<float> w_copy(w.begin(), w.end());
      const auto g = s.feed(part);
      ASSERT_EQ(std::memcmp(g.data(), w_copy.data(), w_copy.size() * sizeof(float)), 0) << "after " << at;
      const uint64_t kv_in_use = static_cast<uint64_t>(e->ledger().bytes(MemCategory::kKvCache));
      EXPECT_GE(st->plan().kv, kv_in_use) << "after " << at;
      EXPECT_LE(static_cast<uint64_t>(e->ledger().total()), b.budget) << "after " << at;
    }
    EXPECT_GE(st->replans(), 3) << "the plan did not follow the KV";
    grown_resident = st->plan().resident_weight_bytes();
    EXPECT_LT(grown_resident, first_resident) << "weights did not make room for the KV";
  }
  // The session's KV is gone: the next pass plans for little KV again.
  Session s2(*e, so);
  const std::vector<TokenId> few(toks.begin(), toks.begin() + 5);
  Session want2(*ref, so);
  const auto w = want2.feed(few);
  const std::vector<float> w_copy(w.begin(), w.end());
  const auto g = s2.feed(few);
  EXPECT_EQ(std::memcmp(g.data(), w_copy.data(), w_copy.size() * sizeof(float)), 0);
  EXPECT_LT(st->plan().kv, kv_512 / 4);
  EXPECT_GT(st->plan().resident_weight_bytes(), grown_resident) << "weights did not come back";
}

}  // namespace
}  // namespace ebb
