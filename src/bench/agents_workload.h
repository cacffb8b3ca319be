// The multi-agent workload of ebb bench agents (bench_agents.cpp): a
// tau-bench-retail-shaped replay of customer tasks, each worked by three
// agents over several steps, on one engine's scheduler, with the learning
// loop of bench sched (training, commits, publishes, judge calls,
// stale-coverage prefill: bench/learning_loop.h) running beside it.
//
//   a task     a user request (user_tokens) and the retail context it
//              brings (order and catalog records: context_tokens), then
//              `steps` steps of
//                planner   its system prompt + the task history + a step
//                          instruction -> a plan (gen tokens)
//                          hands off to the tool agent and the critic
//                tool      its system prompt + history -> a tool call
//                          (gen tokens), then a synthetic tool result
//                          (tool_result_tokens) joins the history;
//                          hands off to the critic
//                critic    its system prompt + history -> a verdict
//                          (gen tokens); a judge call scores the step;
//                          hands off to the planner of the next step
//              with handoff_delay_s between a handoff and the target's
//              request (tool dispatch, the agents' own latency).
//   agents     each its own context namespace and system prompt; the tool
//              agent binds the trained adapter once it has a published
//              version (following publishes), the others the base model.
//   replay     the answers that join the history are the script's (seeded
//              tokens of the answers' length), so every system sees the
//              same foreground sequence whatever its adapter versions
//              generate.
//   time       every system runs for exactly learn.duration_s (T) of wall
//              time: `concurrency` workers replay tasks closed-loop (task
//              i's script seeded by i; a worker starts the next task when
//              its last ends) until T, or until `tasks` tasks when tasks >
//              0. At T no new turn starts, and everything is counted as it
//              stands at T: turns completed by T, commits and publishes
//              completed by T, the scheduler's metrics at T. Work in flight
//              at T is not counted: a turn not finished is cancelled (its
//              TTFT left out: AgentsRun::cut_turns counts them), a training
//              step or window ends at its next step boundary, waiting judge
//              calls and pre-prefill are cancelled at shutdown.
//
// Systems: ebb (foreground-first, cross-agent pre-prefill, stale-coverage
// prefill, phase-sized training), no-preprefill, no-stale-prefill,
// sleep-train-wake (no pre-prefill or warm-up; training in whole windows
// that stop serving: TrainGranularity::kWindows), fifo and round-robin
// (ebb's mechanisms under those policies).
//
// Memory (kv_budget > 0, Figure 12): the scheduler sees a device of
// kv_budget bytes for KV (sessions' and cached), compressed KV and
// training state above the weights; training and cache maintenance are
// admitted after offloading cached KV (runtime/offload_admission.h), and
// pre-prefill chunks shrink under pressure.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/sched_workload.h"
#include "runtime/engine.h"

namespace ebb::cli {

struct AgentsWorkload {
  int tasks = 0;                 // tasks at most (0: closed loop until the run's end)
  int concurrency = 2;           // tasks in flight
  int steps = 3;                 // planner -> tool -> critic steps per task
  int64_t system_tokens = 48;    // each agent's system prompt
  int64_t user_tokens = 32;
  int64_t context_tokens = 320;  // the task's retail records
  int64_t tool_result_tokens = 64;
  int64_t instruction_tokens = 8;
  int64_t gen = 8;               // tokens of each answer
  double handoff_delay_s = 1.0;
  double window_gap_s = 2.0;     // sleep-train-wake: serving time between training windows
  int64_t window_steps = 5;      // sleep-train-wake: optimizer steps per window
  bool window_reload = true;     // sleep-train-wake: drop the prefix cache at sleep, read the model back at wake
  std::string model_path;        // the model file (sleep-train-wake's wake reads it)
  // Figure 12's knobs.
  uint64_t kv_budget = 0;        // bytes (0: the machine's free memory, no offload)
  int hot_prefixes = 8;          // stale-coverage prefill's prefixes per staged version
  int64_t chunk_tokens = 128;    // pre-prefill and stale prefill tokens per step
  double step_seconds = 0.05;    // and seconds per step (ebb serve's --background-step; 0: tokens alone)
  bool window_random_gaps = true;  // sleep-train-wake: exponential gaps of mean window_gap_s (SleepWakeOptions)
  SchedWorkload learn;           // training, judge, publishing, W_bg, duration and seed
};

// Throws UsageError for values that cannot run.
void validate(const AgentsWorkload& w);
nlohmann::json workload_json(const AgentsWorkload& w);
bool agents_system_known(const std::string& system);

struct AgentsRun {
  std::string system;
  uint64_t kv_budget = 0;
  int hot_prefixes = 0;
  int64_t chunk_tokens = 0;
  double wall_s = 0;   // T: the window everything is counted over
  double run_s = 0;    // T and the teardown after it (work in flight ending)
  int64_t turns = 0;   // completed by T
  int64_t tasks_started = 0, tasks_completed = 0;
  int64_t cut_turns = 0;  // in flight at T: cancelled, not counted
  std::vector<double> ttft_s;  // per turn, submission to the first sampled token
  std::map<std::string, std::vector<double>> ttft_by_agent;
  double wait_p50 = 0, wait_p95 = 0, wait_p99 = 0, wait_max = 0;
  int64_t commits = 0, publishes = 0, publish_failures = 0, train_steps = 0, judge_calls = 0;
  int64_t train_phases = 0;
  double train_run_s = 0;
  int64_t windows = 0;
  double window_s = 0;
  double sleep_s = 0, wake_s = 0;
  int64_t stale_tasks = 0, stale_completed = 0, stale_tokens = 0;
  int64_t preprefill_tasks = 0, preprefill_completed = 0, preprefill_tokens = 0, preprefill_stale = 0;
  int64_t preprefill_shrunk_steps = 0, preprefill_min_chunk = 0;
  int64_t preprefill_timed_steps = 0;  // steps --step-seconds ended before their chunk
  int64_t preprefill_staged = 0, preprefill_staged_kept = 0;  // under staged versions; kept at their publish
  double preprefill_s = 0;
  int64_t cached_tokens = 0, prompt_tokens = 0;  // foreground prompt tokens, and of them taken from the cache
  int64_t offload_requests = 0, offload_short = 0, bg_pending_memory = 0;
  uint64_t offload_freed = 0;
  uint64_t peak_rss_bytes = 0;  // the process's, over this run (VmHWM after a reset)
  std::map<std::string, double> wait_behind_s;
  // Where the scheduler's time went: foreground rounds, background steps by
  // kind, idle (and idle while background tasks were held back), and how
  // often the window rule held a task back, let one past it, or aging
  // picked one ahead of higher utility, or a guaranteed share did.
  double fg_busy_s = 0, idle_s = 0, idle_bg_waiting_s = 0;
  std::map<std::string, double> bg_busy_s;
  int64_t bg_deferred_window = 0, bg_over_window = 0, bg_aged = 0, bg_share = 0, bg_share_fg = 0;
};

// Runs the workload for exactly w.learn.duration_s on `engine` (fresh:
// nothing cached, no adapter) under `system`.
AgentsRun run_agents_workload(Engine& engine, const AgentsWorkload& w, const std::string& system);

}  // namespace ebb::cli
