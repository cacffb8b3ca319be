// Offload before admission (LOCAL §6.2): the scheduler asks for the bytes a
// training or cache-maintenance task is short before admitting it, admits
// it only when that made room, and leaves it pending with the reason
// visible otherwise (fake tasks, a fake free-memory function); and the
// cache manager (runtime/offload_admission.h) frees the lowest keep
// priority prefix-cache KV first, never KV a live session holds.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "memory/prefix_cache.h"
#include "runtime/engine.h"
#include "runtime/offload_admission.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

using namespace std::chrono_literals;

template <class Pred>
bool wait_until(Pred p, std::chrono::milliseconds limit = 10000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

constexpr uint64_t MiB = 1ull << 20;

// A one-step background task of `kind` that needs `mem` bytes.
Task fake(const std::string& kind, uint64_t mem, std::atomic<int>* ran) {
  Task t;
  t.desc.kind = kind;
  t.desc.est_memory = mem;
  t.desc.next_yield_s = 0.001;
  t.step = [ran] {
    ++*ran;
    return false;
  };
  return t;
}

struct Fake {
  std::atomic<uint64_t> free{100 * MiB};
  std::atomic<uint64_t> offloadable{0};  // bytes the fake cache manager can give back
  std::atomic<int> asked{0};
  std::atomic<uint64_t> last_ask{0};
  SchedulerOptions options() {
    SchedulerOptions o;
    o.memory_reserve = 10 * MiB;
    o.free_memory = [this] { return free.load(); };
    o.offload_retry_s = 0.05;
    o.offload = [this](uint64_t bytes) {
      ++asked;
      last_ask = bytes;
      const uint64_t give = std::min<uint64_t>(bytes, offloadable.load());
      offloadable -= give;
      free += give;
      return give;
    };
    return o;
  }
};

TEST(OffloadAdmission, ATrainingTaskShortOfMemoryIsAdmittedAfterTheOffloadMadeRoom) {
  Fake f;
  f.offloadable = 50 * MiB;
  Scheduler s(nullptr, f.options());
  std::atomic<int> ran{0};
  s.submit_background(fake("train", 120 * MiB, &ran));  // 120 + 10 > 100: 30 MiB short
  ASSERT_TRUE(wait_until([&] { return ran.load() == 1; }));
  EXPECT_EQ(f.last_ask.load(), 30 * MiB);  // exactly the shortfall
  EXPECT_EQ(f.free.load(), 130 * MiB);
  const SchedulerMetrics m = s.metrics();
  EXPECT_GE(m.offload_requests, 1);
  EXPECT_EQ(m.offload_admitted, 1);
  EXPECT_EQ(m.offload_freed_bytes, 30 * MiB);
}

TEST(OffloadAdmission, ATaskThatCannotFitStaysPendingWithItsReason) {
  Fake f;
  f.offloadable = 5 * MiB;
  Scheduler s(nullptr, f.options());
  std::atomic<int> ran{0};
  s.submit_background(fake("train", 120 * MiB, &ran));  // 30 MiB short, 5 to give
  ASSERT_TRUE(wait_until([&] { return f.asked.load() >= 2; }));  // asks again after offload_retry_s
  EXPECT_EQ(ran.load(), 0);
  SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.bg_pending_memory, 1);
  EXPECT_EQ(m.bg_waiting, 1);
  EXPECT_GE(m.offload_short, 1);
  EXPECT_EQ(m.offload_admitted, 0);
  f.free = 200 * MiB;  // memory came back
  ASSERT_TRUE(wait_until([&] { return ran.load() == 1; }));
  EXPECT_EQ(s.metrics().bg_pending_memory, 0);
}

