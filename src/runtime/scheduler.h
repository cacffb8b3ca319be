// The cooperative scheduler (LOCAL §4): the one place that admits model
// execution on an engine. One thread, the scheduler's, owns the engine; other
// threads (an HTTP server's) only submit work and read results.
//
// Every unit of work is a task with a descriptor
//   d(x) = (class, priority, adapter, t̂, m̂, ŷ, utility)
// whose cost estimates are exponential moving averages (α = 0.2) of what
// its steps measured (per task, and per kind so that a new task of a known
// kind starts from its kind's averages).
//
//   foreground   user-visible: generation requests (each a Generation on its
//                own Session) and generic foreground tasks. Admitted in
//                (priority, arrival) order up to max_batch at a time; the
//                admitted generations advance together, one batched step per
//                round (step_generations: every weight read once per step for
//                all of them), and new requests join between steps.
//   background   a queue of tasks whose unit of work is a callback
//                `bool step()` (false when done), e.g. judge calls, cache
//                prefill, training phases. A task is admissible when
//                  m̂ + M_reserve <= M_free  and  ŷ + δ <= W_bg
//                (δ = 0.05 s); it runs one step at a time, so a foreground
//                arrival takes over at the task's next step boundary.
//                Admissible ones run by priority, then utility, with aging:
//                a task passed over for background_aging_s of other tasks'
//                steps goes first, so utility orders without starving.
//
// Policies, for the ablation (LOCAL Figure 8):
//   foreground-first  (default) background runs only when no foreground task
//                     waits or runs; a running background task yields at its
//                     next step boundary.
//   round-robin       rotates over task kinds ("inference" and each
//                     background kind) one unit at a time, whether or not
//                     foreground work waits.
//   fifo              one arrival-ordered queue; an admitted background task
//                     runs to its end before anything that arrived after it.
// The admission inequalities hold under every policy (they are about the
// device's capacity); the policies differ in order only.
//
// Each foreground wait (submission to admission) is attributed to the kinds
// of the units that ran while it waited ("inference" for generation rounds).
// Cancellation (a client that went away) is honoured between steps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "memory/prefix_cache.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/adapters.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace ebb {

enum class TaskClass { kForeground, kBackground };
enum class SchedPolicy { kForegroundFirst, kRoundRobin, kFifo };

std::string_view sched_policy_name(SchedPolicy p);
// "foreground-first", "round-robin", "fifo"; nullopt otherwise.
std::optional<SchedPolicy> parse_sched_policy(std::string_view name);

// An exponential moving average: the first value sets it.
class Ema {
 public:
  explicit Ema(double alpha = 0.2) : alpha_(alpha) {}
  void add(double v) {
    value_ = set_ ? (1 - alpha_) * value_ + alpha_ * v : v;
    set_ = true;
  }
  bool set() const { return set_; }
  double value() const { return value_; }

 private:
  double alpha_;
  double value_ = 0;
  bool set_ = false;
};

// d(x): what the scheduler knows of a task before it runs a step of it.
struct TaskDescriptor {
  TaskClass cls = TaskClass::kBackground;
  std::string kind;             // "judge", "train", "prefill", ...: attribution and round-robin
  int priority = 0;             // higher first
  std::string adapter;          // adapter the task runs under ("": base)
  double est_duration_s = 0;    // t̂: the whole task (0: unknown)
  uint64_t est_memory = 0;      // m̂: bytes a step needs beyond what is held
  double next_yield_s = 0;      // ŷ: the next step's non-yielding time (0: unknown)
  double utility = 0;           // among admissible background tasks, higher first (after priority)
};

enum class TaskOutcome { kCompleted, kCancelled, kFailed };

// A unit of schedulable work: step() runs one bounded piece of it (at most
// ŷ seconds without yielding) and returns false when the task is done. It
// runs on the scheduler thread, and may use the engine.
struct Task {
  TaskDescriptor desc;
  std::function<bool()> step;
  // Called once on the scheduler thread at the end (error: the step's
  // exception message when kFailed).
  std::function<void(TaskOutcome, const std::string& error)> on_done;
};

using TaskId = uint64_t;

// A submission the scheduler cannot take (its queue is full, or it is
// shutting down): an HTTP server answers 503.
class SchedulerBusy : public Error {
 public:
  using Error::Error;
};

