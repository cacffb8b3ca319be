#include "bench/sched_workload.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "bench/learning_loop.h"
#include "cli/options.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"

namespace ebb::cli {

std::vector<TokenId> random_tokens(std::mt19937_64& rng, int64_t n, int64_t n_vocab) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint64_t>(n_vocab - 1));
  return t;
}

GenerateOptions greedy(int64_t n) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampling.temperature = 0;
  go.stop_at_eog = false;
  return go;
}

void validate(const SchedWorkload& w) {
  if (w.agents < 1 || w.turns < 1) throw UsageError("bench sched: --agents and --turns must be at least 1");
  if (w.think_s < 0 || w.publish_wait_s < 0) throw UsageError("bench sched: times must be >= 0");
  if (w.system_tokens < 1 || w.user_tokens < 1 || w.gen < 1 || w.judge_gen < 1)
    throw UsageError("bench sched: token counts must be at least 1");
  if (w.train_samples < 1 || w.train_tokens < 4 || w.rank < 1 || w.commit_every < 1)
    throw UsageError("bench sched: --train-samples, --rank and --commit-every >= 1, --train-tokens >= 4");
  if (w.window_s <= 0.05) throw UsageError("bench sched: --window must be over the margin of 0.05 s");
  if (w.duration_s < 0 || w.phase_s < 0) throw UsageError("bench sched: --duration and --phase-seconds must be >= 0");
}

nlohmann::json workload_json(const SchedWorkload& w) {
  return {{"agents", w.agents},           {"turns", w.turns},           {"think_s", w.think_s},
          {"system_tokens", w.system_tokens}, {"user_tokens", w.user_tokens}, {"gen", w.gen},
          {"judge_gen", w.judge_gen},     {"train_samples", w.train_samples}, {"train_tokens", w.train_tokens},
          {"rank", w.rank},               {"commit_every", w.commit_every}, {"phase_s", w.phase_s}, {"publish_wait_s", w.publish_wait_s},
          {"window_s", w.window_s},       {"duration_s", w.duration_s}, {"seed", w.seed}};
}

bool sched_system_known(const std::string& s) {
  return s == "foreground-first" || s == "round-robin" || s == "fifo" || s == "non-preemptible" ||
         s == "no-stale-prefill";
}

SchedRun run_sched_workload(Engine& engine, const SchedWorkload& w, const std::string& system) {
  SchedRun run;
  run.system = system;
  const bool preemptible = system != "non-preemptible";
  const bool stale = system != "no-stale-prefill";
  SchedulerOptions so;
  so.policy = system == "round-robin" ? SchedPolicy::kRoundRobin
              : system == "fifo"      ? SchedPolicy::kFifo
                                      : SchedPolicy::kForegroundFirst;
  so.background_window_s = w.window_s;
  so.max_batch = std::max(8, w.agents);
  so.max_background = 4096;
  Scheduler sched(&engine, so);
  const int64_t n_vocab = engine.config().n_vocab;

  // Training, publishing, stale-coverage prefill and judge calls.
  LearningLoop learn(engine, sched, w, preemptible ? TrainGranularity::kPhases : TrainGranularity::kSteps, stale);
  std::mutex mu;  // run's vectors
  const double t0 = now_seconds();
  std::vector<std::thread> agents;
  for (int ag = 0; ag < w.agents; ++ag) {
    agents.emplace_back([&, ag] {
      std::mt19937_64 rng(w.seed * 1000003 + static_cast<uint64_t>(ag));
      std::exponential_distribution<double> think(w.think_s > 0 ? 1.0 / w.think_s : 1.0);
      std::vector<TokenId> conv = random_tokens(rng, w.system_tokens, n_vocab);
      SessionOptions sopts;
      sopts.n_ctx = w.system_tokens + w.turns * (w.user_tokens + w.gen + 1) + w.judge_gen + 64;
      int64_t seen_publishes = 0;
      for (int t = 0; t < w.turns; ++t) {
        const double pause = w.think_s > 0 ? think(rng) : 0;
        const std::vector<TokenId> user = random_tokens(rng, w.user_tokens, n_vocab);
        std::this_thread::sleep_for(std::chrono::duration<double>(pause));
        GenerationRequest req;
        req.prompt = conv;
        req.prompt.insert(req.prompt.end(), user.begin(), user.end());
        req.options = greedy(w.gen);
        req.session = sopts;
        if (learn.published()) req.adapters.push_back({kLearnedAdapter, 1.0f, 0});
        const int64_t pubs = learn.publishes();
        const bool first_after_publish = pubs > seen_publishes && !req.adapters.empty();
        seen_publishes = pubs;
        const double t_submit = now_seconds();
        std::shared_ptr<GenerationStream> s = sched.submit_generation(req);
        GenerateStats stats;
        for (;;) {
          std::optional<GenerationEvent> e = s->next(60.0);
          if (!e) throw Error("bench sched: no answer within 60 s");
          if (e->kind == GenerationEvent::Kind::kText) continue;
          if (e->kind == GenerationEvent::Kind::kError) throw Error("bench sched: a turn failed: " + e->error);
          stats = e->stats;
          break;
        }
        // To the first sampled token: the synthetic model's random tokens
        // often end inside a UTF-8 character, and their text would come a
        // few decode steps later, adding steps that are not a wait.
        const double ttft = (s->first_token_at() > 0 ? s->first_token_at() : now_seconds()) - t_submit;
        conv = req.prompt;
        conv.insert(conv.end(), stats.tokens.begin(), stats.tokens.end());
        {
          std::lock_guard lock(mu);
          run.ttft_s.push_back(ttft);
          if (first_after_publish) run.post_publish_prefill_s.push_back(stats.prefill_seconds);
          ++run.turns;
        }
        std::vector<TokenId> judge = conv;
        const std::vector<TokenId> ask = random_tokens(rng, 8, n_vocab);
        judge.insert(judge.end(), ask.begin(), ask.end());
        learn.judge(std::move(judge), sopts);
      }
    });
  }
  for (auto& t : agents) t.join();
  run.wall_s = now_seconds() - t0;
  // Training and publishing go on to the run's fixed length, so every
  // system's training gets the same wall time.
  while (now_seconds() - t0 < w.duration_s) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  run.run_s = now_seconds() - t0;
  learn.stop();
  const SchedulerMetrics m = sched.metrics();
  sched.shutdown(0);
  run.wait_p50 = m.wait_p50_s;
  run.wait_p95 = m.wait_p95_s;
  run.wait_p99 = m.wait_p99_s;
  run.wait_max = m.wait_max_s;
  run.wait_behind_s = m.wait_behind_s;
  const LearningResult lr = learn.result();
  run.commits = lr.commits;
  run.train_steps = lr.train_steps;
  run.publishes = lr.publishes;
  run.judge_calls = lr.judge_calls;
  run.stale_tasks = lr.stale_tasks;
  run.stale_completed = lr.stale_completed;
  run.stale_tokens = lr.stale_tokens;
  run.stale_chunks = lr.stale_chunks;
  return run;
}

}  // namespace ebb::cli
