#include "train/train_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "platform/error.h"
#include "platform/timer.h"

namespace ebb {

const char* train_job_state_name(TrainJobState s) {
  switch (s) {
    case TrainJobState::kQueued: return "queued";
    case TrainJobState::kRunning: return "running";
    case TrainJobState::kCommitted: return "committed";
    case TrainJobState::kDone: return "done";
    case TrainJobState::kFailed: return "failed";
    case TrainJobState::kCancelled: return "cancelled";
  }
  return "?";
}

namespace {

constexpr double kLossAlpha = 0.2;

bool is_final(TrainJobState s) {
  return s == TrainJobState::kCommitted || s == TrainJobState::kDone || s == TrainJobState::kFailed ||
         s == TrainJobState::kCancelled;
}

}  // namespace

std::shared_ptr<TrainJob> TrainJob::make(Engine& engine, std::vector<TrainSample> samples, TrainerOptions topts,
                                         TrainJobOptions jopts, const LoraAdapter* start) {
  if (jopts.adapter.empty()) throw Error("a training job needs the name of its adapter");
  if (jopts.steps < 1) throw Error("a training job needs at least 1 step, got " + std::to_string(jopts.steps));
  if (jopts.commit_every < 0) throw Error("commit_every must be >= 0, got " + std::to_string(jopts.commit_every));
  auto trainer = std::make_unique<Trainer>(engine, std::move(samples), topts, start);
  std::shared_ptr<TrainJob> job(new TrainJob(engine, std::move(trainer), std::move(jopts)));
  job->batch_ = topts.batch;
  return job;
}

TrainJob::TrainJob(Engine& engine, std::unique_ptr<Trainer> trainer, TrainJobOptions opts)
    : engine_(engine), trainer_(std::move(trainer)), opts_(std::move(opts)) {
  st_.adapter = opts_.adapter;
  st_.steps = opts_.steps;
  st_.step = trainer_->step();
  st_.created_s = now_seconds();
  st_.peak_bytes = trainer_->peak_bytes();
}

TrainJob::~TrainJob() = default;

Task TrainJob::task(const Scheduler* sched) {
  sched_ = sched;
  Task t;
  TaskDescriptor& d = t.desc;
  d.cls = TaskClass::kBackground;
  d.kind = "train";
  d.priority = opts_.priority;
  d.utility = opts_.utility;
  d.adapter = opts_.adapter;
  // The trainer's estimates (known once it has run phases: a job that
  // continues a trainer, or none for a new one, when the scheduler's
  // averages of the kind "train" stand in).
  const PhaseEstimate next = trainer_->next_phase();
  d.est_memory = next.bytes;
  double longest = 0, per_step = 0;
  for (const PhaseKind k : {PhaseKind::kForward, PhaseKind::kBackward, PhaseKind::kCommit}) {
    const double s = st_.phase_est_s[static_cast<int>(k)];
    longest = std::max(longest, s);
    per_step += (k == PhaseKind::kCommit ? 1.0 : static_cast<double>(batch_)) * s;
  }
  d.next_yield_s = longest;
  d.est_duration_s = per_step * static_cast<double>(opts_.steps - trainer_->step());
  auto self = shared_from_this();
  t.step = [self] { return self->step(); };
  t.on_done = [self](TaskOutcome o, const std::string& err) { self->finish(o, err); };
  return t;
}

TaskId TrainJob::submit(Scheduler& sched) {
  try {
    const TaskId id = sched.submit_background(task(&sched));
    std::lock_guard lock(mu_);
    submitted_to_ = &sched;
    task_id_ = id;
    return id;
  } catch (const std::exception& e) {
    finish(TaskOutcome::kFailed, e.what());
    throw;
  }
}

TaskId TrainJob::task_id() const {
  std::lock_guard lock(mu_);
  return task_id_;
}

uint64_t TrainJob::sched_units() const {
  if (!sched_) return 0;
  const SchedulerMetrics m = sched_->metrics();
  return static_cast<uint64_t>(m.rounds + m.bg_steps);
}

bool TrainJob::step() {
  {
    std::lock_guard lock(mu_);
    if (cancel_requested_ || !trainer_) return false;
    if (st_.state == TrainJobState::kQueued) {
      st_.state = TrainJobState::kRunning;
      st_.started_s = now_seconds();
    }
  }
  // Other work ran since our last step when the scheduler counted more
  // units than that step (it counts ours after step() returns).
  const uint64_t units = sched_units();
  const bool yielded = sched_ && units_seen_ > 0 && units > units_seen_ + 1;
  units_seen_ = units;
  const bool mid_step = !trainer_->at_step_boundary();
  const Stopwatch sw;
  if (save_pending_) {
    save();
    std::lock_guard lock(mu_);
    st_.save_s += sw.seconds();
    st_.run_s += sw.seconds();
    if (yielded) ++st_.yields;
    return trainer_->step() < opts_.steps;
  }
  if (trainer_->step() >= opts_.steps) return false;
  const PhaseResult r = trainer_->run_phase();
  const int k = static_cast<int>(r.kind);
  std::lock_guard lock(mu_);
  if (yielded) {
    ++st_.yields;
    if (mid_step) ++st_.interruptions;
  }
  ++st_.phases;
  st_.run_s += sw.seconds();
  st_.phase_s[k] += r.seconds;
  st_.phase_max_s[k] = std::max(st_.phase_max_s[k], r.seconds);
  st_.phase_est_s[k] = st_.phase_est_s[k] == 0 ? r.seconds : kLossAlpha * r.seconds + (1 - kLossAlpha) * st_.phase_est_s[k];
  st_.tokens += r.tokens;
  st_.peak_bytes = trainer_->peak_bytes();
  if (r.step_done) {
    st_.step = trainer_->step();
    st_.loss = r.loss;
    st_.loss_ema = st_.step == 1 || st_.loss_ema == 0 ? r.loss : kLossAlpha * r.loss + (1 - kLossAlpha) * st_.loss_ema;
    if (st_.step == 1) st_.first_loss = r.loss;
    const bool interval = opts_.commit_every > 0 && st_.step % opts_.commit_every == 0;
    if (interval || st_.step >= opts_.steps) save_pending_ = true;
  }
  return true;
}

void TrainJob::save() {
  // Staging copies the parameters into the registry; the previous version
  // this job staged goes unless it is the published one (a long job would
  // otherwise keep every version it made).
  const AdapterInfo info = trainer_->stage(opts_.adapter, opts_.publish_auto);
  uint64_t previous = 0;
  {
    std::lock_guard lock(mu_);
    previous = st_.version_staged;
    st_.version_staged = info.version;
    ++st_.commits;
    if (info.published) {
      if (st_.version_published != info.version) ++st_.publishes;
      st_.version_published = info.version;
    }
  }
  uint64_t dropped = 0;
  if (previous != 0 && previous != info.version) {
    bool published = false;
    for (const AdapterInfo& a : engine_.adapters().list())
      if (a.name == opts_.adapter && a.version == previous) published = a.published;
    if (!published) {
      try {
        engine_.adapters().unload(opts_.adapter, previous);
        dropped = previous;
      } catch (const Error&) {
        // Unloaded meanwhile by someone else: nothing to drop.
      }
    }
  }
  if (opts_.on_commit) opts_.on_commit(info, dropped);
  save_pending_ = false;
  if (opts_.out_dir.empty()) return;
  // NAME.gguf through a temporary file, so a reader never sees half of it;
  // NAME.ckpt/ is the trainer's checkpoint directory (it writes its state
  // file the same way).
  const std::string gguf = opts_.out_dir + "/" + opts_.adapter + ".gguf", tmp = gguf + ".tmp";
  try {
    write_lora_gguf(trainer_->params(), tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), gguf.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(gguf + ": cannot rename into place: " + why);
  }
  const std::string ckpt = opts_.out_dir + "/" + opts_.adapter + ".ckpt";
  trainer_->save_checkpoint(ckpt);
  std::lock_guard lock(mu_);
  st_.files = {opts_.adapter + ".gguf", opts_.adapter + ".ckpt/adapter.gguf", opts_.adapter + ".ckpt/trainer.ebbt"};
}

void TrainJob::finish(TaskOutcome outcome, const std::string& error) {
  std::string err = error;
  if (trainer_) {
    // The partial step is dropped; a commit whose version was not staged
    // yet (cancelled between the two) is staged now, since it is a whole step.
    if (outcome != TaskOutcome::kFailed && save_pending_) {
      try {
        save();
      } catch (const std::exception& e) {
        outcome = TaskOutcome::kFailed;
        err = e.what();
      }
    }
    if (!trainer_->at_step_boundary()) trainer_->discard_step();
    trainer_->release_buffers();
  }
  {
    std::lock_guard lock(mu_);
    if (trainer_) st_.peak_bytes = trainer_->peak_bytes();
    if (!is_final(st_.state)) {
      if (outcome == TaskOutcome::kFailed) {
        st_.state = TrainJobState::kFailed;
        st_.error = err.empty() ? "the training task failed" : err;
      } else if (outcome == TaskOutcome::kCancelled || cancel_requested_ || st_.step < st_.steps) {
        st_.state = TrainJobState::kCancelled;
      } else {
        st_.state = st_.version_published == st_.version_staged ? TrainJobState::kDone : TrainJobState::kCommitted;
      }
      st_.finished_s = now_seconds();
    }
  }
  trainer_.reset();  // its parameters, gradients and moments go back to the ledger
  cv_.notify_all();
}

void TrainJob::cancel() {
  Scheduler* s = nullptr;
  TaskId id = 0;
  {
    std::lock_guard lock(mu_);
    if (is_final(st_.state)) return;
    cancel_requested_ = true;
    s = submitted_to_;
    id = task_id_;
  }
  if (s) s->cancel(id);
}

uint64_t TrainJob::publish(uint64_t version) {
  std::lock_guard lock(mu_);
  const uint64_t v = version == 0 ? st_.version_staged : version;
  if (v == 0) throw Error("training job for '" + opts_.adapter + "' has not staged a version yet");
  engine_.adapters().publish(opts_.adapter, v);
  if (st_.version_published != v) ++st_.publishes;
  st_.version_published = v;
  if (st_.state == TrainJobState::kCommitted && v == st_.version_staged) st_.state = TrainJobState::kDone;
  return v;
}

TrainJobStatus TrainJob::status() const {
  std::lock_guard lock(mu_);
  return st_;
}

bool TrainJob::finished() const {
  std::lock_guard lock(mu_);
  return is_final(st_.state);
}

bool TrainJob::wait(double timeout_s) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return is_final(st_.state); });
}

}  // namespace ebb
