// The cooperative scheduler (runtime/scheduler.h) with fake tasks: order
// under each policy, the background admission rule (memory and window),
// interruption at step boundaries, cancellation between steps, wait
// attribution, bounded queues; and generation requests on a tiny model,
// with a training job interleaved and evictions between its phases.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "platform/timer.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"
#include "support.h"
#include "train/train_job.h"

namespace ebb {
namespace {

using namespace std::chrono_literals;

// What ran, in order.
class Recorder {
 public:
  void add(const std::string& s) {
    std::lock_guard lock(mu_);
    log_.push_back(s);
  }
  std::vector<std::string> log() const {
    std::lock_guard lock(mu_);
    return log_;
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return log_.size();
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> log_;
};

template <class Pred>
bool wait_until(Pred p, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// A task of `steps` steps, each recording `name` and sleeping `each`.
Task fake(TaskClass cls, const std::string& kind, const std::string& name, int steps, Recorder& rec,
          std::chrono::milliseconds each = 0ms, std::function<void(int)> at_step = nullptr) {
  Task t;
  t.desc.cls = cls;
  t.desc.kind = kind;
  auto left = std::make_shared<int>(steps);
  auto n = std::make_shared<int>(0);
  t.step = [&rec, name, left, n, each, at_step] {
    rec.add(name);
    if (each.count() > 0) std::this_thread::sleep_for(each);
    if (at_step) at_step(++*n);
    return --*left > 0;
  };
  return t;
}

// A foreground task that holds the scheduler until released, so a test can
// queue everything before anything else runs.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::atomic<bool> entered{false};
  Task task(Recorder& rec) {
    Task t;
    t.desc.cls = TaskClass::kForeground;
    t.desc.kind = "gate";
    t.step = [this, &rec] {
      entered = true;
      rec.add("gate");
      opened.wait_for(5s);
      return false;
    };
    return t;
  }
};

SchedulerOptions fake_options(SchedPolicy p) {
  SchedulerOptions o;
  o.policy = p;
  o.free_memory = [] { return uint64_t{1} << 40; };
  o.used_memory = [] { return uint64_t{0}; };
  o.background_shares.clear();  // order by priority, utility and aging alone (shares have their own test)
  return o;
}

std::vector<std::string> run_order(SchedPolicy p, const std::vector<std::pair<std::string, TaskClass>>& tasks,
                                   int steps = 1) {
  Recorder rec;
  Gate gate;
  {
    Scheduler s(nullptr, fake_options(p));
    s.submit(gate.task(rec));
    EXPECT_TRUE(wait_until([&] { return gate.entered.load(); }));
    for (const auto& [name, cls] : tasks) s.submit(fake(cls, cls == TaskClass::kForeground ? "fg" : name, name, steps, rec));
    gate.open.set_value();
    EXPECT_TRUE(wait_until([&] { return rec.size() == 1 + tasks.size() * static_cast<size_t>(steps); }));
  }
  return rec.log();
}

constexpr TaskClass kFg = TaskClass::kForeground;
constexpr TaskClass kBg = TaskClass::kBackground;

TEST(Scheduler, ForegroundFirstAdmitsForegroundBeforeBackground) {
  const auto order = run_order(SchedPolicy::kForegroundFirst, {{"B1", kBg}, {"F1", kFg}, {"B2", kBg}, {"F2", kFg}});
  EXPECT_EQ(order, (std::vector<std::string>{"gate", "F1", "F2", "B1", "B2"}));
}

TEST(Scheduler, FifoRunsInArrivalOrder) {
  const auto order = run_order(SchedPolicy::kFifo, {{"B1", kBg}, {"F1", kFg}, {"B2", kBg}, {"F2", kFg}});
  EXPECT_EQ(order, (std::vector<std::string>{"gate", "B1", "F1", "B2", "F2"}));
}

TEST(Scheduler, RoundRobinAlternatesTaskKinds) {
  // Three steps each: foreground-first runs all foreground steps first;
  // round-robin takes one unit of each kind in turn.
  const auto rr = run_order(SchedPolicy::kRoundRobin, {{"judge", kBg}, {"F", kFg}}, 3);
  EXPECT_EQ(rr, (std::vector<std::string>{"gate", "judge", "F", "judge", "F", "judge", "F"}));
  const auto ff = run_order(SchedPolicy::kForegroundFirst, {{"judge", kBg}, {"F", kFg}}, 3);
  EXPECT_EQ(ff, (std::vector<std::string>{"gate", "F", "F", "F", "judge", "judge", "judge"}));
}

TEST(Scheduler, ForegroundTakesOverAtTheNextStepBoundary) {
  for (SchedPolicy p : {SchedPolicy::kForegroundFirst, SchedPolicy::kFifo}) {
    Recorder rec;
    {
      Scheduler s(nullptr, fake_options(p));
      // The training task's second step submits a foreground request.
      s.submit_background(fake(kBg, "train", "T", 5, rec, 0ms, [&](int step) {
        if (step == 2) s.submit(fake(kFg, "fg", "F", 1, rec));
      }));
      ASSERT_TRUE(wait_until([&] { return rec.size() == 6; }));
    }
    const std::vector<std::string> want =
        p == SchedPolicy::kForegroundFirst ? std::vector<std::string>{"T", "T", "F", "T", "T", "T"}
                                           : std::vector<std::string>{"T", "T", "T", "T", "T", "F"};
    EXPECT_EQ(rec.log(), want) << sched_policy_name(p);
  }
}

TEST(Scheduler, BackgroundNeedsMemoryAndReserve) {
  std::atomic<uint64_t> free{100ull << 20};
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.memory_reserve = 10ull << 20;
  o.free_memory = [&free] { return free.load(); };
  Recorder rec;
  Scheduler s(nullptr, o);
  Task big = fake(kBg, "train", "big", 1, rec);
  big.desc.est_memory = 95ull << 20;  // 95 + 10 > 100
  Task fits = fake(kBg, "judge", "fits", 1, rec);
  fits.desc.est_memory = 90ull << 20;  // 90 + 10 <= 100
  s.submit_background(std::move(big));
  s.submit_background(std::move(fits));
  ASSERT_TRUE(wait_until([&] { return rec.size() == 1; }));
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(rec.log(), (std::vector<std::string>{"fits"}));
  EXPECT_GE(s.metrics().bg_deferred_memory, 1);
  EXPECT_EQ(s.metrics().bg_waiting, 1);
  free = 200ull << 20;  // memory came back: admitted at the next check
  ASSERT_TRUE(wait_until([&] { return rec.size() == 2; }));
  EXPECT_EQ(rec.log().back(), "big");
}

TEST(Scheduler, BackgroundNeedsItsNextYieldWithinTheWindow) {
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.background_window_s = 0.1;
  o.margin_s = 0.05;
  Recorder rec;
  Scheduler s(nullptr, o);
  Task slow = fake(kBg, "train", "slow", 1, rec);
  slow.desc.next_yield_s = 0.08;  // 0.08 + 0.05 > 0.1
  Task quick = fake(kBg, "judge", "quick", 1, rec);
  quick.desc.next_yield_s = 0.04;  // 0.04 + 0.05 <= 0.1
  const TaskId slow_id = s.submit_background(std::move(slow));
  s.submit_background(std::move(quick));
  ASSERT_TRUE(wait_until([&] { return rec.size() == 1; }));
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(rec.log(), (std::vector<std::string>{"quick"}));
  EXPECT_GE(s.metrics().bg_deferred_window, 1);
  ASSERT_TRUE(s.descriptor(slow_id));
  EXPECT_DOUBLE_EQ(s.descriptor(slow_id)->next_yield_s, 0.08);
  s.set_background_window(0.2);
  ASSERT_TRUE(wait_until([&] { return rec.size() == 2; }));
  EXPECT_EQ(rec.log().back(), "slow");
}

// A task whose step is longer than the window would never run; on an idle
// engine it runs after window_starvation_s, and keeps running until
// foreground work comes; then the window rule holds it back again.
TEST(Scheduler, AStarvingBackgroundTaskRunsPastTheWindowOnAnIdleEngine) {
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.background_window_s = 0.1;
  o.margin_s = 0.05;
  o.window_starvation_s = 0.3;
  Recorder rec;
  Scheduler s(nullptr, o);
  std::atomic<int> steps{0};
  Task slow = fake(kBg, "train", "slow", 1000, rec, 5ms, [&steps](int n) { steps = n; });
  slow.desc.next_yield_s = 1.0;  // far past the window, and estimates keep it there
  const auto t0 = std::chrono::steady_clock::now();
  s.submit_background(std::move(slow));
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(steps.load(), 0);  // within the starvation time: held back
  ASSERT_TRUE(wait_until([&] { return steps.load() >= 3; }));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  EXPECT_GE(s.metrics().bg_over_window, 3);
  // Its measured ~5 ms steps bring the estimate (EMA from 1 s, α = 0.2)
  // inside the window after about 14 steps: from then on it runs on its own
  // merits, no longer over the window.
  ASSERT_TRUE(wait_until([&] { return steps.load() >= 30; }));
  const int64_t over = s.metrics().bg_over_window;
  EXPECT_LE(over, 20);
  ASSERT_TRUE(wait_until([&] { return steps.load() >= 60; }));
  EXPECT_EQ(s.metrics().bg_over_window, over);
}

// Training submitted one task per optimizer step, each step past the
// window: on an idle engine the first waits window_starvation_s, and the
// ones after it continue its episode instead of waiting again; foreground
// work ends the episode.
TEST(Scheduler, TheNextTaskOfAKindPastTheWindowContinuesItsStarvationEpisode) {
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.background_window_s = 0.1;
  o.margin_s = 0.05;
  o.window_starvation_s = 0.3;
  Recorder rec;
  Scheduler s(nullptr, o);
  std::atomic<int> done{0};
  std::function<void()> next;
  next = [&] {
    Task t = fake(kBg, "train", "T", 1, rec);
    t.desc.next_yield_s = 1.0;  // far past the window
    t.on_done = [&](TaskOutcome, const std::string&) {
      if (++done < 10) next();
    };
    s.submit_background(std::move(t));
  };
  const auto t0 = std::chrono::steady_clock::now();
  next();
  ASSERT_TRUE(wait_until([&] { return done.load() >= 10; }));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 300ms);   // the first waited
  EXPECT_LT(took, 1500ms);  // ... the other nine did not (0.3 s each: 3 s)
  EXPECT_EQ(s.metrics().bg_over_window, 10);
  // Foreground work ends the episode: the next task waits again.
  s.submit(fake(TaskClass::kForeground, "fg", "F", 1, rec));
  ASSERT_TRUE(wait_until([&] { return rec.size() == 11; }));
  std::atomic<bool> ran{false};
  Task t = fake(kBg, "train", "T2", 1, rec);
  t.desc.next_yield_s = 1.0;
  t.on_done = [&](TaskOutcome, const std::string&) { ran = true; };
  s.submit_background(std::move(t));
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(ran.load());
  ASSERT_TRUE(wait_until([&] { return ran.load(); }));
}

TEST(Scheduler, WithoutStarvationTimeATaskPastTheWindowNeverRuns) {
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.background_window_s = 0.1;
  o.margin_s = 0.05;
  o.window_starvation_s = 0;
  Recorder rec;
  Scheduler s(nullptr, o);
  Task slow = fake(kBg, "train", "slow", 5, rec);
  slow.desc.next_yield_s = 1.0;
  s.submit_background(std::move(slow));
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(rec.size(), 0u);
  EXPECT_EQ(s.metrics().bg_over_window, 0);
}

// Cross-agent pre-prefill and stale-coverage prefill come as a stream of
// tasks with utility > 0; training and judge calls have utility 0. Ordered
// by utility alone, the training task never runs while the stream lasts
// (ebb bench agents' training stalled after one step this way); with aging,
// it is picked once it has been passed over for background_aging_s of
// other tasks' steps, and the stream still gets most of the time.
TEST(Scheduler, ATrainingTaskProgressesBesideAStreamOfHigherUtilityTasks) {
  for (const double aging : {0.0, 0.05}) {
    SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
    o.background_aging_s = aging;
    Recorder rec;
    Gate gate;
    std::atomic<int> stream_steps{0}, train_steps{0}, during{-1};
    {
      Scheduler s(nullptr, o);
      s.submit(gate.task(rec));
      ASSERT_TRUE(wait_until([&] { return gate.entered.load(); }));
      Task train = fake(kBg, "train", "T", 1000, rec, 2ms, [&train_steps](int n) { train_steps = n; });
      train.desc.utility = 0;
      s.submit_background(std::move(train));
      // Pre-prefill tasks of 20 steps of 5 ms each, the next one submitted
      // before the current one ends, so one always waits.
      std::function<void()> next;
      std::atomic<int> submitted{0};
      next = [&] {
        if (submitted.fetch_add(1) >= 10) return;
        Task p = fake(kBg, "preprefill", "P", 20, rec, 5ms, [&](int n) {
          if (++stream_steps == 200) during = train_steps.load();  // as the stream ends
          if (n == 10) next();
        });
        p.desc.utility = 1.0 + 0.1 * submitted.load();
        s.submit_background(std::move(p));
      };
      next();
      gate.open.set_value();
      ASSERT_TRUE(wait_until([&] { return during.load() >= 0; }, 20000ms));
      if (aging == 0) {
        EXPECT_EQ(during.load(), 0) << "utility alone: the stream goes first";
        EXPECT_EQ(s.metrics().bg_aged, 0);
      } else {
        // 200 stream steps of >= 5 ms: >= 1 s of background time, a training
        // step at least every 0.05 s of it.
        EXPECT_GE(during.load(), 10);
        EXPECT_LT(during.load(), 200) << "the stream keeps most of the time";
        EXPECT_GE(s.metrics().bg_aged, 10);
      }
      // After the stream, training runs on.
      ASSERT_TRUE(wait_until([&] { return train_steps.load() >= during.load() + 5; }));
      s.shutdown(0);
    }
  }
}

// ebb bench agents' training is one task per optimizer step, the next
// submitted when one ends, beside pre-prefill tasks of higher utility that
// are always pending. Aging gives each new training task a step only after
// it has been passed over for background_aging_s; a guaranteed share gives
// training its share of the background time while the stream lasts, and
// the stream keeps the rest.
TEST(Scheduler, AGuaranteedShareGivesTrainingItsPartBesidePendingPrePrefill) {
  for (const double share : {0.0, 0.5}) {
    SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
    o.background_aging_s = 30.0;  // longer than the stream lasts
    if (share > 0) o.background_shares = {{"train", share}};
    o.background_share_horizon_s = 0.2;
    Recorder rec;
    Gate gate;
    std::atomic<int> stream_steps{0}, train_steps{0}, during{-1};
    {
      Scheduler s(nullptr, o);
      s.submit(gate.task(rec));
      ASSERT_TRUE(wait_until([&] { return gate.entered.load(); }));
      // Training: one task of 2 steps of 3 ms per optimizer step, the next
      // submitted from the last one's completion.
      std::function<void()> train;
      train = [&] {
        Task t = fake(kBg, "train", "T", 2, rec, 3ms, [&](int n) {
          ++train_steps;
          if (n == 2 && during.load() < 0) train();
        });
        t.desc.utility = 0;
        s.submit_background(std::move(t));
      };
      train();
      // Pre-prefill: tasks of 10 steps of 3 ms, the next submitted before
      // the current one ends, so one always waits.
      std::function<void()> next;
      std::atomic<int> submitted{0};
      next = [&] {
        if (submitted.fetch_add(1) >= 20) return;
        Task p = fake(kBg, "preprefill", "P", 10, rec, 3ms, [&](int n) {
          if (++stream_steps == 200) during = train_steps.load();  // as the stream ends
          if (n == 5) next();
        });
        p.desc.utility = 2.0;
        s.submit_background(std::move(p));
      };
      next();
      gate.open.set_value();
      ASSERT_TRUE(wait_until([&] { return during.load() >= 0; }, 20000ms));
      if (share == 0) {
        // 200 stream steps of >= 3 ms: about 0.6 s, far less than the aging.
        EXPECT_LE(during.load(), 2) << "without a share the stream takes all the background time";
        EXPECT_EQ(s.metrics().bg_share, 0);
      } else {
        // Equal steps: a half share is about one training step per stream step.
        EXPECT_GE(during.load(), 100) << "training gets about half of the steps";
        EXPECT_LE(during.load(), 300) << "the stream keeps its part";
        EXPECT_GE(s.metrics().bg_share, 50);
      }
      s.shutdown(0);
    }
  }
}

// Shares over a foreground-first scheduler whose window admits short steps.
SchedulerOptions share_options(double share, bool over_foreground) {
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.background_shares.clear();
  if (share > 0) o.background_shares = {{"train", share}};
  o.shares_over_foreground = over_foreground;
  o.background_share_horizon_s = 0.5;
  o.background_window_s = 0.5;
  o.margin_s = 0.05;
  return o;
}

// Two foreground tasks ("F1", "F2") of `steps` steps of 2 ms: every round
// runs one step of each, so foreground work is always there until both end.
struct SaturatingForeground {
  std::atomic<bool> done{false};
  std::atomic<int> left{2};
  void submit(Scheduler& s, Recorder& rec, int steps) {
    for (const char* name : {"F1", "F2"}) {
      s.submit(fake(kFg, "fg", name, steps, rec, 2ms, [this, steps](int n) {
        if (n == steps && --left == 0) done = true;
      }));
    }
  }
};

// A scheduler held by a gate (opened by the test) with a saturating
// foreground to submit.
struct ShareRun {
  Recorder rec;
  Gate gate;
  SaturatingForeground fg;
  Scheduler s;
  explicit ShareRun(const SchedulerOptions& o) : s(nullptr, o) {
    s.submit(gate.task(rec));
    EXPECT_TRUE(wait_until([&] { return gate.entered.load(); }));
  }
};

// A foreground that saturates the engine (there is always a foreground task
// running) left background work nothing under foreground-first, whatever
// its guaranteed share: in ebb bench agents at load, training got 14.9 s of
// ~130 s of scheduler time with a share of 0.5. A kind below its share of
// the engine's recent busy time now takes one bounded step ahead of the
// foreground; the shares are read from the scheduler's own time accounting.
TEST(Scheduler, AGuaranteedShareHoldsWhileTheForegroundSaturatesTheEngine) {
  struct Case {
    double share;
    double train_step_estimate_s;  // declared ŷ of the training task
    bool over_foreground = true;   // SchedulerOptions::shares_over_foreground
  };
  for (const Case c : {Case{0.0, 0.0}, Case{0.5, 0.0}, Case{0.25, 0.0}, Case{0.5, 1.0}, Case{0.5, 0.0, false}}) {
    SCOPED_TRACE("share " + std::to_string(c.share) + ", step estimate " + std::to_string(c.train_step_estimate_s) +
                 (c.over_foreground ? "" : ", shares not over the foreground"));
    SchedulerOptions o = share_options(c.share, c.over_foreground);
    o.window_starvation_s = 0.2;  // a step past the window runs once the engine is idle
    ShareRun run(o);
    auto& [rec, gate, fg, s] = run;
    std::atomic<bool>& fg_done = fg.done;
    fg.submit(s, rec, 150);
    // Training: one long task of 3 ms steps, ending at its first step after
    // the foreground is done (so it adds at most one step of idle time).
    std::atomic<int> train_during{0};
    Task t;
    t.desc.kind = "train";
    t.desc.next_yield_s = c.train_step_estimate_s;
    t.step = [&] {
      if (fg_done.load()) return false;
      rec.add("train");
      std::this_thread::sleep_for(3ms);
      ++train_during;
      return true;
    };
    s.submit_background(std::move(t));
    gate.open.set_value();
    ASSERT_TRUE(wait_until([&] { return fg_done.load(); }, 20000ms));
    ASSERT_TRUE(wait_until([&] { return s.metrics().bg_completed == 1; }));
    const SchedulerMetrics m = s.metrics();
    const auto it = m.bg_busy_by_kind_s.find("train");
    const double train_s = it == m.bg_busy_by_kind_s.end() ? 0.0 : it->second;
    const double busy_s = m.fg_busy_s + m.bg_busy_s;
    ASSERT_GT(busy_s, 0);
    if (c.share == 0 || !c.over_foreground) {
      EXPECT_EQ(train_during.load(), 0) << "foreground-first: nothing beside a saturating foreground";
      EXPECT_EQ(m.bg_share_fg, 0);
    } else if (c.train_step_estimate_s + o.margin_s > o.background_window_s) {
      // A step longer than the window is never run ahead of the foreground:
      // an arrival waits for at most one step that fits W_bg.
      EXPECT_EQ(train_during.load(), 0) << "a step past W_bg does not jump the foreground";
      EXPECT_EQ(m.bg_share_fg, 0);
    } else {
      EXPECT_GT(train_during.load(), 20);
      EXPECT_GE(m.bg_share_fg, 20);
      // The scheduler's own accounting: training's part of the busy time
      // meets its share (less one step of slack), and takes little more.
      EXPECT_GE(train_s / busy_s, c.share * 0.8) << train_s << " s of " << busy_s << " s";
      EXPECT_LE(train_s / busy_s, c.share + 0.15) << train_s << " s of " << busy_s << " s";
      // Never two training steps in a row while the foreground was there:
      // a foreground round waits for at most one bounded step.
      const std::vector<std::string> log = rec.log();
      int run = 0, longest = 0;
      for (const std::string& e : log) {
        run = e == "train" ? run + 1 : 0;
        longest = std::max(longest, run);
      }
      EXPECT_EQ(longest, 1);
    }
    s.shutdown(0);
  }
}

// The share ahead of the foreground is of the time the foreground and the
// shared kinds used. Before, it was of all busy time: in bench agents,
// cross-agent pre-prefill (44-46 s of 150) ran in the foreground's idle
// time, training fell below half of all busy time after each burst of it,
// and took 174-249 steps ahead of the foreground (13 without pre-prefill),
// each delaying a cold prefill's next round by a phase.
TEST(Scheduler, OtherBackgroundWorkDoesNotMakeAShareOwedOverTheForeground) {
  const SchedulerOptions o = share_options(0.5, true);
  ShareRun run(o);
  auto& [rec, gate, fg, s] = run;
  std::atomic<bool>& fg_done = fg.done;
  // Training runs alone for 40 steps, then a higher-priority cache task
  // takes the engine for 60 steps (train waits: lower priority), then two
  // foreground tasks saturate it.
  Task cache = fake(kBg, "cache", "cache", 60, rec, 3ms, [&](int n) {
    if (n == 60) fg.submit(s, rec, 100);
  });
  cache.desc.priority = 1;
  auto cache_task = std::make_shared<Task>(std::move(cache));
  Task t;
  t.desc.kind = "train";
  auto n = std::make_shared<int>(0);
  t.step = [&, n, cache_task] {
    if (fg_done.load()) return false;
    rec.add("train");
    std::this_thread::sleep_for(3ms);
    if (++*n == 40) s.submit_background(std::move(*cache_task));
    return true;
  };
  s.submit_background(std::move(t));
  gate.open.set_value();
  ASSERT_TRUE(wait_until([&] { return fg_done.load(); }, 20000ms));
  ASSERT_TRUE(wait_until([&] { return s.metrics().bg_completed == 2; }));
  s.shutdown(0);
  const std::vector<std::string> log = rec.log();
  const auto first_fg = std::find_if(log.begin(), log.end(), [](const std::string& e) { return e[0] == 'F'; });
  ASSERT_NE(first_fg, log.end());
  ASSERT_EQ(std::count(log.begin(), first_fg, "cache"), 60) << "the cache task ran to its end before the foreground";
  // Training had about 40 % of the recent busy time (the cache the rest):
  // below half of all of it, but above half of its own and the
  // foreground's (which was none). It waits until the foreground has used
  // about as much as it recently did (about 0.08 s here: some 20 rounds of
  // the two 2 ms tasks), instead of jumping the very first rounds.
  const auto first_train = std::find(first_fg, log.end(), std::string("train"));
  const auto fg_before = std::count_if(first_fg, first_train, [](const std::string& e) { return e[0] == 'F'; });
  EXPECT_GE(fg_before, 16) << "foreground steps before training's first step ahead of it";
  // And the share still holds against a foreground that saturates the engine.
  EXPECT_GE(std::count(first_train, log.end(), std::string("train")), 10);
  EXPECT_GE(s.metrics().bg_share_fg, 10);
}

TEST(Scheduler, EstimatesAreMovingAveragesOfMeasuredSteps) {
  Ema e(0.2);
  EXPECT_FALSE(e.set());
  e.add(10);
  EXPECT_DOUBLE_EQ(e.value(), 10);  // the first value sets it
  e.add(20);
  EXPECT_DOUBLE_EQ(e.value(), 12);  // 0.8 * 10 + 0.2 * 20
  // A kind's measured step (about 40 ms) becomes the estimate of its next
  // task, which then no longer fits a 60 ms window with its 50 ms margin.
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.background_window_s = 0.06;
  o.margin_s = 0.05;
  Recorder rec;
  Scheduler s(nullptr, o);
  std::promise<void> done;
  Task first = fake(kBg, "prefill", "first", 1, rec, 40ms);
  first.on_done = [&done](TaskOutcome, const std::string&) { done.set_value(); };
  s.submit_background(std::move(first));  // unknown cost: admitted, then measured
  ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
  const TaskId next = s.submit_background(fake(kBg, "prefill", "next", 1, rec));
  const std::optional<TaskDescriptor> d = s.descriptor(next);
  ASSERT_TRUE(d);
  EXPECT_GT(d->next_yield_s, 0.03);
  EXPECT_LT(d->next_yield_s, 1.0);
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(rec.size(), 1u);  // "next" is held back by the window rule
  EXPECT_GE(s.metrics().bg_deferred_window, 1);
}

TEST(Scheduler, CancellationIsHonouredBetweenSteps) {
  Recorder rec;
  Scheduler s(nullptr, fake_options(SchedPolicy::kForegroundFirst));
  std::promise<TaskOutcome> outcome;
  Task t = fake(kFg, "fg", "long", 1000, rec, 2ms);
  t.on_done = [&outcome](TaskOutcome o, const std::string&) { outcome.set_value(o); };
  const TaskId id = s.submit(std::move(t));
  ASSERT_TRUE(wait_until([&] { return rec.size() >= 3; }));
  s.cancel(id);
  auto f = outcome.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(f.get(), TaskOutcome::kCancelled);
  const size_t ran = rec.size();
  EXPECT_LT(ran, 1000u);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(rec.size(), ran);  // no step after the cancellation was seen
  EXPECT_EQ(s.metrics().fg_cancelled, 1);
}

TEST(Scheduler, ForegroundWaitIsAttributedToWhatRanMeanwhile) {
  Recorder rec;
  Scheduler s(nullptr, fake_options(SchedPolicy::kForegroundFirst));
  // The judge step submits a foreground request, then keeps the device for
  // 50 ms more: the request waits behind the judge.
  s.submit_background(fake(kBg, "judge", "J", 1, rec, 0ms, [&](int) {
    s.submit(fake(kFg, "fg", "F", 1, rec));
    std::this_thread::sleep_for(50ms);
  }));
  ASSERT_TRUE(wait_until([&] { return rec.size() == 2; }));
  const SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.wait_count, 1);
  EXPECT_GE(m.wait_sum_s, 0.045);
  ASSERT_TRUE(m.wait_behind_s.count("judge"));
  EXPECT_GE(m.wait_behind_s.at("judge"), 0.045);
  EXPECT_LE(m.wait_behind_s.at("judge"), m.wait_sum_s + 1e-9);
}

TEST(Scheduler, QueuesAreBoundedAndShutdownCancelsWhatWaits) {
  Recorder rec;
  Gate gate;
  SchedulerOptions o = fake_options(SchedPolicy::kForegroundFirst);
  o.max_queue = 2;
  Scheduler s(nullptr, o);
  s.submit(gate.task(rec));
  ASSERT_TRUE(wait_until([&] { return gate.entered.load(); }));
  s.submit(fake(kFg, "fg", "F1", 1, rec));
  s.submit(fake(kFg, "fg", "F2", 1, rec));
  EXPECT_THROW(s.submit(fake(kFg, "fg", "F3", 1, rec)), SchedulerBusy);
  std::promise<TaskOutcome> bg;
  Task b = fake(kBg, "judge", "B", 1, rec);
  b.on_done = [&bg](TaskOutcome o, const std::string&) { bg.set_value(o); };
  s.submit_background(std::move(b));
  std::thread stopper([&] { s.shutdown(0); });
  std::this_thread::sleep_for(20ms);
  gate.open.set_value();
  stopper.join();
  auto f = bg.get_future();
  ASSERT_EQ(f.wait_for(1s), std::future_status::ready);
  EXPECT_EQ(f.get(), TaskOutcome::kCancelled);
  EXPECT_EQ(rec.log(), (std::vector<std::string>{"gate"}));  // F1, F2 and B never ran
  EXPECT_THROW(s.submit(fake(kFg, "fg", "F4", 1, rec)), SchedulerBusy);
  EXPECT_EQ(s.metrics().fg_rejected, 2);
}

// Generation requests on a tiny model.

std::unique_ptr<Engine> tiny_engine() {
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 1;
  o.kv_chunk_size = 16;
  o.prefill_batch = 16;
  o.prefix_cache = true;
  return std::make_unique<Engine>(o);
}

GenerateOptions greedy(int64_t n) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampling.temperature = 0;
  go.stop_at_eog = false;
  return go;
}