// A generation request: a fresh session of the engine (which takes its
// longest cached prefix from the prefix cache when the engine has one), the
// prompt, and how to generate.
struct GenerationRequest {
  std::vector<TokenId> prompt;
  GenerateOptions options;
  SessionOptions session;
  std::vector<AdapterBinding> adapters;
  int priority = 0;
  // Choices of this prompt (OpenAI's n): the prompt is prefilled once, by
  // choice 0; then choices 1..n-1 fork its session (Session::fork_from: the
  // prompt's KV chunks shared, held once, its last logits copied) and all
  // decode together in the batched steps. Each choice samples on its own:
  // seed + i when options.sampling.seed is set (else a random seed each),
  // its own copy of options.constraint. Counts n against max_batch.
  int n_choices = 1;
};

struct GenerationEvent {
  enum class Kind { kText, kDone, kError };
  Kind kind = Kind::kText;
  int choice = 0;            // kText, kDone: which of the request's n_choices
  std::string text;          // kText: the next piece
  // kText, kDone: the tokens sampled since the choice's previous event (ids,
  // and log-probabilities when options.logprobs >= 0), in order; a kText
  // event's text may come from earlier tokens (held back) or later ones.
  std::vector<StepLogprobs> tokens;
  GenerateStats stats;       // kDone
  std::string error;         // kError
  bool invalid_request = false;  // kError: the request could not run (vs an internal failure)
};

// One request's results, handed from the scheduler thread to the thread
// that waits for them. Thread-safe.
class GenerationStream {
 public:
  // The next event, waiting up to timeout_s; nullopt on timeout. After
  // kError, or the kDone of every choice, nothing more comes.
  std::optional<GenerationEvent> next(double timeout_s);
  // Asks the scheduler to end the request before its next step (the client
  // went away); a cancelled request ends with kDone, stop kCancelled.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  uint64_t id() const { return id_; }
  // When the request's first token was sampled (now_seconds()), 0 until then
  // or if none was. Its text can come later: a token that ends inside a UTF-8
  // character, or text held back by a stop string, shows with a later one.
  double first_token_at() const { return first_token_at_.load(std::memory_order_acquire); }

 private:
  friend class Scheduler;
  void push(GenerationEvent e);
  // Records now as the first token's time, once.
  void mark_first_token() {
    if (first_token_at_.load(std::memory_order_relaxed) == 0)
      first_token_at_.store(now_seconds(), std::memory_order_release);
  }

  uint64_t id_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::atomic<double> first_token_at_{0};
};

