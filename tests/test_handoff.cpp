// Handoffs and cross-agent pre-prefill (runtime/handoff.h, LOCAL §6.1) on a
// real engine and scheduler: a handoff's target prefix is prefilled in the
// background under the target's key, and the target's request takes that KV
// from the cache with the logits of a cold run, bit for bit; the coverage is
// never returned under another namespace, adapter, adapter version or KV
// geometry; a publish of the target's adapter before its request makes it
// stale (and plans it again under the new version); a request that came
// first leaves the task nothing to do; D_ma orders the tasks; the chunk
// shrinks under memory pressure.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "model/lora.h"
#include "runtime/engine.h"
#include "runtime/handoff.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kChunk = 16;

std::unique_ptr<Engine> make_engine() {
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 1;
  o.kv_chunk_size = kChunk;
  o.prefill_batch = 8;  // divides the chunk: a hit starts where a recompute's micro-batch does
  o.prefix_cache = true;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

std::vector<TokenId> cat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

template <class Pred>
bool wait_until(Pred p, std::chrono::milliseconds limit = 20000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

struct Fed {
  std::vector<float> logits;  // [n_vocab] after the last token
  int64_t reused = 0;
};

struct Target {
  std::string ns;
  std::vector<AdapterBinding> adapters;
  DType kv_type = DType::kF16;
  int64_t kv_chunk = 0;  // 0: the engine's
};

// A fresh session (on the scheduler thread) fed `tokens`.
Fed feed(Engine& e, const Target& t, const std::vector<TokenId>& tokens, bool cache = true) {
  SessionOptions so;
  so.use_prefix_cache = cache;
  so.cache_namespace = t.ns;
  so.kv_type = t.kv_type;
  so.kv_chunk_size = t.kv_chunk;
  Session s(e, so);
  if (!t.adapters.empty()) s.set_adapters(t.adapters);
  const std::span<const float> l = s.feed(tokens);
  return {{l.begin(), l.end()}, s.reused_tokens()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<LoraAdapter> synth_adapter(Engine& e, uint64_t seed) {
  LoraInitOptions o;
  o.rank = 4;
  o.alpha = 8;
  o.b_std = 0.05f;
  o.seed = seed;
  return init_lora(e.config(), o, e.allocator());
}

// Holds the scheduler in a foreground task (no background step runs under
// foreground-first) until released.
struct Hold {
  struct Flags {
    std::atomic<bool> entered{false}, released{false};
  };
  std::shared_ptr<Flags> f = std::make_shared<Flags>();
  explicit Hold(Scheduler& s) {
    Task t;
    t.desc.cls = TaskClass::kForeground;
    t.desc.kind = "hold";
    t.step = [f = f] {
      f->entered = true;
      std::this_thread::sleep_for(1ms);
      return !f->released.load();
    };
    s.submit(std::move(t));
    EXPECT_TRUE(wait_until([this] { return f->entered.load(); }));
  }
  void release() { f->released = true; }
  ~Hold() { release(); }
};

struct World {
  std::unique_ptr<Engine> engine = make_engine();
  Scheduler sched{engine.get()};
  std::vector<TokenId> sys_a, sys_b, shared, turn;
  World() {
    const int64_t nv = engine->config().n_vocab;
    sys_a = random_tokens(kChunk + 3, nv, 1);
    sys_b = random_tokens(kChunk + 9, nv, 2);
    shared = random_tokens(3 * kChunk + 5, nv, 3);
    turn = random_tokens(7, nv, 4);
    add("A", 1, true);
    add("B", 2, true);
  }
  template <class F>
  auto call(F f) -> std::invoke_result_t<F&, Engine&> {
    return sched.call(std::move(f)).get();
  }
  AdapterInfo add(const std::string& name, uint64_t seed, bool publish) {
    return call([&](Engine& e) { return e.adapters().add(name, synth_adapter(e, seed), publish); });
  }
  Fed run(const Target& t, const std::vector<TokenId>& tokens, bool cache = true) {
    return call([&](Engine& e) { return feed(e, t, tokens, cache); });
  }
};

HandoffTarget target(const std::string& agent, const std::string& ns, std::vector<AdapterBinding> b,
                     std::vector<TokenId> sys) {
  return {agent, ns, std::move(b), std::move(sys), {}};
}

bool settled(const PrePrefill& p) { return p.stats().tasks_running == 0; }

TEST(PrePrefillPriority, IsTheFormulaOfLocal) {
  // D_ma = ρ (1 + β_s log(1 + s)) · min(Δ, M_max)/M_max
  EXPECT_DOUBLE_EQ(preprefill_priority(2.0, 1, 4096, 0.5, 8192), 2.0 * (1 + 0.5 * std::log(2.0)) * 0.5);
  EXPECT_DOUBLE_EQ(preprefill_priority(2.0, 3, 20000, 0.5, 8192), 2.0 * (1 + 0.5 * std::log(4.0)));  // Δ capped
  EXPECT_EQ(preprefill_priority(2.0, 3, 0, 0.5, 8192), 0.0);                                           // nothing missing
  // More consumers, more missing tokens, a higher ρ: each raises it.
  EXPECT_GT(preprefill_priority(2.0, 3, 100, 0.5, 8192), preprefill_priority(2.0, 1, 100, 0.5, 8192));
  EXPECT_GT(preprefill_priority(2.0, 1, 200, 0.5, 8192), preprefill_priority(2.0, 1, 100, 0.5, 8192));
  EXPECT_GT(preprefill_priority(3.0, 1, 100, 0.5, 8192), preprefill_priority(2.0, 1, 100, 0.5, 8192));
}

TEST(PrePrefill, TargetRequestReusesThePrefilledKvBitExactly) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  const Target ta{"support", {{"A"}}};
  Handoff h;
  h.source = "planner";
  h.shared_context = w.shared;
  h.targets = {target("tool", ta.ns, ta.adapters, w.sys_a)};
  std::future<size_t> planned;
  const uint64_t id = pp.post(h, &planned);
  EXPECT_EQ(planned.get(), 1u);
  ASSERT_TRUE(wait_until([&] { return settled(pp); }));
  const PrePrefillStats s = pp.stats();
  EXPECT_EQ(s.tasks_completed, 1);
  const int64_t whole = static_cast<int64_t>(w.sys_a.size() + w.shared.size()) / kChunk * kChunk;
  EXPECT_EQ(s.tokens_prefilled, whole);
  EXPECT_EQ(s.chunks_inserted, whole / kChunk);

  const std::vector<TokenId> prompt = cat(cat(w.sys_a, w.shared), w.turn);
  const Fed hit = w.run(ta, prompt);
  pp.consume(id, "tool");
  EXPECT_EQ(hit.reused, whole);  // the whole pre-prefilled prefix came from the cache
  const Fed cold = w.run(ta, prompt, false);
  EXPECT_TRUE(same_bits(hit.logits, cold.logits));
  EXPECT_EQ(pp.stats().consumed, 1);
}

TEST(PrePrefill, CoverageIsNeverReturnedUnderAnotherKeyPart) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  const Target ta{"support", {{"A"}}};
  Handoff h;
  h.shared_context = w.shared;
  h.targets = {target("tool", ta.ns, ta.adapters, w.sys_a)};
  pp.post(h);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 1; }));
  const std::vector<TokenId> prompt = cat(cat(w.sys_a, w.shared), w.turn);
  // One key part varied at a time: namespace, adapter name, no adapter,
  // the adapter's scale, the KV type, the KV chunk size.
  const std::vector<Target> others = {
      {"billing", {{"A"}}}, {"support", {{"B"}}}, {"support", {}}, {"support", {{"A", 0.5f}}},
      {"support", {{"A"}}, DType::kF32}, {"support", {{"A"}}, DType::kF16, kChunk / 2}};
  EXPECT_GT(w.run(ta, prompt).reused, 0);  // while the same key finds it
  for (const Target& o : others) EXPECT_EQ(w.run(o, prompt).reused, 0) << o.ns << " " << o.adapters.size();
  // Another version of A, published: requests follow it and find nothing.
  const AdapterInfo v2 = w.add("A", 9, true);
  EXPECT_EQ(w.run({"support", {{"A"}}}, prompt).reused, 0);
  // Pinned to the version it was made under, it is still there.
  EXPECT_GT(w.run({"support", {{"A", 1.0f, v2.version - 1}}}, prompt).reused, 0);
}