// Reads a request's events to the end.
GenerateStats collect(GenerationStream& s, std::string* text = nullptr) {
  for (;;) {
    std::optional<GenerationEvent> e = s.next(5.0);
    if (!e) {
      ADD_FAILURE() << "no event within 5 s";
      return {};
    }
    if (e->kind == GenerationEvent::Kind::kText) {
      if (text) *text += e->text;
      continue;
    }
    EXPECT_EQ(e->kind, GenerationEvent::Kind::kDone) << e->error;
    return e->stats;
  }
}

TEST(Scheduler, ConcurrentGenerationsMatchEachAlone) {
  auto e = tiny_engine();
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(e->tokenizer().encode("Once upon a time, a cat number " + std::to_string(i)));
  std::vector<GenerateStats> alone;
  for (const auto& p : prompts) {
    Session s(*e);
    alone.push_back(generate(s, p, greedy(20), nullptr));
  }
  Scheduler sched(e.get());
  std::vector<std::shared_ptr<GenerationStream>> streams;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.options = greedy(20);
    streams.push_back(sched.submit_generation(std::move(r)));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::string text;
    const GenerateStats st = collect(*streams[i], &text);
    EXPECT_EQ(st.tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(text, alone[i].text) << "request " << i;
  }
  sched.shutdown();
  const SchedulerMetrics m = sched.metrics();
  EXPECT_EQ(m.fg_completed, 4);
  EXPECT_EQ(m.generated_tokens, 80);
  EXPECT_GT(m.rounds, 0);
  EXPECT_LT(m.rounds, 4 * 25);  // batched: the four advanced together
}