struct SchedulerOptions {
  SchedPolicy policy = SchedPolicy::kForegroundFirst;
  int max_batch = 8;                      // foreground tasks running together at most
  int max_queue = 64;                     // waiting foreground submissions at most
  int max_background = 256;               // waiting background tasks at most
  uint64_t memory_reserve = 64ull << 20;  // M_reserve
  double background_window_s = 0.5;       // W_bg: the longest a foreground arrival may wait for a step
  double margin_s = 0.05;                 // δ
  // A background task held back by the window rule alone for this long,
  // with no foreground work waiting or running, is admitted anyway (0:
  // never). Without it a task whose step is longer than W_bg − δ (a
  // training phase on a slow device) would never run on an idle engine.
  // The episode belongs to the task's kind: the next task of a kind that
  // ran past the window (training submitted one task per optimizer step)
  // continues it while the engine stays free of foreground work, rather
  // than waiting window_starvation_s again.
  double window_starvation_s = 5.0;
  // Aging of the utility order: among admissible background tasks of equal
  // priority, one passed over (admissible, not picked) while others ran
  // this many seconds of background steps since its own last step goes
  // before those not yet aged, whatever their utility; the most passed
  // over first. Without it a stream of high-utility tasks (cross-agent
  // pre-prefill, stale-coverage prefill) starves the utility-0 ones
  // (training, judge calls) for as long as it lasts. 0: utility alone.
  double background_aging_s = 2.0;
  // Guaranteed shares of the engine's time, by kind: while a kind's share
  // of the recent busy seconds (foreground rounds and background steps,
  // decayed over background_share_horizon_s of busy time) is below its
  // share here, its best admissible task goes first:
  //   - before the other background kinds of equal priority, whatever
  //     their utility or aging (training is a stream of utility-0 steps
  //     beside high-utility cache work: aging alone gives it one step per
  //     background_aging_s of that work);
  //   - under foreground-first and with shares_over_foreground, before
  //     waiting or running foreground work,
  //     one step at a time, at most one between two foreground rounds (a
  //     foreground that saturates the engine would otherwise leave the kind
  //     nothing). Here the share is of the recent time the foreground and
  //     the shared kinds used, not of all busy time: the other kinds' work
  //     (pre-prefill, stale prefill) ran in time the foreground left idle,
  //     so it never makes a kind owed over the foreground. The step is
  //     still bounded by the
  //     window rule (ŷ + δ <= W_bg: no starvation exception while
  //     foreground work is there), so a foreground arrival waits for at
  //     most one such step; SchedulerMetrics::bg_share_fg counts them.
  // Shares only order tasks that are admissible anyway; a kind that gets
  // the idle time is above its share and takes nothing from the
  // foreground. Empty: none.
  std::map<std::string, double> background_shares = {{"train", 0.5}};
  // Whether a share also goes ahead of the foreground (above). Off, a share
  // only orders the background kinds, and a foreground that saturates the
  // engine leaves them nothing: pure foreground-first. On in ebb serve
  // --learn (--train-share) and bench agents' systems.
  bool shares_over_foreground = false;
  double background_share_horizon_s = 10.0;
  double ema_alpha = 0.2;
  // M_free. Default: the system's available memory (MemAvailable), bounded
  // by the process's cgroup limit less its usage.
  std::function<uint64_t()> free_memory;
  // Bytes in use, read before and after each background step to measure
  // its memory (m̂). Default: the engine's ledger (none without an engine).
  std::function<uint64_t()> used_memory;
  // Offload before admission (LOCAL §6.2; runtime/offload_admission.h): a
  // background task of one of `offload_kinds` that the memory rule holds
  // back, while background work could run, asks `offload` for the bytes it
  // is short (m̂ + M_reserve - M_free) and is admitted when M_free then
  // suffices; otherwise it stays pending (SchedulerMetrics::bg_pending_memory)
  // and asks again after offload_retry_s. offload runs on the scheduler
  // thread under its lock (between steps: it may use the engine, never the
  // scheduler) and returns the bytes it freed. nullptr: no offload.
  std::function<uint64_t(uint64_t bytes)> offload;
  std::vector<std::string> offload_kinds = {"train", "prefill", "maintenance"};
  double offload_retry_s = 0.5;
  // How often the scheduler thread refreshes the engine snapshot (footprint,
  // prefix cache) that metrics() returns.
  double snapshot_interval_s = 0.25;
  // Released KV chunk buffers kept for the next requests (Engine::
  // set_kv_spare_limit: none under a memory limit), and given back once the
  // scheduler has had nothing to run for kv_spare_idle_s.
  uint64_t kv_spare_bytes = 256ull << 20;
  double kv_spare_idle_s = 2.0;
};