TEST(PrePrefill, PublishBeforeTheRequestMakesItStaleAndPlansItAgain) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  Handoff h;
  h.shared_context = w.shared;
  h.targets = {target("tool", "support", {{"A"}}, w.sys_a)};
  const uint64_t id = pp.post(h);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 1; }));
  const AdapterInfo v2 = w.add("A", 9, true);  // a commit of the target's adapter, published
  pp.on_published("A", v2.version);
  EXPECT_EQ(pp.stats().stale, 1);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 2; }));
  const std::vector<TokenId> prompt = cat(cat(w.sys_a, w.shared), w.turn);
  const Fed hit = w.run({"support", {{"A"}}}, prompt);  // on v2: the new plan's coverage
  pp.consume(id, "tool");
  EXPECT_GT(hit.reused, 0);
  EXPECT_TRUE(same_bits(hit.logits, w.run({"support", {{"A"}}}, prompt, false).logits));
  // A target whose binding does not follow the adapter is not stale.
  Handoff pinned = h;
  pinned.targets = {target("critic", "support", {{"A", 1.0f, v2.version}}, w.sys_b)};
  pp.post(pinned);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 3; }));
  const AdapterInfo v3 = w.add("A", 10, true);
  pp.on_published("A", v3.version);
  EXPECT_EQ(pp.stats().stale, 1);
}