// TTFT is to the first sampled token. A stop string that the whole answer
// but its last token begins holds all text back to the end, so the first
// token is timed while no text has come yet.
TEST(Scheduler, AStreamTimesItsFirstTokenEvenWhenItsTextComesLater) {
  auto e = tiny_engine();
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time");
  constexpr int64_t kTokens = 120;  // a window of 119 decode steps without text
  Session alone(*e);
  const GenerateStats ref = generate(alone, prompt, greedy(kTokens), nullptr);
  ASSERT_EQ(ref.generated_tokens, kTokens);
  const std::string held = e->tokenizer().decode(std::span<const TokenId>(ref.tokens.data(), kTokens - 1));
  ASSERT_FALSE(held.empty());
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt = prompt;
  r.options = greedy(kTokens);
  r.options.stop_strings = {held + "\x01"};  // never matches
  const double submitted = now_seconds();
  auto stream = sched.submit_generation(std::move(r));
  double first_token = 0;
  while ((first_token = stream->first_token_at()) == 0) std::this_thread::yield();
  EXPECT_GT(first_token, submitted);
  EXPECT_FALSE(stream->next(0.0)) << "text came with the first token: nothing was held";
  std::string text;
  const GenerateStats st = collect(*stream, &text);
  EXPECT_EQ(st.tokens, ref.tokens);
  EXPECT_EQ(text, ref.text);
  EXPECT_EQ(stream->first_token_at(), first_token) << "set once";

  GenerationRequest none;  // no token sampled: no time
  none.prompt = prompt;
  none.options = greedy(0);
  auto s0 = sched.submit_generation(std::move(none));
  collect(*s0);
  EXPECT_EQ(s0->first_token_at(), 0.0);
}