struct SchedulerMetrics {
  // Foreground.
  int64_t fg_submitted = 0, fg_completed = 0, fg_cancelled = 0, fg_failed = 0, fg_rejected = 0;
  // Generations that waited because the memory limit had no room for their KV.
  int64_t fg_deferred_memory = 0;
  int64_t fg_waiting = 0, fg_running = 0;
  int64_t prompt_tokens = 0;     // prompt tokens of finished requests
  int64_t cached_tokens = 0;     // of which taken from the prefix cache
  int64_t generated_tokens = 0;  // tokens generated (running requests included)
  int64_t rounds = 0;            // foreground rounds (batched steps)
  double fg_busy_s = 0;
  double decode_tok_s = 0;       // generated tokens per second of foreground rounds (EMA over rounds)
  // Foreground queue wait (submission to admission).
  int64_t wait_count = 0;
  double wait_sum_s = 0, wait_max_s = 0, wait_p50_s = 0, wait_p95_s = 0, wait_p99_s = 0;
  std::map<std::string, double> wait_behind_s;  // by the kind of unit that ran meanwhile
  // Background.
  int64_t bg_submitted = 0, bg_completed = 0, bg_cancelled = 0, bg_failed = 0, bg_rejected = 0;
  int64_t bg_waiting = 0, bg_steps = 0;
  int64_t bg_deferred_memory = 0, bg_deferred_window = 0;  // times a task was held back by each rule
  int64_t bg_over_window = 0;  // steps admitted past the window rule after window_starvation_s
  int64_t bg_aged = 0;         // steps picked ahead of higher utility by background_aging_s
  int64_t bg_share = 0;        // steps picked ahead of the others by background_shares
  int64_t bg_share_fg = 0;     // of all steps, those run ahead of waiting or running foreground work by it
  std::map<std::string, double> share_recent;  // background_shares' kinds: their share of the recent busy time
  double bg_busy_s = 0;
  std::map<std::string, double> bg_busy_by_kind_s;  // background step seconds, by kind
  // The scheduler thread idle (nothing admissible, no control call), in
  // all and while background tasks waited (held back by the rules above).
  double idle_s = 0, idle_bg_waiting_s = 0;
  // Waiting background tasks held back, at their last check, by each rule
  // (the reasons /metrics shows as ebb_background_pending{reason=...}).
  int64_t bg_pending_memory = 0, bg_pending_window = 0;
  // Offload before admission: requests made, bytes they freed, tasks
  // admitted after one, requests that could not make enough room.
  int64_t offload_requests = 0, offload_admitted = 0, offload_short = 0;
  uint64_t offload_freed_bytes = 0;
  // The engine at the last snapshot (empty without an engine).
  bool has_engine = false;
  Footprint footprint;
  PrefixCacheStats prefix_cache;
  bool prefix_cache_on = false;
};

class Scheduler {
 public:
  // engine: the engine generation requests run on (nullptr: generic tasks
  // only). The scheduler thread starts here and owns the engine from now
  // on: other threads must not run it.
  explicit Scheduler(Engine* engine, SchedulerOptions opts = {});
  ~Scheduler();  // shutdown(0)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Thread-safe. Throws SchedulerBusy when the foreground queue is full or
  // the scheduler is shutting down; ebb::Error without an engine.
  std::shared_ptr<GenerationStream> submit_generation(GenerationRequest req);
  // Thread-safe. A task of class kForeground goes to the foreground queue
  // (and runs one step per round), else to the background queue. Throws
  // SchedulerBusy when that queue is full or the scheduler is shutting down.
  TaskId submit(Task task);
  TaskId submit_background(Task task) {
    task.desc.cls = TaskClass::kBackground;
    return submit(std::move(task));
  }
  // Ends a waiting or running task before its next step (on_done kCancelled).
  void cancel(TaskId id);

  // Control work: runs fn(engine) on the scheduler thread at the next step
  // boundary, before any queued unit (evict, restore, load or publish an
  // adapter, change a limit). Thread-safe; the future carries fn's result
  // or exception, and a broken promise when the scheduler has ended. Throws
  // ebb::Error without an engine, SchedulerBusy after shutdown.
  template <class F>
  auto call(F fn) -> std::future<std::invoke_result_t<F&, Engine&>> {
    using R = std::invoke_result_t<F&, Engine&>;
    if (!engine_) throw Error("scheduler: control calls need an engine");
    auto task = std::make_shared<std::packaged_task<R()>>([this, fn = std::move(fn)]() mutable { return fn(*engine_); });
    std::future<R> f = task->get_future();
    post_control([task] { (*task)(); });
    return f;
  }

  // True while a foreground submission waits for admission: a long step
  // may check it to yield early.
  bool foreground_waiting() const { return fg_waiting_.load(std::memory_order_relaxed) > 0; }

  // Background admission's inputs may change while tasks wait.
  void set_background_window(double seconds);

  SchedulerMetrics metrics() const;
  // M_free - M_reserve (0 when under): what background work may take now.
  // Thread-safe (calls options().free_memory).
  uint64_t memory_headroom() const;
  const SchedulerOptions& options() const { return opts_; }
  // The descriptor of a waiting or running task, with its current estimates.
  std::optional<TaskDescriptor> descriptor(TaskId id) const;

  // Stops taking work and cancels everything waiting; running generations
  // get up to grace_s to finish, then are cancelled, and a running
  // background task stops at its next step boundary. Returns when the
  // scheduler thread has ended. Idempotent.
  void shutdown(double grace_s = 0);

