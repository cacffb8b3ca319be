// Stale-coverage prefill (runtime/stale_prefill.h, LOCAL §5.3) on a real
// engine and scheduler: staging a version prefills the hot prefixes of the
// published version under the staged one, privately (requests on the
// published version are unaffected), and after publication a request takes
// that KV from the cache with the logits of a recompute, bit for bit;
// unloading cancels the tasks, publishing early lets them finish. And the
// prefix cache's maintenance queries (hot_prefixes, covered, drop_adapter).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "memory/prefix_cache.h"
#include "model/lora.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "runtime/stale_prefill.h"
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

std::unique_ptr<LoraAdapter> synth_adapter(Engine& e, uint64_t seed) {
  LoraInitOptions o;
  o.rank = 4;
  o.alpha = 8;
  o.b_std = 0.05f;
  o.seed = seed;
  return init_lora(e.config(), o, e.allocator());
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

std::vector<TokenId> head(const std::vector<TokenId>& t, int64_t n) { return {t.begin(), t.begin() + n}; }

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
  int64_t reused = 0, run = 0;
  CacheKey key;
};

// A fresh session of the engine (on the scheduler thread) fed `tokens`.
Fed feed(Engine& e, const std::vector<AdapterBinding>& b, const std::vector<TokenId>& tokens, bool cache = true) {
  SessionOptions so;
  so.use_prefix_cache = cache;
  Session s(e, so);
  if (!b.empty()) s.set_adapters(b);
  const std::span<const float> l = s.feed(tokens);
  return {{l.begin(), l.end()}, s.reused_tokens(), s.tokens_run(), s.cache_key()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// An engine with adapter "A" (version 1, published), a scheduler that owns
// it, and two hot prefixes under A@1 (each fed twice, so the second took it
// from the cache) plus one under the base model.
struct World {
  std::unique_ptr<Engine> engine = make_engine();
  Scheduler sched{engine.get()};
  std::vector<TokenId> p1, p2, base, turn;
  explicit World(bool hot = true) {
    const int64_t nv = engine->config().n_vocab;
    p1 = random_tokens(3 * kChunk + 5, nv, 1);
    p2 = random_tokens(2 * kChunk + 7, nv, 2);
    base = random_tokens(3 * kChunk + 2, nv, 3);
    turn = random_tokens(6, nv, 4);
    add("A", 1, true);
    if (!hot) return;
    call([&](Engine& e) {
      for (int i = 0; i < 2; ++i) {
        feed(e, {{"A"}}, p1);
        feed(e, {{"A"}}, p2);
        feed(e, {}, base);
      }
      return 0;
    });
  }
  template <class F>
  auto call(F f) -> std::invoke_result_t<F&, Engine&> {
    return sched.call(std::move(f)).get();
  }
  AdapterInfo add(const std::string& name, uint64_t seed, bool publish) {
    return call([&](Engine& e) { return e.adapters().add(name, synth_adapter(e, seed), publish); });
  }
  // The cache key a session bound to `b` computes under.
  CacheKey key_for(const std::vector<AdapterBinding>& b) {
    return call([&](Engine& e) {
      Session s(e);
      if (!b.empty()) s.set_adapters(b);
      s.append(std::vector<TokenId>{1});
      return s.cache_key();
    });
  }
  int64_t covered(const CacheKey& k, const std::vector<TokenId>& t) {
    return call([&](Engine& e) { return e.prefix_cache()->covered(k, t); });
  }
};

bool settled(const StalePrefill& sp) { return sp.stats().tasks_running == 0; }

// Holds the scheduler in foreground rounds (so no background step is
// admitted under foreground-first) until released.
struct Hold {
  struct Flags {
    std::atomic<bool> entered{false}, released{false};
  };
  std::shared_ptr<Flags> f = std::make_shared<Flags>();  // the task may outlive this object by a step
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
  ~Hold() { f->released = true; }
};

TEST(PrefixCacheMaintenance, HotPrefixesAreTheHottestPathsFoldedAndNeverColdOnes) {
  auto e = make_engine();
  const int64_t nv = e->config().n_vocab;
  const std::vector<TokenId> a = random_tokens(3 * kChunk + 5, nv, 11), p = random_tokens(3 * kChunk + 5, nv, 12),
                             cold = random_tokens(2 * kChunk + 5, nv, 13);
  feed(*e, {}, a);
  feed(*e, {}, a);  // a's three nodes get heat
  feed(*e, {}, p);
  for (int i = 0; i < 4; ++i) feed(*e, {}, head(p, kChunk + 1));  // p's first node is hotter than the rest
  feed(*e, {}, p);                                                 // then the whole path is reused once
  feed(*e, {}, cold);                                              // inserted, never reused: not hot
  PrefixCache& pc = *e->prefix_cache();
  const auto all = [](const CacheKey&) { return true; };

  const std::vector<PrefixCache::HotPrefix> hot = pc.hot_prefixes(all, 8);
  ASSERT_EQ(hot.size(), 2u);  // a and p, each folded into one path; cold is not there
  std::vector<std::vector<TokenId>> got;
  for (const auto& h : hot) got.push_back(h.tokens);
  EXPECT_NE(std::find(got.begin(), got.end(), head(a, 3 * kChunk)), got.end());
  EXPECT_NE(std::find(got.begin(), got.end(), head(p, 3 * kChunk)), got.end());  // its hot first node, extended
  EXPECT_GE(hot[0].heat_kv, hot[1].heat_kv);
  ASSERT_EQ(pc.hot_prefixes(all, 1).size(), 1u);
  EXPECT_EQ(pc.hot_prefixes(all, 1)[0].tokens, hot[0].tokens);
  EXPECT_TRUE(pc.hot_prefixes([](const CacheKey&) { return false; }, 8).empty());

  const CacheKey key = hot[0].key;
  EXPECT_EQ(pc.covered(key, a), 3 * kChunk);
  EXPECT_EQ(pc.covered(key, head(a, 2 * kChunk + 3)), 2 * kChunk);
  EXPECT_EQ(pc.covered(key, cold), 2 * kChunk);
  EXPECT_EQ(pc.covered(key, random_tokens(40, nv, 99)), 0);
  CacheKey other = key;
  other.ns = "elsewhere";
  EXPECT_EQ(pc.covered(other, a), 0);
  // Neither query refreshed heat or counted a lookup.
  const int64_t lookups = pc.stats().lookups;
  const auto before = pc.nodes();
  pc.hot_prefixes(all, 8);
  pc.covered(key, a);
  EXPECT_EQ(pc.stats().lookups, lookups);
  const auto after = pc.nodes();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].heat_prefix, after[i].heat_prefix);
}