// A learning agent before its adapter's first publish runs on the base
// model: its prefix is planned so, and that first publish plans it again
// under the adapter (the key its requests use from then).
TEST(PrePrefill, AFirstPublishMovesATargetWaitingForItOntoTheAdapter) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  Handoff h;
  h.shared_context = w.shared;
  HandoffTarget t = target("learner", "support", {}, w.sys_a);
  t.on_first_publish = {{"L"}};
  h.targets = {t};
  const uint64_t id = pp.post(h);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 1; }));
  const std::vector<TokenId> prompt = cat(cat(w.sys_a, w.shared), w.turn);
  const AdapterInfo first = w.add("L", 5, true);
  pp.on_published("L", first.version);
  EXPECT_EQ(pp.stats().stale, 1);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 2; }));
  const Fed hit = w.run({"support", {{"L"}}}, prompt);  // under L: the re-plan's coverage
  pp.consume(id, "learner");
  EXPECT_GT(hit.reused, 0);
  EXPECT_TRUE(same_bits(hit.logits, w.run({"support", {{"L"}}}, prompt, false).logits));
  // A later publish of L follows it as any follow-published target.
  const AdapterInfo second = w.add("L", 6, true);
  pp.on_published("L", second.version);
  EXPECT_EQ(pp.stats().stale, 1);  // consumed: nothing pending
}

// A version staged ahead of its publish: the pending targets that follow
// the adapter are pre-prefilled under it too, so the publish finds their
// prefixes warm and keeps that task instead of planning again.
TEST(PrePrefill, AStagedVersionIsWarmedForThePendingTargetsBeforeItsPublish) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  Handoff h;
  h.shared_context = w.shared;
  h.targets = {target("tool", "support", {{"A"}}, w.sys_a), target("critic", "support", {}, w.sys_b)};
  const uint64_t id = pp.post(h);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 2; }));
  const AdapterInfo staged = w.add("A", 9, false);  // committed, not yet published
  EXPECT_EQ(pp.on_staged("A", staged.version).get(), 1u);  // the tool only: the critic binds no adapter
  EXPECT_EQ(pp.on_staged("A", staged.version).get(), 0u);  // planned once per version
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 3; }));
  PrePrefillStats s = pp.stats();
  EXPECT_EQ(s.staged_planned, 1);
  EXPECT_EQ(s.stale, 0);  // nothing published yet
  const std::vector<TokenId> prompt = cat(cat(w.sys_a, w.shared), w.turn);
  // The published version's coverage still serves a request before the publish.
  EXPECT_GT(w.run({"support", {{"A"}}}, prompt).reused, 0);

  w.call([&](Engine& e) { return e.adapters().publish("A", staged.version); });
  const int64_t submitted = pp.stats().tasks_submitted;
  pp.on_published("A", staged.version);
  ASSERT_TRUE(wait_until([&] { return settled(pp); }));
  s = pp.stats();
  EXPECT_EQ(s.stale, 1);
  EXPECT_EQ(s.tasks_submitted, submitted);  // covered already: no task planned again
  const Fed hit = w.run({"support", {{"A"}}}, prompt);  // under the new version
  pp.consume(id, "tool");
  EXPECT_EQ(hit.reused, static_cast<int64_t>((w.sys_a.size() + w.shared.size()) / kChunk * kChunk));
  EXPECT_TRUE(same_bits(hit.logits, w.run({"support", {{"A"}}}, prompt, false).logits));
}