TEST(Scheduler, AGenerationIsCancelledBetweenSteps) {
  auto e = tiny_engine();
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt = e->tokenizer().encode("Once upon a time");
  r.options = greedy(400);
  auto stream = sched.submit_generation(std::move(r));
  int pieces = 0;
  while (pieces < 3) {
    std::optional<GenerationEvent> ev = stream->next(5.0);
    ASSERT_TRUE(ev);
    ASSERT_EQ(ev->kind, GenerationEvent::Kind::kText);
    ++pieces;
  }
  stream->cancel();
  const GenerateStats st = collect(*stream);
  EXPECT_EQ(st.stop, StopReason::kCancelled);
  EXPECT_LT(st.generated_tokens, 400);
  EXPECT_EQ(sched.metrics().fg_cancelled, 1);
}

TEST(Scheduler, AGenerationThatCannotStartIsAnError) {
  auto e = tiny_engine();
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt.assign(5000, 1);  // longer than the context
  r.options = greedy(4);
  auto stream = sched.submit_generation(std::move(r));
  std::optional<GenerationEvent> ev = stream->next(5.0);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, GenerationEvent::Kind::kError);
  EXPECT_TRUE(ev->invalid_request);
  EXPECT_NE(ev->error.find("context"), std::string::npos) << ev->error;
}