TEST(OffloadAdmission, OnlyTrainingAndMaintenanceKindsAskAndFittingTasksNever) {
  Fake f;
  f.offloadable = 500 * MiB;
  Scheduler s(nullptr, f.options());
  std::atomic<int> ran{0};
  s.submit_background(fake("judge", 120 * MiB, &ran));  // short, but not a kind that offloads
  s.submit_background(fake("prefill", 50 * MiB, &ran));  // fits: no offload
  ASSERT_TRUE(wait_until([&] { return ran.load() == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(f.asked.load(), 0);
  EXPECT_EQ(s.metrics().bg_pending_memory, 1);  // the judge call waits for memory
  s.submit_background(fake("maintenance", 150 * MiB, &ran));
  ASSERT_TRUE(wait_until([&] { return ran.load() >= 2; }));
  EXPECT_EQ(f.asked.load(), 1);
}

TEST(OffloadAdmission, NoOffloadWhileForegroundRunsUnderForegroundFirst) {
  Fake f;
  f.offloadable = 500 * MiB;
  Scheduler s(nullptr, f.options());
  std::atomic<bool> release{false}, entered{false};
  Task hold;
  hold.desc.cls = TaskClass::kForeground;
  hold.step = [&] {
    entered = true;
    std::this_thread::sleep_for(1ms);
    return !release.load();
  };
  s.submit(std::move(hold));
  ASSERT_TRUE(wait_until([&] { return entered.load(); }));
  std::atomic<int> ran{0};
  s.submit_background(fake("train", 120 * MiB, &ran));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(f.asked.load(), 0);  // the foreground's KV is not offloaded for a task that could not run anyway
  release = true;
  ASSERT_TRUE(wait_until([&] { return ran.load() == 1; }));
  EXPECT_EQ(f.asked.load(), 1);
}

// The cache manager on a real engine.
std::unique_ptr<Engine> make_engine() {
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 1;
  o.kv_chunk_size = 16;
  o.prefix_cache = true;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

TEST(CacheOffloader, DropsTheLowestKeepPriorityKvFirstAndNeverALiveSessionsKv) {
  auto e = make_engine();
  const int64_t nv = e->config().n_vocab;
  const std::vector<TokenId> hot = random_tokens(64, nv, 1), cold = random_tokens(64, nv, 2),
                             live = random_tokens(64, nv, 3);
  std::vector<TokenId> hot_turn = hot;
  hot_turn.push_back(1);  // one more token: a lookup matches all four chunks
  for (int i = 0; i < 4; ++i) Session(*e).feed(hot_turn);  // reused: hot
  Session(*e).feed(cold);                             // never reused: lowest keep priority
  Session held(*e);
  held.feed(live);  // its chunks are shared with the cache while it lives
  PrefixCache& pc = *e->prefix_cache();
  const CacheKey key = held.cache_key();
  ASSERT_EQ(pc.covered(key, cold), 64);
  const uint64_t private0 = pc.private_bytes();
  ASSERT_GT(private0, 0u);

  CacheOffloader off(*e);
  const uint64_t freed = off.offload(1);  // a little: the coldest chunk goes
  EXPECT_GT(freed, 0u);
  EXPECT_LT(pc.covered(key, cold), 64);
  EXPECT_EQ(pc.covered(key, hot), 64);
  EXPECT_EQ(pc.covered(key, live), 64);

  off.offload(1ull << 40);  // everything it can: the live session's KV stays
  EXPECT_EQ(pc.private_bytes(), 0u);
  EXPECT_EQ(pc.covered(key, live), 64);
  EXPECT_EQ(pc.covered(key, hot), 0);
  const OffloadStats s = off.stats();
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.short_of, 1);  // the second asked for more than there was
  EXPECT_GE(s.freed_prefix, private0);
  EXPECT_EQ(e->kv_pool().spare_bytes(), 0u);  // the dropped chunks' buffers went back too
}

TEST(CacheOffloader, AsTheSchedulersHookItAdmitsTrainingByDroppingCachedKv) {
  auto e = make_engine();
  Engine& eng = *e;
  const int64_t nv = eng.config().n_vocab;
  for (uint32_t i = 0; i < 4; ++i) Session(eng).feed(random_tokens(64, nv, 10 + i));
  PrefixCache& pc = *eng.prefix_cache();
  const uint64_t cached = pc.private_bytes();
  ASSERT_GT(cached, 0u);
  CacheOffloader off(eng);
  // A device of `cached` + 1 MiB: free is what the cached KV leaves.
  const uint64_t device = cached + MiB;
  SchedulerOptions o;
  o.memory_reserve = MiB / 2;
  o.free_memory = [&] { return device - e->footprint().kv() - e->kv_pool().spare_bytes(); };
  o.offload = off.hook();
  Scheduler s(e.get(), o);
  std::atomic<int> ran{0};
  s.submit_background(fake("train", cached / 2 + MiB / 2, &ran));  // needs half the cache dropped
  ASSERT_TRUE(wait_until([&] { return ran.load() == 1; }));
  EXPECT_EQ(s.metrics().offload_admitted, 1);
  const uint64_t left = s.call([](Engine& en) { return en.prefix_cache()->private_bytes(); }).get();
  EXPECT_LT(left, cached);
  EXPECT_GT(left, 0u);  // only what was short went
  EXPECT_GE(off.stats().freed_prefix, cached / 2);
}

}  // namespace
}  // namespace ebb