TEST(PrefixCacheMaintenance, DropAdapterForgetsEveryKeyHoldingThatVersion) {
  World w(/*hot=*/true);
  w.add("A", 2, false);
  const CacheKey k1 = w.key_for({{"A"}}), base = w.key_for({});
  EXPECT_EQ(w.covered(k1, w.p1), 3 * kChunk);
  EXPECT_EQ(w.call([](Engine& e) { return e.prefix_cache()->drop_adapter("A", 2); }), 0u);  // nothing under A@2
  EXPECT_EQ(w.covered(k1, w.p1), 3 * kChunk);
  EXPECT_EQ(w.call([](Engine& e) { return e.prefix_cache()->drop_adapter("A", 1); }), 1u);
  EXPECT_EQ(w.covered(k1, w.p1), 0);
  EXPECT_EQ(w.covered(base, w.base), 3 * kChunk);  // the base model's KV stays
}

// A step limit no micro-batch fits: every step runs one micro-batch (twice
// the steps of kChunk-token chunks), the same coverage in the end.
TEST(StalePrefill, StepSecondsEndsAStepAfterOneMicroBatchWhenNoneFits) {
  World w;
  StalePrefillOptions o;
  o.chunk_tokens = kChunk;  // two micro-batches of 8
  o.step_seconds = 1e-9;
  StalePrefill sp(*w.engine, w.sched, o);
  w.call([&](Engine& e) { return feed(e, {{"A"}}, cat(w.p1, w.turn)); });
  ASSERT_EQ(w.add("A", 2, false).version, 2u);
  const int64_t bg_steps = w.sched.metrics().bg_steps;
  EXPECT_EQ(sp.on_staged("A", 2).get(), 2u);
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  EXPECT_EQ(sp.stats().tokens_prefilled, 5 * kChunk);
  EXPECT_GE(w.sched.metrics().bg_steps - bg_steps, 10);  // 5 chunks of 2 micro-batches, one per step
  const CacheKey v2 = w.key_for({{"A", 1.0f, 2}});
  EXPECT_EQ(w.covered(v2, w.p1), 3 * kChunk);
  EXPECT_EQ(w.covered(v2, w.p2), 2 * kChunk);
  StalePrefillOptions bad;
  bad.step_seconds = -1;
  EXPECT_THROW(StalePrefill(*w.engine, w.sched, bad), Error);
}