TEST(PrePrefill, ARequestThatComesFirstLeavesTheTaskNothingToDo) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  const Target ta{"support", {{"A"}}};
  Handoff h;
  h.shared_context = w.shared;
  h.targets = {target("tool", ta.ns, ta.adapters, w.sys_a)};
  const std::vector<TokenId> prompt = cat(cat(w.sys_a, w.shared), w.turn);
  {
    Hold hold(w.sched);  // no background step until the request ran
    pp.post(h);
    GenerationRequest req;
    req.prompt = prompt;
    req.options.max_tokens = 1;
    req.options.sampling.temperature = 0;
    req.session.cache_namespace = ta.ns;
    req.adapters = ta.adapters;
    auto stream = w.sched.submit_generation(req);
    hold.release();
    for (;;) {
      auto e = stream->next(20.0);
      ASSERT_TRUE(e.has_value());
      if (e->kind != GenerationEvent::Kind::kText) break;
    }
  }
  ASSERT_TRUE(wait_until([&] { return settled(pp); }));
  const PrePrefillStats s = pp.stats();
  EXPECT_EQ(s.tokens_prefilled, 0);  // the request had prefilled it all
  EXPECT_EQ(s.nothing_missing, 1);
  EXPECT_EQ(s.tasks_completed, 1);
}

TEST(PrePrefill, HigherDmaRunsFirst) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  const int64_t nv = w.engine->config().n_vocab;
  Handoff small;  // one consumer, few missing tokens
  small.shared_context = random_tokens(kChunk, nv, 20);
  small.targets = {target("critic", "s", {}, w.sys_a)};
  Handoff big;  // three consumers, more missing tokens
  big.shared_context = w.shared;
  big.targets = {target("t1", "x", {}, w.sys_a), target("t2", "y", {}, w.sys_b),
                 target("t3", "z", {{"A"}}, w.sys_a)};
  uint64_t id_small = 0, id_big = 0;
  {
    Hold hold(w.sched);
    std::future<size_t> f1, f2;
    id_small = pp.post(small, &f1);
    id_big = pp.post(big, &f2);
    hold.release();
    EXPECT_EQ(f1.get(), 1u);
    EXPECT_EQ(f2.get(), 3u);
  }
  EXPECT_GT(pp.planned_priority(id_big, "t1"), pp.planned_priority(id_small, "critic"));
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 4; }));
  const auto order = pp.ended();
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order.back().first, id_small);  // the lowest D_ma ran last
}

// A target's request is seconds away: its prefix goes before training in
// the engine's idle time (training's guaranteed share is of the
// foreground's time, and stays). At priority 0, training below its share
// went first and the prefix was half done when the request came.
TEST(PrePrefill, TasksGoBeforeTrainingInTheIdleTime) {
  World w;
  PrePrefillOptions o;
  o.chunk_tokens = 8;  // several steps per target
  PrePrefill pp(*w.engine, w.sched, o);
  Handoff h;
  h.shared_context = w.shared;
  h.targets = {target("t1", "x", {}, w.sys_a), target("t2", "y", {}, w.sys_b)};
  std::atomic<int> train_steps{0}, train_steps_before{0};
  std::atomic<bool> stop{false};
  {
    Hold hold(w.sched);
    Task t;
    t.desc.kind = "train";
    t.step = [&] {
      ++train_steps;
      if (pp.stats().tasks_completed < 2) ++train_steps_before;
      std::this_thread::sleep_for(2ms);
      return !stop.load();
    };
    w.sched.submit_background(std::move(t));
    std::future<size_t> planned;
    pp.post(h, &planned);
    hold.release();
    EXPECT_EQ(planned.get(), 2u);
  }
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 2; }));
  ASSERT_TRUE(wait_until([&] { return train_steps.load() > 5; })) << "training runs once they are done";
  stop = true;
  EXPECT_GT(pp.stats().steps, 2) << "the prefixes took several steps";
  EXPECT_EQ(train_steps_before.load(), 0);
}