TEST(Scheduler, ControlCallsRunOnTheSchedulerThreadBetweenSteps) {
  auto e = tiny_engine();
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt = e->tokenizer().encode("Once upon a time");
  // Thousands of tokens (seconds), so that it is still running when the
  // calls come however loaded the machine is; it ends by the cancel below.
  r.session.n_ctx = 8192;
  r.options = greedy(8000);
  auto stream = sched.submit_generation(std::move(r));
  ASSERT_TRUE(stream->next(5.0));  // it runs
  // A call made while the generation runs is answered between its steps,
  // with the engine, on another thread than this one.
  const std::thread::id here = std::this_thread::get_id();
  std::future<std::pair<std::thread::id, int64_t>> f =
      sched.call([](Engine& eng) { return std::make_pair(std::this_thread::get_id(), eng.config().n_vocab); });
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  const auto [tid, vocab] = f.get();
  EXPECT_NE(tid, here);
  EXPECT_EQ(vocab, e->config().n_vocab);
  // Its exception reaches the caller; the scheduler goes on.
  std::future<int> bad = sched.call([](Engine&) -> int { throw Error("no such unit"); });
  EXPECT_THROW(bad.get(), Error);
  stream->cancel();
  const GenerateStats st = collect(*stream);
  EXPECT_EQ(st.stop, StopReason::kCancelled);
  sched.shutdown();
  EXPECT_THROW(sched.call([](Engine&) { return 0; }), SchedulerBusy);
  Scheduler none(nullptr, fake_options(SchedPolicy::kFifo));
  EXPECT_THROW(none.call([](Engine&) { return 0; }), Error);
}

