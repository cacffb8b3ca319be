// The mixed workload of ebb bench sched (bench_sched.cpp): agents' turns,
// judge calls, a training job and stale-coverage prefill on one engine's
// scheduler, under one system (policy and preemption) at a time.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generate.h"

namespace CLI {
class App;
}

namespace ebb::cli {

struct SchedWorkload {
  int agents = 4;
  int turns = 8;
  double think_s = 0.5;        // mean think time (exponential)
  int64_t system_tokens = 96;
  int64_t user_tokens = 24;
  int64_t gen = 16;
  int64_t judge_gen = 8;
  int64_t train_samples = 8;
  int64_t train_tokens = 64;
  int64_t rank = 8;
  int64_t commit_every = 2;    // optimizer steps per staged version
  double phase_s = 0.15;       // trainer phases sized to about this (0: whole samples)
  double publish_wait_s = 1.0; // staged -> published
  double window_s = 1.0;       // W_bg
  // The run's length: after the agents' last turn, training and publishing
  // go on until then (0: the run ends with the agents), so commits compare
  // over the same wall time whichever system finished the turns sooner.
  double duration_s = 0;
  uint64_t seed = 1;
};

// Throws UsageError for values that cannot run.
void validate(const SchedWorkload& w);
// The learning loop's options (bench sched and bench agents): judge calls,
// training, commits, publishing, W_bg and the seed.
void add_learning_options(CLI::App* sub, SchedWorkload& w);
nlohmann::json workload_json(const SchedWorkload& w);
bool sched_system_known(const std::string& system);

struct SchedRun {
  std::string system;
  double wall_s = 0;  // the agents' turns, first to last
  double run_s = 0;   // the whole run (>= duration_s)
  int64_t turns = 0;
  double wait_p50 = 0, wait_p95 = 0, wait_p99 = 0, wait_max = 0;  // the scheduler's foreground waits
  std::vector<double> ttft_s;  // per turn: submission to the first sampled token
  std::vector<double> post_publish_prefill_s;  // each agent's first request after a publish: its prefill
  int64_t commits = 0, publishes = 0, train_steps = 0, judge_calls = 0, stale_tasks = 0;
  int64_t stale_completed = 0, stale_tokens = 0, stale_chunks = 0;  // the warm-up's tasks done, tokens run, chunks cached
  std::map<std::string, double> wait_behind_s;
};

// Runs the workload to its end on `engine` (fresh: nothing cached, no
// adapter) under `system`; the engine is owned by a scheduler meanwhile.
SchedRun run_sched_workload(Engine& engine, const SchedWorkload& w, const std::string& system);

// What the synthetic workloads (sched, agents, their learning loop) share:
// n random token ids in [1, n_vocab), and greedy decoding of n tokens that
// does not stop at end of generation.
std::vector<TokenId> random_tokens(std::mt19937_64& rng, int64_t n, int64_t n_vocab);
GenerateOptions greedy(int64_t n);

}  // namespace ebb::cli