TEST(PrePrefill, ChunkShrinksUnderMemoryPressure) {
  World w;
  std::atomic<uint64_t> headroom{1ull << 40};
  PrePrefillOptions o;
  o.chunk_tokens = 32;
  o.headroom = [&] { return headroom.load(); };
  PrePrefill pp(*w.engine, w.sched, o);
  Handoff h;
  h.shared_context = w.shared;
  h.targets = {target("tool", "a", {}, w.sys_a)};
  pp.post(h);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 1; }));
  PrePrefillStats s = pp.stats();
  EXPECT_EQ(s.shrunk_steps, 0);
  EXPECT_EQ(s.min_chunk_tokens, 32);
  const int64_t steps0 = s.steps;

  const ModelConfig& c = w.engine->config();
  headroom = static_cast<uint64_t>(c.n_layer) * 2 * static_cast<uint64_t>(c.kv_dim()) * 2 * 8;  // 8 tokens' KV
  h.targets = {target("tool", "b", {}, w.sys_a)};
  pp.post(h);
  ASSERT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 2; }));
  s = pp.stats();
  EXPECT_GT(s.shrunk_steps, 0);
  EXPECT_EQ(s.min_chunk_tokens, 8);  // one micro-batch
  EXPECT_EQ(s.steps - steps0, 4 * steps0);  // four times the steps for the same tokens
}

// step_seconds sizes a step by time: a limit no micro-batch fits ends every
// step after one micro-batch; a limit every chunk fits leaves chunk_tokens
// alone. (Both ends hold on any machine, however slow.)
TEST(PrePrefill, StepSecondsEndsAStepBeforeAMicroBatchThatWouldPassIt) {
  const auto run = [](double step_seconds, const std::string& ns) {
    World w;
    PrePrefillOptions o;
    o.chunk_tokens = 32;  // four micro-batches of 8
    o.step_seconds = step_seconds;
    PrePrefill pp(*w.engine, w.sched, o);
    Handoff h;
    h.shared_context = w.shared;
    h.targets = {target("tool", ns, {}, w.sys_a)};
    pp.post(h);
    EXPECT_TRUE(wait_until([&] { return settled(pp) && pp.stats().tasks_completed == 1; }));
    return pp.stats();
  };
  const PrePrefillStats whole = run(3600, "a");
  EXPECT_EQ(whole.timed_steps, 0);
  EXPECT_EQ(whole.min_chunk_tokens, 32);
  const PrePrefillStats timed = run(1e-9, "b");
  EXPECT_EQ(timed.tokens_prefilled, whole.tokens_prefilled);  // the same prefix
  EXPECT_EQ(timed.min_chunk_tokens, 8);                       // one micro-batch
  EXPECT_EQ(timed.steps, timed.tokens_prefilled / 8);         // every step one micro-batch
  EXPECT_GT(timed.timed_steps, 0);
  EXPECT_EQ(timed.shrunk_steps, 0);  // not memory pressure
  World w;
  PrePrefillOptions bad;
  bad.step_seconds = -1;
  EXPECT_THROW(PrePrefill(*w.engine, w.sched, bad), Error);
}

TEST(PrePrefill, RejectsAHandoffWithoutTargetsOrWithABadRho) {
  World w;
  PrePrefill pp(*w.engine, w.sched);
  Handoff h;
  EXPECT_THROW(pp.post(h), Error);
  h.targets = {target("t", "", {}, w.sys_a)};
  h.rho = 0;
  EXPECT_THROW(pp.post(h), Error);
}

}  // namespace
}  // namespace ebb