TEST(StalePrefill, StagingWarmsTheHotPrefixesPrivatelyAndAfterPublishAHitIsBitExact) {
  World w;
  StalePrefillOptions o;
  o.chunk_tokens = kChunk;  // two micro-batches of 8 per step: several steps per prefix
  StalePrefill sp(*w.engine, w.sched, o);
  const CacheKey v1 = w.key_for({{"A"}});
  const Fed before_v1 = w.call([&](Engine& e) { return feed(e, {{"A"}}, cat(w.p1, w.turn)); });
  EXPECT_EQ(before_v1.reused, 3 * kChunk);

  const AdapterInfo staged = w.add("A", 2, false);
  ASSERT_EQ(staged.version, 2u);
  ASSERT_FALSE(staged.published);
  const CacheKey v2 = w.key_for({{"A", 1.0f, 2}});
  ASSERT_NE(v1, v2);
  EXPECT_EQ(w.covered(v2, w.p1), 0);
  const int64_t lookups = w.call([](Engine& e) { return e.prefix_cache()->stats().lookups; });
  const int64_t bg_steps = w.sched.metrics().bg_steps;

  EXPECT_EQ(sp.on_staged("A", 2).get(), 2u);  // p1 and p2; not the base model's prompt
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  const StalePrefillStats st = sp.stats();
  EXPECT_EQ(st.tasks_submitted, 2);
  EXPECT_EQ(st.tasks_completed, 2);
  EXPECT_EQ(st.tasks_failed + st.tasks_cancelled, 0);
  EXPECT_EQ(st.tokens_prefilled, 3 * kChunk + 2 * kChunk);
  EXPECT_EQ(st.chunks_inserted, 5);
  EXPECT_GE(w.sched.metrics().bg_steps - bg_steps, 5);  // 3 + 2 steps of 16 tokens, as background work
  EXPECT_EQ(w.covered(v2, w.p1), 3 * kChunk);
  EXPECT_EQ(w.covered(v2, w.p2), 2 * kChunk);
  EXPECT_EQ(w.covered(w.key_for({{"A", 1.0f, 2}}), w.base), 0);
  // The warm-up made no lookups of its own (heat is as requests left it).
  EXPECT_EQ(w.call([](Engine& e) { return e.prefix_cache()->stats().lookups; }), lookups);
  // Planning again finds everything covered.
  EXPECT_EQ(sp.on_staged("A", 2).get(), 0u);

  // Requests on the published version are unaffected.
  const Fed still_v1 = w.call([&](Engine& e) { return feed(e, {{"A"}}, cat(w.p1, w.turn)); });
  EXPECT_EQ(still_v1.key, v1);
  EXPECT_EQ(still_v1.reused, 3 * kChunk);
  EXPECT_TRUE(same_bits(still_v1.logits, before_v1.logits));

  // Published: a plain request binds v2 and takes the warmed KV, with the
  // logits of a recompute under v2 bit for bit.
  w.call([](Engine& e) {
    e.adapters().publish("A", 2);
    return 0;
  });
  const Fed hit = w.call([&](Engine& e) { return feed(e, {{"A"}}, cat(w.p1, w.turn)); });
  EXPECT_EQ(hit.key, v2);
  EXPECT_EQ(hit.reused, 3 * kChunk);
  EXPECT_EQ(hit.run, static_cast<int64_t>(w.turn.size()) + 5);
  const Fed recompute = w.call([&](Engine& e) { return feed(e, {{"A", 1.0f, 2}}, cat(w.p1, w.turn), false); });
  EXPECT_EQ(recompute.reused, 0);
  EXPECT_TRUE(same_bits(hit.logits, recompute.logits));
  EXPECT_FALSE(same_bits(hit.logits, before_v1.logits));  // v2 is another adapter
}

