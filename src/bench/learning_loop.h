// The learning side of the synthetic workloads of ebb bench sched and ebb
// bench agents, on one engine's scheduler: a LoRA training job on fixed
// samples (adapter "agent"), a publisher that publishes each staged version
// publish_wait_s after it was staged (with stale-coverage prefill of the
// staged version meanwhile, when on), and judge calls as background tasks.
//
// Training comes in one of three granularities:
//   kPhases   one task per optimizer step, one trainer phase per scheduler
//             step (preemptible at phase boundaries: ebb's way);
//   kSteps    one task per optimizer step, the whole step in one unit
//             (non-preemptible training);
//   kWindows  sleep/train/wake (the full-LoRA serving path of LOCAL §7.4):
//             every window_gap_s a control call stops serving at the next
//             step boundary for a whole window: sleep (the prefix cache's
//             KV and the spare KV buffers are dropped, as a sleeping
//             server discards its KV cache), SleepWakeOptions::steps whole
//             optimizer steps (with their commits), then wake (the weights
//             read back in from the model file, as a waking server reloads
//             them) before serving resumes with a cold prefix cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/sched_workload.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/stale_prefill.h"

namespace ebb {
class TrainJob;
}

namespace ebb::cli {

inline constexpr const char* kLearnedAdapter = "agent";

enum class TrainGranularity { kPhases, kSteps, kWindows };

// The sleep/train/wake window (kWindows). LOCAL §7.4's vLLM window is
// about 12.1 s: 1.0 s to sleep, 9.7 s to train, 1.5 s to wake; its
// training part is many optimizer steps, not one.
struct SleepWakeOptions {
  int64_t steps = 5;          // optimizer steps per window
  bool drop_cache = true;     // sleep: drop the prefix cache and spare KV buffers
  std::string reload_path;    // wake: read this file (the model) back in ("": no reload)
  // The serving time between windows: drawn (seeded by the workload) from an
  // exponential distribution with mean window_gap_s, so where the windows
  // fall is independent of the foreground's own rhythm (fixed gaps beat
  // against a workload's periodic turns, and the share of turns that meets a
  // window swings from run to run); false: exactly window_gap_s each.
  bool random_gaps = true;
};

// Called on the publisher thread with the version: after it was staged
// (before its stale-coverage prefill is planned) and after it was published.
struct LearningCallbacks {
  std::function<void(uint64_t)> on_staged, on_publish;
};

struct LearningResult {
  int64_t commits = 0, publishes = 0, train_steps = 0, judge_calls = 0;
  int64_t stale_tasks = 0, stale_completed = 0, stale_tokens = 0, stale_chunks = 0;
  int64_t publish_failures = 0;
  int64_t train_phases = 0;    // trainer phases run
  double train_run_s = 0;      // seconds in training steps
  int64_t windows = 0;         // kWindows: training windows run
  double window_s = 0;         // their time in all
  double sleep_s = 0, wake_s = 0;  // of which sleeping and waking
  uint64_t wake_bytes = 0;         // read back at wakes
};

class LearningLoop {
 public:
  // Starts training (w's train_* , rank, commit_every, phase_s, seed) and
  // the publisher (publish_wait_s), which calls `callbacks` (optional).
  LearningLoop(Engine& engine, Scheduler& sched, const SchedWorkload& w, TrainGranularity g, bool stale_prefill,
               double window_gap_s = 1.0, LearningCallbacks callbacks = {},
               StalePrefillOptions stale_opts = {}, SleepWakeOptions sleep_wake = {});
  // stop(). Shut the scheduler down first: its tasks call back into this.
  ~LearningLoop();
  LearningLoop(const LearningLoop&) = delete;
  LearningLoop& operator=(const LearningLoop&) = delete;

  // A judge call: a background task over `prompt`, w.judge_gen greedy tokens.
  void judge(std::vector<TokenId> prompt, SessionOptions so);
  // Whether the adapter has a published version (requests bind it then).
  bool published() const;
  int64_t publishes() const { return publishes_.load(); }
  // Stops training, publishing and the windows; the scheduler keeps running.
  void stop();
  // After stop().
  LearningResult result() const;

 private:
  void submit_train();
  void sleep_server(Engine& e);  // on the scheduler thread
  void wake_server();
  Engine& engine_;
  Scheduler& sched_;
  SchedWorkload w_;
  TrainGranularity g_;
  bool stale_;
  std::shared_ptr<TrainJob> job_;
  StalePrefill warm_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> publishes_{0}, judges_{0}, stale_tasks_{0}, windows_{0}, publish_failures_{0}, train_failures_{0};
  std::atomic<double> window_s_{0}, sleep_s_{0}, wake_s_{0};
  std::atomic<uint64_t> wake_bytes_{0};
  SleepWakeOptions sw_;
  LearningCallbacks cb_;
  std::thread publisher_, windows_thread_;
  bool stopped_ = false;
};

}  // namespace ebb::cli