// A finished request's KV buffers serve the next request, and go back once
// the scheduler has been idle for kv_spare_idle_s.
TEST(Scheduler, SpareKvBuffersServeTheNextRequestAndGoBackWhenIdle) {
  auto e = tiny_engine();
  SchedulerOptions o;
  o.kv_spare_idle_s = 0.5;
  Scheduler sched(e.get(), o);
  auto run = [&](const std::string& prompt) {
    GenerationRequest r;
    r.prompt = e->tokenizer().encode(prompt);  // with 4 more tokens, shorter than a chunk: nothing is cached
    r.options = greedy(4);
    collect(*sched.submit_generation(std::move(r)));
  };
  auto spare_and_total = [&] {
    return sched.call([](Engine& eng) { return std::make_pair(eng.footprint().kv_spare, eng.ledger().total()); }).get();
  };
  run("Once upon a time");
  const auto [spare, total] = spare_and_total();
  EXPECT_GT(spare, 0u) << "the request's chunks are kept";
  run("A dog ran");
  const auto [spare2, total2] = spare_and_total();
  EXPECT_EQ(spare2, spare) << "the next request took them and gave them back: nothing new was mapped";
  EXPECT_EQ(total2, total);
  // Idle: they go back (the scheduler checks at least every 0.1 s).
  const double t0 = now_seconds();
  while (sched.metrics().footprint.kv_spare > 0 && now_seconds() - t0 < 10) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(sched.metrics().footprint.kv_spare, 0u);
  EXPECT_GE(now_seconds() - t0, 0.3) << "not before the idle time";
  EXPECT_EQ(sched.call([](Engine& eng) { return eng.ledger().total(); }).get(), total - static_cast<int64_t>(spare));
}