 private:
  struct FgItem;
  struct BgItem;
  struct Running;
  struct Unit;
  struct KindCost {
    Ema step_s, memory, duration_s;
  };

  void post_control(std::function<void()> fn);
  bool run_control();  // runs what post_control queued; true when it ran any
  void loop();
  Unit pick_locked(uint64_t free_mem);
  bool no_foreground_locked() const;
  // Under the engine's memory limit (0: none): what counts against it now
  // (weights, KV, compressed KV, I/O buffers), and the KV a generation may
  // grow to (prompt + max_tokens, within the context, whole chunks).
  // Scheduler thread.
  uint64_t engine_memory_limit() const;
  uint64_t in_ram_under_limit() const;
  uint64_t kv_projection(const GenerationRequest& g) const;
  // Drops prefix-cache chunks only the cache holds (coldest first) to free
  // `bytes` under the limit; returns the bytes freed.
  uint64_t make_room(uint64_t bytes);
  bool admissible_locked(BgItem& b, uint64_t free_mem, bool count);
  void reap_cancelled_locked(std::vector<std::function<void()>>& after);
  void run_foreground_round(std::vector<std::unique_ptr<FgItem>> admitted);
  void run_background_step(BgItem& b);
  void start_generation(FgItem& item);
  // Choices 1..n-1 of a running generation whose prompt is in: forks of its
  // session, added to running_. Scheduler thread.
  void fork_choices(Running& leader);
  // Makes r->gen on r->session for choice `choice` of req (options per choice).
  void make_generation(Running& r, const GenerationRequest& req, int choice);
  void finish_running(size_t i, TaskOutcome outcome, const std::string& error);
  void attribute_wait_locked(const std::string& kind, double seconds);
  void record_wait_locked(double seconds);
  void refresh_snapshot(bool force);
  uint64_t free_memory() const;
  uint64_t used_memory() const;
  KindCost& kind_cost_locked(const std::string& kind);
  void apply_kind_estimates_locked(TaskDescriptor& d);

  Engine* engine_;
  SchedulerOptions opts_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<FgItem>> fg_queue_;
  std::vector<std::unique_ptr<BgItem>> bg_queue_;
  std::deque<std::function<void()>> control_;  // call()'s work, before any unit
  std::map<std::string, KindCost> kind_costs_;
  // Recent busy seconds by background kind, and in all (foreground rounds
  // too) for background_shares, decayed over background_share_horizon_s of
  // busy time.
  std::map<std::string, double> bg_recent_s_;
  double bg_recent_total_s_ = 0;
  double fg_recent_s_ = 0;  // the foreground rounds' part of it
  // Adds dt seconds of busy time (kind "": a foreground round).
  void note_busy_locked(const std::string& kind, double dt);
  // Under foreground-first with foreground work there: the admissible task
  // of the kind furthest below its guaranteed share, if any.
  BgItem* owed_over_foreground_locked(const std::vector<BgItem*>& ok);
  bool owed_ran_last_ = false;  // the last unit picked was such a step: the foreground goes next
  // Kinds whose tasks were held back by the window on an idle engine: when
  // the episode began (window_starvation_s). Cleared by foreground work.
  std::map<std::string, double> window_since_kind_;
  uint64_t next_seq_ = 1;
  double window_s_;
  bool stopping_ = false;
  bool ended_ = false;  // the loop has ended: call() refuses
  double stop_deadline_ = 0;
  std::atomic<int64_t> fg_waiting_{0};
  SchedulerMetrics m_;
  std::vector<double> recent_waits_;  // ring of the latest waits, for the percentiles
  size_t recent_next_ = 0;
  // Round-robin's rotation over kinds, and FIFO's admitted background task.
  std::vector<std::string> rr_kinds_;
  size_t rr_next_ = 0;
  BgItem* fifo_active_ = nullptr;
  std::set<TaskId> cancelled_running_;  // cancel(id) of tasks that may be running

  // The scheduler thread's own: what runs now.
  std::vector<std::unique_ptr<Running>> running_;
  double last_snapshot_ = -1e9;
  double last_work_ = 0;  // when a unit or control call last ran
  bool snapshot_dirty_ = true;
  Ema decode_rate_;
  int64_t made_before_ = 0;

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace ebb
