#include "bench/learning_loop.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "train/train_job.h"

namespace ebb::cli {

LearningLoop::LearningLoop(Engine& engine, Scheduler& sched, const SchedWorkload& w, TrainGranularity g,
                           bool stale_prefill, double window_gap_s, LearningCallbacks callbacks,
                           StalePrefillOptions stale_opts, SleepWakeOptions sleep_wake)
    : engine_(engine), sched_(sched), w_(w), g_(g), stale_(stale_prefill), warm_(engine, sched, stale_opts),
      sw_(std::move(sleep_wake)), cb_(std::move(callbacks)) {
  if (g == TrainGranularity::kWindows && sw_.steps < 1)
    throw Error("sleep/train/wake: a window must run at least 1 optimizer step");
  const int64_t n_vocab = engine.config().n_vocab;
  std::mt19937_64 data_rng(w.seed * 7919 + 3);
  std::vector<TrainSample> samples;
  for (int64_t i = 0; i < w.train_samples; ++i) {
    TrainSample s;
    s.tokens = random_tokens(data_rng, w.train_tokens, n_vocab);
    s.weights.assign(s.tokens.size(), 0.0f);
    for (size_t k = s.tokens.size() / 2; k < s.tokens.size(); ++k) s.weights[k] = 1.0f;
    samples.push_back(std::move(s));
  }
  TrainerOptions topts;
  topts.init.rank = w.rank;
  topts.init.alpha = static_cast<float>(2 * w.rank);
  topts.init.seed = w.seed;
  topts.adamw.lr = 1e-3f;
  topts.phase_target_s = w.phase_s;
  TrainJobOptions jopts;
  jopts.adapter = kLearnedAdapter;
  jopts.steps = 1000000;  // until stopped
  jopts.commit_every = w.commit_every;
  jopts.publish_auto = false;
  // Built on the scheduler thread (it owns the engine).
  job_ = sched.call([&](Engine& e) { return TrainJob::make(e, std::move(samples), topts, jopts); }).get();

  if (g == TrainGranularity::kWindows) {
    windows_thread_ = std::thread([this, window_gap_s] {
      std::mt19937_64 gap_rng(w_.seed * 104729 + 17);
      std::exponential_distribution<double> gap(window_gap_s > 0 ? 1.0 / window_gap_s : 1.0);
      while (!stopping_.load()) {
        // (Capped at 5 means: a gap that long is 0.7% likely.)
        const double g = sw_.random_gaps && window_gap_s > 0 ? std::min(gap(gap_rng), 5 * window_gap_s) : window_gap_s;
        const double until = now_seconds() + g;
        while (!stopping_.load() && now_seconds() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (stopping_.load()) break;
        // Serving stops at the next step boundary until the window's
        // commit_every optimizer steps are done.
        try {
          sched_.call([this](Engine& e) {
                  const double t0 = now_seconds();
                  sleep_server(e);
                  const double t1 = now_seconds();
                  const int64_t s0 = job_->status().step;
                  bool more = true;
                  // (stop() ends a window at its next trainer call.)
                  while (more && !stopping_.load() && job_->status().step < s0 + sw_.steps) more = job_->step();
                  // The window's commits are staged before serving resumes
                  // (the job stages a commit at its next call).
                  const int64_t want = job_->status().step / std::max<int64_t>(1, w_.commit_every);
                  while (more && !stopping_.load() && job_->status().commits < want) more = job_->step();
                  const double t2 = now_seconds();
                  wake_server();
                  const double t3 = now_seconds();
                  ++windows_;
                  sleep_s_.store(sleep_s_.load() + (t1 - t0));
                  wake_s_.store(wake_s_.load() + (t3 - t2));
                  window_s_.store(window_s_.load() + (t3 - t0));
                })
              .get();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench: training window: %s\n", e.what());
          break;
        }
      }
    });
  } else {
    // Training arrives as one task per optimizer step (LOCAL's bounded
    // background tasks: under FIFO a turn that arrives later waits for it),
    // the next submitted when one ends.
    sched.call([this](Engine&) { submit_train(); }).get();
  }

  publisher_ = std::thread([this] {
    uint64_t last = 0;
    while (!stopping_.load()) {
      const TrainJobStatus st = job_->status();
      if (st.version_staged > last) {
        last = st.version_staged;
        if (cb_.on_staged) cb_.on_staged(last);
        if (stale_) stale_tasks_ += static_cast<int64_t>(warm_.on_staged(kLearnedAdapter, last).get());
        const double until = now_seconds() + w_.publish_wait_s;
        while (!stopping_.load() && now_seconds() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (stopping_.load()) break;
        try {
          // The latest staged version: the job drops a staged version that a
          // newer one replaced before it was published.
          last = std::max(last, job_->publish(0));
          ++publishes_;
          if (cb_.on_publish) cb_.on_publish(last);
        } catch (const Error& e) {
          ++publish_failures_;
          std::fprintf(stderr, "bench: publish: %s\n", e.what());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
}

LearningLoop::~LearningLoop() { stop(); }

void LearningLoop::sleep_server(Engine& e) {
  if (!sw_.drop_cache) return;
  if (PrefixCache* pc = e.prefix_cache()) pc->clear();
  e.kv_pool().release_spare();
}

void LearningLoop::wake_server() {
  if (sw_.reload_path.empty()) return;
  // The weights back in: every byte of the model file read once, as a
  // waking server copies its weights back (from the page cache here, so a
  // lower bound of a reload from storage).
  const int fd = ::open(sw_.reload_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(sw_.reload_path + ": cannot open to reload: " + std::strerror(errno));
  std::vector<char> buf(8u << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  wake_bytes_ += total;
}

void LearningLoop::submit_train() {
  if (stopping_.load() || job_->finished()) return;
  Task t = job_->task(&sched_);  // its descriptor: the trainer's estimates
  const int64_t s0 = job_->status().step;
  std::shared_ptr<TrainJob> job = job_;
  if (g_ == TrainGranularity::kPhases) {
    t.step = [job, s0] { return job->step() && job->status().step == s0; };
  } else {
    t.step = [job, s0] {
      bool more = true;
      while (more && job->status().step == s0) more = job->step();
      return false;
    };
  }
  t.on_done = [this](TaskOutcome o, const std::string& error) {
    if (o == TaskOutcome::kCompleted) submit_train();
    if (o == TaskOutcome::kFailed) {
      ++train_failures_;
      std::fprintf(stderr, "bench: a training step failed: %s\n", error.c_str());
    }
  };
  try {
    sched_.submit_background(std::move(t));
  } catch (const SchedulerBusy&) {
  }
}

void LearningLoop::judge(std::vector<TokenId> prompt, SessionOptions so) {
  struct State {
    std::unique_ptr<Session> session;
    std::unique_ptr<Generation> gen;
  };
  auto st = std::make_shared<State>();
  Task t;
  t.desc.kind = "judge";
  Engine& engine = engine_;
  t.step = [&engine, st, prompt = std::move(prompt), gen = w_.judge_gen, so] {
    if (!st->gen) {
      st->session = std::make_unique<Session>(engine, so);
      st->gen = std::make_unique<Generation>(*st->session, prompt, greedy(gen), nullptr);
    }
    return st->gen->step();
  };
  t.on_done = [this](TaskOutcome o, const std::string&) {
    if (o == TaskOutcome::kCompleted) ++judges_;
  };
  try {
    sched_.submit_background(std::move(t));
  } catch (const SchedulerBusy&) {
  }
}

bool LearningLoop::published() const {
  for (const AdapterInfo& a : engine_.adapters().list())
    if (a.name == kLearnedAdapter && a.published) return true;
  return false;
}

void LearningLoop::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  if (windows_thread_.joinable()) windows_thread_.join();
  if (publisher_.joinable()) publisher_.join();
  job_->cancel();
}

LearningResult LearningLoop::result() const {
  LearningResult r;
  const TrainJobStatus st = job_->status();
  r.commits = st.commits;
  r.train_steps = st.step;
  r.train_phases = st.phases;
  r.train_run_s = st.run_s;
  r.publishes = publishes_.load();
  r.judge_calls = judges_.load();
  r.stale_tasks = stale_tasks_.load();
  const StalePrefillStats ws = warm_.stats();
  r.stale_completed = ws.tasks_completed;
  r.stale_tokens = ws.tokens_prefilled;
  r.stale_chunks = ws.chunks_inserted;
  r.publish_failures = publish_failures_.load();
  r.windows = windows_.load();
  r.window_s = window_s_.load();
  r.sleep_s = sleep_s_.load();
  r.wake_s = wake_s_.load();
  r.wake_bytes = wake_bytes_.load();
  return r;
}

}  // namespace ebb::cli