// A training job interleaved with generation requests (round-robin: a job
// phase, a batched decode round, a phase, ...), with evictions of everything
// or a share of the footprint at random boundaries of the job's phases
// (seeded; on the scheduler thread, between the job's phase and the next
// round, as a control call runs): the next phase and the next round
// acquire their layers again. Every generation's greedy text equals the
// un-evicted run's, and the job's losses and trained adapter (its digest,
// over every byte) equal those of the same job run alone without eviction.
// KV is evicted raw (lossless_kv), so only the weights' path is under test.
TEST(Scheduler, EvictionsBetweenTrainingPhasesAndRoundsChangeNoResult) {
  test::TempDir swap("ebb-sched-swap");
  auto engine = [&] {
    EngineOptions o;
    o.model_path = test::model_path("stories260K.gguf");
    o.n_threads = 1;
    o.kv_chunk_size = 16;
    o.prefill_batch = 16;
    o.prefix_cache = true;
    o.elastic_opts.lossless_kv = true;
    o.elastic_opts.swap_dir = swap.path();
    return std::make_unique<Engine>(o);
  };
  auto ref = engine(), e = engine();
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(ref->tokenizer().encode("Once upon a time, a dog number " + std::to_string(i)));
  std::vector<std::string> alone;
  for (const auto& p : prompts) {
    Session s(*ref);
    alone.push_back(generate(s, p, greedy(30), nullptr).text);
  }
  std::vector<TrainSample> samples;
  for (const char* text : {"Once upon a time, there was a red fox named Zed. Zed liked to dance.",
                           "One day, a small blue bird sang a song to the moon."}) {
    TrainSample x;
    x.tokens = ref->tokenizer().encode(text);
    x.weights.assign(x.tokens.size(), 1.0f);
    samples.push_back(std::move(x));
  }
  TrainerOptions to;
  to.init.rank = 4;
  to.adamw.lr = 1e-2f;
  to.adamw.total_steps = 3;
  to.batch = 2;
  to.phase_layers = 1;
  to.phase_head_rows = 16;
  TrainJobOptions jo;
  jo.adapter = "fox";
  jo.steps = 3;
  auto staged_digest = [](const Engine& eng, const TrainJobStatus& st) {
    for (const AdapterInfo& a : eng.adapters().list())
      if (a.name == st.adapter && a.version == st.version_staged) return a.digest;
    return uint64_t{0};
  };
  auto alone_job = TrainJob::make(*ref, samples, to, jo);
  while (alone_job->step()) {
  }
  alone_job->finish(TaskOutcome::kCompleted, "");
  const TrainJobStatus want = alone_job->status();
  ASSERT_EQ(want.state, TrainJobState::kDone) << want.error;

  auto job = TrainJob::make(*e, samples, to, jo);
  SchedulerOptions so;
  so.policy = SchedPolicy::kRoundRobin;
  Scheduler sched(e.get(), so);
  Task t = job->task(&sched);
  std::mt19937 rng(5);
  int evictions = 0;
  int64_t weights_dropped = 0, kv_evicted = 0;
  t.step = [inner = t.step, &rng, &evictions, &weights_dropped, &kv_evicted, eng = e.get()] {
    if (rng() % 3 == 0) {
      const double share = rng() % 2 ? 1.0 : 0.25;
      const EvictReport r = eng->evict(static_cast<uint64_t>(share * static_cast<double>(eng->footprint().total())) + 1);
      ++evictions;
      weights_dropped += r.weights_dropped;
      kv_evicted += r.kv_to_storage + r.kv_to_compressed;
    }
    return inner();
  };
  sched.submit_background(std::move(t));
  std::vector<std::shared_ptr<GenerationStream>> streams;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.options = greedy(30);
    streams.push_back(sched.submit_generation(std::move(r)));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::string text;
    collect(*streams[i], &text);
    EXPECT_EQ(text, alone[i]) << "request " << i;
  }
  ASSERT_TRUE(job->wait(60));
  sched.shutdown();
  const TrainJobStatus got = job->status();
  EXPECT_EQ(got.state, TrainJobState::kDone) << got.error;
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.first_loss, want.first_loss);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_NE(staged_digest(*ref, want), 0u);
  EXPECT_EQ(staged_digest(*e, got), staged_digest(*ref, want)) << "the trained adapters differ";
  EXPECT_GE(evictions, 5);
  EXPECT_GT(weights_dropped, 0);
  EXPECT_GT(kv_evicted, 0) << "no eviction came while a generation held KV";
  EXPECT_GT(got.yields, 0) << "the job never yielded to a generation round";
}

}  // namespace
}  // namespace ebb
