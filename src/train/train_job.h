// A training job on the cooperative scheduler (LOCAL §4.2, §7.1): a Trainer
// driven as one background Task of kind "train", one trainer phase per
// step(), so that a foreground arrival takes over at the next phase
// boundary. The order of a job's life:
//
//   make()     builds the trainer (on the thread that owns the engine: the
//              scheduler's, through Scheduler::call, or before a scheduler
//              runs it); state queued
//   submit()   hands task() to the scheduler; its descriptor starts from the
//              trainer's phase estimates (ŷ: the longest phase's EMA, m̂: the
//              next forward's activations), which the scheduler then moves
//              with what each step measured
//   step()     running: one phase (forward, backward or commit of a
//              micro-batch); after a commit that ends a commit interval the
//              next step() stages the parameters as a new version of the
//              adapter (published at once with publish_auto) and, with an
//              output directory, writes NAME.gguf and the checkpoint NAME.ckpt/
//   the end    done (every version published), committed (the last version
//              staged, waiting for publish()), cancelled (cancel(): at the next
//              phase boundary, the partial step dropped) or failed (a phase
//              threw; nothing of the partial step is exposed)
//
// Thread model: step() and the on_done callback run on the scheduler thread;
// status(), cancel() and wait() from any thread. publish() uses the
// adapter registry, which is thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "train/trainer.h"

namespace ebb {

enum class TrainJobState { kQueued, kRunning, kCommitted, kDone, kFailed, kCancelled };
// "queued", "running", "committed", "done", "failed", "cancelled"
const char* train_job_state_name(TrainJobState s);

struct TrainJobOptions {
  std::string adapter;        // the registry name of the versions it stages (required)
  int64_t steps = 1;          // optimizer steps to run
  int64_t commit_every = 0;   // stage a version every N steps as well (0: only at the end)
  bool publish_auto = true;   // publish each staged version at once (else publish())
  std::string out_dir;        // "" : no files; else OUT/NAME.gguf and OUT/NAME.ckpt/ on each commit
  int priority = 0;           // the task descriptor's
  double utility = 0;
  // Called on the scheduler thread after each commit: the version staged
  // (info.published when publish_auto made it the default) and the earlier
  // version this job dropped (0: none). The server starts stale-coverage
  // prefill of a staged version here.
  std::function<void(const AdapterInfo& staged, uint64_t dropped)> on_commit;
};

struct TrainJobStatus {
  TrainJobState state = TrainJobState::kQueued;
  std::string adapter;
  int64_t step = 0, steps = 0;
  double loss = 0;            // the last step's mean weighted loss
  double loss_ema = 0;        // EMA (α = 0.2) over the steps
  double first_loss = 0;      // the first step's
  int64_t tokens = 0;         // tokens of the forward phases run
  int64_t phases = 0;         // trainer phases run (forward, backward, commit)
  int64_t yields = 0;         // times other scheduler work ran between two of its phases
  int64_t interruptions = 0;  // ... of which inside a step (between two of its micro-batches' phases)
  int64_t commits = 0, publishes = 0;
  uint64_t version_staged = 0;     // the last staged version (0: none)
  uint64_t version_published = 0;  // the last published version (0: none)
  double created_s = 0, started_s = 0, finished_s = 0;  // now_seconds() clock (0: not yet)
  double run_s = 0;                      // sum of its steps' durations
  double phase_s[3] = {0, 0, 0};         // by PhaseKind: total seconds
  double phase_max_s[3] = {0, 0, 0};     // by PhaseKind: longest
  double phase_est_s[3] = {0, 0, 0};     // by PhaseKind: the trainer's EMA estimate
  double save_s = 0;                     // staging and writing files
  uint64_t peak_bytes = 0;               // the trainer's own peak allocations
  std::vector<std::string> files;        // written under out_dir (names relative to it)
  std::string error;                     // kFailed: what failed
};

class TrainJob : public std::enable_shared_from_this<TrainJob> {
 public:
  // Builds the trainer over `engine` (a new adapter from topts.init, or
  // continuing `start`, which is copied). Throws ebb::Error for bad options
  // or samples (the trainer's checks).
  static std::shared_ptr<TrainJob> make(Engine& engine, std::vector<TrainSample> samples, TrainerOptions topts,
                                        TrainJobOptions jopts, const LoraAdapter* start = nullptr);
  ~TrainJob();
  TrainJob(const TrainJob&) = delete;
  TrainJob& operator=(const TrainJob&) = delete;

  // The job as a scheduler task (holding the job alive until it ends).
  // `sched` (optional) lets it tell yields from running alone.
  Task task(const Scheduler* sched = nullptr);
  // Submits task() as a background task; returns its id. Throws
  // SchedulerBusy as Scheduler::submit does (the job is then failed).
  TaskId submit(Scheduler& sched);
  TaskId task_id() const;

  // One unit: a trainer phase, or the staging and files after a commit.
  // False when the job has nothing more to run. Scheduler thread (or the
  // engine's owner when driven without a scheduler).
  bool step();
  // Called at the end with the scheduler's outcome (task()'s on_done).
  void finish(TaskOutcome outcome, const std::string& error);

  // Ends the job at its next phase boundary (and, when submitted, cancels
  // its task). Thread-safe; idempotent.
  void cancel();
  // Publishes `version` (0: the last staged one) of the adapter. Throws
  // ebb::Error when nothing is staged or the version is unknown.
  uint64_t publish(uint64_t version = 0);

  TrainJobStatus status() const;
  bool finished() const;
  // Waits up to timeout_s for the end; true when it ended.
  bool wait(double timeout_s) const;

 private:
  TrainJob(Engine& engine, std::unique_ptr<Trainer> trainer, TrainJobOptions opts);
  void save();  // stages the committed parameters and writes the files (scheduler thread)
  uint64_t sched_units() const;

  Engine& engine_;
  std::unique_ptr<Trainer> trainer_;  // freed at the end (its memory goes back)
  const TrainJobOptions opts_;
  int64_t batch_ = 1;           // samples per step (for the duration estimate)
  const Scheduler* sched_ = nullptr;
  Scheduler* submitted_to_ = nullptr;
  TaskId task_id_ = 0;
  bool save_pending_ = false;   // a commit wants its version staged next
  uint64_t units_seen_ = 0;     // the scheduler's units after our last step
  bool cancel_requested_ = false;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  TrainJobStatus st_;
};

}  // namespace ebb