TEST(StalePrefill, UnloadingTheStagedVersionCancelsItsTasks) {
  World w;
  StalePrefill sp(*w.engine, w.sched);
  size_t n = 0;
  {
    Hold hold(w.sched);  // no background step runs meanwhile
    w.add("A", 2, false);
    n = sp.on_staged("A", 2).get();
    EXPECT_EQ(n, 2u);
    w.call([&](Engine& e) {
      e.adapters().unload("A", 2);
      sp.on_unloaded("A", 2);
      return 0;
    });
  }
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  const StalePrefillStats st = sp.stats();
  EXPECT_EQ(st.tasks_cancelled, static_cast<int64_t>(n));
  EXPECT_EQ(st.tasks_completed, 0);
  EXPECT_EQ(st.tokens_prefilled, 0);
}

TEST(StalePrefill, ATaskWhoseVersionWentAwayEndsWithoutPrefilling) {
  // Unloaded without telling this StalePrefill (another owner did it): the
  // task finds the version gone at its next step.
  World w;
  StalePrefill sp(*w.engine, w.sched);
  {
    Hold hold(w.sched);
    w.add("A", 2, false);
    EXPECT_EQ(sp.on_staged("A", 2).get(), 2u);
    w.call([](Engine& e) {
      e.adapters().unload("A", 2);
      return 0;
    });
  }
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  EXPECT_EQ(sp.stats().tasks_cancelled, 2);
  EXPECT_EQ(sp.stats().tokens_prefilled, 0);
}

TEST(StalePrefill, PublishedBeforeTheWarmUpEndsTheTasksFinishAndRequestsUseThem) {
  World w;
  StalePrefill sp(*w.engine, w.sched);
  {
    Hold hold(w.sched);
    w.add("A", 2, false);
    EXPECT_EQ(sp.on_staged("A", 2).get(), 2u);
    w.call([](Engine& e) {
      e.adapters().publish("A", 2);
      return 0;
    });
  }
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  EXPECT_EQ(sp.stats().tasks_completed, 2);
  const Fed hit = w.call([&](Engine& e) { return feed(e, {{"A"}}, cat(w.p2, w.turn)); });
  EXPECT_EQ(hit.key, w.key_for({{"A", 1.0f, 2}}));
  EXPECT_EQ(hit.reused, 2 * kChunk);
}

TEST(StalePrefill, AFirstVersionWarmsTheBaseModelsHotPrefixes) {
  World w;
  StalePrefill sp(*w.engine, w.sched);
  const AdapterInfo b = w.add("B", 7, false);
  EXPECT_TRUE(b.published);  // a name's first version is its default
  EXPECT_EQ(sp.on_staged("B", b.version).get(), 1u);  // the base prompt only (p1, p2 are under A)
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  EXPECT_EQ(w.covered(w.key_for({{"B"}}), w.base), 3 * kChunk);
}

TEST(StalePrefill, OptionsBoundTheWork) {
  World w;
  w.add("A", 2, false);
  StalePrefillOptions off;
  off.enabled = false;
  StalePrefill none(*w.engine, w.sched, off);
  EXPECT_EQ(none.on_staged("A", 2).get(), 0u);
  StalePrefillOptions one;
  one.max_prefixes = 1;
  StalePrefill sp(*w.engine, w.sched, one);
  EXPECT_EQ(sp.on_staged("A", 2).get(), 1u);
  ASSERT_TRUE(wait_until([&] { return settled(sp); }));
  EXPECT_EQ(w.covered(w.key_for({{"A", 1.0f, 2}}), w.p1), 3 * kChunk);  // the hotter (longer) of the two
  EXPECT_EQ(w.covered(w.key_for({{"A", 1.0f, 2}}), w.p2), 0);
  EXPECT_EQ(sp.on_staged("A", 9).get(), 0u);  // no such version
  EXPECT_EQ(sp.on_staged("nope", 1).get(), 0u);
  StalePrefillOptions empty_chunk;
  empty_chunk.chunk_tokens = 0;
  EXPECT_THROW({ StalePrefill bad(*w.engine, w.sched, empty_chunk); }, Error);
}

}  // namespace
}  // namespace ebb
