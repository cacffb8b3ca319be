// ebb bench agents (LOCAL Figures 11 and 12, on the CPU): the multi-agent
// workload of bench/agents_workload.h — planner, tool agent and critic on
// multi-step retail tasks with tool calls, synthetic tool results, handoffs
// carrying long shared contexts, judge calls, training, commits and
// publishes — replayed under several systems on a fresh engine each (the
// same foreground sequence for all, each for exactly --duration seconds of
// wall time), then, with --kv-budget, ebb under a sweep of KV budgets,
// hot-prefix counts and prefill chunk sizes.
//
// Per system: TTFT (client side, submission to the first sampled token)
// mean/p50/p95/p99, foreground queue wait (the scheduler's) p50/p95/p99,
// training commits and publishes, pre-prefill tasks and their time, the
// share of prompt tokens taken from the prefix cache, the wait attributed
// to each kind of work that ran meanwhile, and the process's peak RSS.
// Ratios against the baselines measured in the same run.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "bench/agents_workload.h"
#include "cli/options.h"
#include "platform/error.h"

namespace ebb::cli {
namespace {

using nlohmann::json;

struct AgentsBenchArgs {
  ModelArgs model;
  AgentsWorkload w;
  std::vector<std::string> systems = {"ebb", "no-preprefill", "no-stale-prefill", "sleep-train-wake", "fifo",
                                      "round-robin"};
  std::vector<double> kv_budget_mib;  // the sweep (empty: none)
  std::vector<int> sweep_hot;         // hot-prefix counts of the sweep (empty: --hot-prefixes)
  std::vector<int64_t> sweep_chunk;   // chunk sizes of the sweep (empty: --chunk-tokens)
  bool sweep_only = false;
  bool json = false;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double cached_share(const AgentsRun& r) {
  return r.prompt_tokens > 0 ? static_cast<double>(r.cached_tokens) / static_cast<double>(r.prompt_tokens) : 0;
}

double per_min(int64_t n, const AgentsRun& r) { return r.wall_s > 0 ? 60.0 * static_cast<double>(n) / r.wall_s : 0; }

json result_json(const AgentsRun& r) {
  json attr = json::object();
  for (const auto& [k, s] : r.wait_behind_s) attr[k] = s;
  json by_agent = json::object();
  for (const auto& [a, v] : r.ttft_by_agent) by_agent[a] = {{"mean", mean(v)}, {"p95", pct(v, 0.95)}, {"n", v.size()}};
  return {{"system", r.system},
          {"kv_budget_bytes", r.kv_budget},
          {"hot_prefixes", r.hot_prefixes},
          {"chunk_tokens", r.chunk_tokens},
          {"wall_s", r.wall_s},
          {"run_s", r.run_s},
          {"turns", r.turns},
          {"cut_turns", r.cut_turns},
          {"tasks_started", r.tasks_started},
          {"tasks_completed", r.tasks_completed},
          {"commits_per_min", per_min(r.commits, r)},
          {"train_steps_per_min", per_min(r.train_steps, r)},
          {"ttft_mean_s", mean(r.ttft_s)},
          {"ttft_p50_s", pct(r.ttft_s, 0.5)},
          {"ttft_p95_s", pct(r.ttft_s, 0.95)},
          {"ttft_p99_s", pct(r.ttft_s, 0.99)},
          {"ttft_by_agent", by_agent},
          {"wait_p50_s", r.wait_p50},
          {"wait_p95_s", r.wait_p95},
          {"wait_p99_s", r.wait_p99},
          {"wait_max_s", r.wait_max},
          {"commits", r.commits},
          {"publishes", r.publishes},
          {"publish_failures", r.publish_failures},
          {"train_steps", r.train_steps},
          {"train_phases", r.train_phases},
          {"train_run_s", r.train_run_s},
          {"judge_calls", r.judge_calls},
          {"train_windows", r.windows},
          {"train_window_s", r.window_s},
          {"train_window_sleep_s", r.sleep_s},
          {"train_window_wake_s", r.wake_s},
          {"stale_prefill_tasks", r.stale_tasks},
          {"stale_prefill_completed", r.stale_completed},
          {"stale_prefill_tokens", r.stale_tokens},
          {"preprefill_tasks", r.preprefill_tasks},
          {"preprefill_completed", r.preprefill_completed},
          {"preprefill_tokens", r.preprefill_tokens},
          {"preprefill_s", r.preprefill_s},
          {"preprefill_stale", r.preprefill_stale},
          {"preprefill_shrunk_steps", r.preprefill_shrunk_steps},
          {"preprefill_timed_steps", r.preprefill_timed_steps},
          {"preprefill_staged", r.preprefill_staged},
          {"preprefill_staged_kept", r.preprefill_staged_kept},
          {"preprefill_min_chunk_tokens", r.preprefill_min_chunk},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_tokens", r.cached_tokens},
          {"cached_share", cached_share(r)},
          {"offload_requests", r.offload_requests},
          {"offload_short", r.offload_short},
          {"offload_freed_bytes", r.offload_freed},
          {"background_pending_memory", r.bg_pending_memory},
          {"attribution", attr},
          {"sched_fg_busy_s", r.fg_busy_s},
          {"sched_bg_busy_s", [&] {
             json b = json::object();
             for (const auto& [k, v] : r.bg_busy_s) b[k] = v;
             return b;
           }()},
          {"sched_idle_s", r.idle_s},
          {"sched_idle_bg_waiting_s", r.idle_bg_waiting_s},
          {"bg_deferred_window", r.bg_deferred_window},
          {"bg_over_window", r.bg_over_window},
          {"bg_aged", r.bg_aged},
          {"bg_share", r.bg_share},
          {"bg_share_over_foreground", r.bg_share_fg},
          {"peak_rss_bytes", r.peak_rss_bytes}};
}

void print_row(const AgentsRun& r) {
  std::printf("%-17s %5lld | %6.3f %6.3f %6.3f | %6.3f %6.3f | %4lld %6.2f %4lld | %4lld %6.2f | %5.1f%% | %7.1f\n",
              r.system.c_str(), static_cast<long long>(r.turns), mean(r.ttft_s), pct(r.ttft_s, 0.95),
              pct(r.ttft_s, 0.99), r.wait_p95, r.wait_p99, static_cast<long long>(r.commits), per_min(r.commits, r),
              static_cast<long long>(r.publishes), static_cast<long long>(r.preprefill_tasks), r.preprefill_s,
              100 * cached_share(r), static_cast<double>(r.peak_rss_bytes) / (1 << 20));
}

int run_agents_bench(AgentsBenchArgs& a) {
  for (const std::string& s : a.systems)
    if (!agents_system_known(s))
      throw UsageError("bench agents: unknown system '" + s +
                       "' (ebb, no-preprefill, no-stale-prefill, sleep-train-wake, fifo, round-robin)");
  for (double b : a.kv_budget_mib)
    if (!(b > 0)) throw UsageError("bench agents: --kv-budget values must be > 0 MiB");
  if (a.sweep_only && a.kv_budget_mib.empty()) throw UsageError("bench agents: --sweep-only needs --kv-budget");
  validate(a.w);
  for (int h : a.sweep_hot)
    if (h < 0) throw UsageError("bench agents: --sweep-hot values must be >= 0");
  for (int64_t c : a.sweep_chunk)
    if (c < 1) throw UsageError("bench agents: --sweep-chunk values must be >= 1");
  a.model.prefix_cache = true;
  a.w.model_path = a.model.model;

  std::vector<AgentsRun> runs, sweep;
  if (!a.sweep_only) {
    for (const std::string& system : a.systems) {
      std::fprintf(stderr, "bench agents: %s\n", system.c_str());
      std::unique_ptr<Engine> engine = make_engine(a.model);
      runs.push_back(run_agents_workload(*engine, a.w, system));
    }
  }
  const std::vector<int> hots = a.sweep_hot.empty() ? std::vector<int>{a.w.hot_prefixes} : a.sweep_hot;
  const std::vector<int64_t> chunks =
      a.sweep_chunk.empty() ? std::vector<int64_t>{a.w.chunk_tokens} : a.sweep_chunk;
  for (double mib : a.kv_budget_mib) {
    for (int hot : hots) {
      for (int64_t chunk : chunks) {
        AgentsWorkload w = a.w;
        w.kv_budget = static_cast<uint64_t>(mib * (1 << 20));
        w.hot_prefixes = hot;
        w.chunk_tokens = chunk;
        std::fprintf(stderr, "bench agents: ebb at %.0f MiB, %d hot prefixes, %lld-token chunks\n", mib, hot,
                     static_cast<long long>(chunk));
        std::unique_ptr<Engine> engine = make_engine(a.model);
        sweep.push_back(run_agents_workload(*engine, w, "ebb"));
      }
    }
  }

  const auto find = [&](const std::string& s) -> const AgentsRun* {
    for (const AgentsRun& r : runs)
      if (r.system == s) return &r;
    return nullptr;
  };
  const AgentsRun* ebb = find("ebb");
  const AgentsRun* nopp = find("no-preprefill");
  const AgentsRun* stw = find("sleep-train-wake");
  json ratios = json::object();
  if (ebb && nopp) {
    const double p99 = pct(nopp->ttft_s, 0.99), m = mean(nopp->ttft_s);
    ratios["preprefill_ttft_p99_reduction"] = p99 > 0 ? 1 - pct(ebb->ttft_s, 0.99) / p99 : 0.0;
    ratios["preprefill_ttft_mean_reduction"] = m > 0 ? 1 - mean(ebb->ttft_s) / m : 0.0;
  }
  if (ebb && stw) {
    ratios["stw_over_ebb_wait_p95"] = ebb->wait_p95 > 0 ? stw->wait_p95 / ebb->wait_p95 : 0.0;
    ratios["ebb_minus_stw_commits"] = ebb->commits - stw->commits;
  }
  bool sweep_ok = true;
  for (const AgentsRun& r : sweep) sweep_ok = sweep_ok && r.commits > 0 && r.publish_failures == 0;
  if (!sweep.empty()) ratios["sweep_all_commit_no_failed_publish"] = sweep_ok;
  const json targets = {{"preprefill_ttft_p99_reduction", ">= 0.20 (LOCAL 0.219)"},
                        {"preprefill_ttft_mean_reduction", ">= 0.30 (LOCAL 0.380)"},
                        {"stw_over_ebb_wait_p95", ">= 5 (LOCAL 5.9)"},
                        {"ebb_minus_stw_commits", ">= 0"},
                        {"sweep_all_commit_no_failed_publish", "true"}};

  if (a.json) {
    json j;
    j["model"] = a.model.model;
    j["threads"] = a.model.threads;
    j["workload"] = workload_json(a.w);
    j["systems"] = json::array();
    for (const AgentsRun& r : runs) j["systems"].push_back(result_json(r));
    j["sweep"] = json::array();
    for (const AgentsRun& r : sweep) j["sweep"].push_back(result_json(r));
    j["ratios"] = ratios;
    j["targets"] = targets;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("ebb bench agents: %s; %s\n", a.model.model.c_str(), workload_json(a.w).dump().c_str());
  const char* header = "%-17s %5s | %20s | %13s | %16s | %11s | %6s | %7s\n";
  if (!runs.empty()) {
    std::printf("every system ran for %.0f s of wall time; everything counted as it stood then (turns, TTFT, waits, "
                "commits and publishes completed by T); turns in flight at T were cancelled and left out, training "
                "stopped at its next step boundary\n",
                a.w.learn.duration_s);
    std::printf(header, "system", "turns", "TTFT mean/p95/p99 s", "wait p95/99 s", "commits", "preprefill",
                "cached", "peak MiB");
    std::printf(header, "", "", "", "", "/ per min / pubs", "tasks / s", "", "RSS");
    for (const AgentsRun& r : runs) print_row(r);
    std::printf("foreground wait attributed to what ran meanwhile (share of the wait):\n");
    for (const AgentsRun& r : runs) {
      double total = 0;
      for (const auto& [k, s] : r.wait_behind_s) total += s;
      std::printf("  %-17s", r.system.c_str());
      for (const auto& [k, s] : r.wait_behind_s)
        std::printf(" %s %.1f%%", k.c_str(), total > 0 ? 100 * s / total : 0.0);
      std::printf("\n");
    }
    std::printf("scheduler time (s) over T: foreground, background by kind, idle (of which with background "
                "waiting); steps run ahead of the foreground for a guaranteed share; turns cut at T:\n");
    for (const AgentsRun& r : runs) {
      std::printf("  %-17s fg %.1f", r.system.c_str(), r.fg_busy_s);
      for (const auto& [k, s] : r.bg_busy_s) std::printf(" %s %.1f", k.c_str(), s);
      std::printf(" idle %.1f (%.1f); share steps over fg %lld; optimizer steps %lld; windows %lld (%.1f s); cut %lld\n",
                  r.idle_s, r.idle_bg_waiting_s, static_cast<long long>(r.bg_share_fg),
                  static_cast<long long>(r.train_steps), static_cast<long long>(r.windows), r.window_s,
                  static_cast<long long>(r.cut_turns));
    }
  }
  if (!sweep.empty()) {
    std::printf("KV-budget sweep (ebb; Figure 12):\n%9s %4s %6s | %8s %8s | %7s %4s %5s | %9s %8s | %8s %9s\n", "budget MiB",
                "hot", "chunk", "wait p95", "TTFT p95", "commits", "pubs", "fails", "stale tok", "pp min",
                "offloads", "peak MiB");
    for (const AgentsRun& r : sweep)
      std::printf("%10.0f %4d %6lld | %8.3f %8.3f | %7lld %4lld %5lld | %9lld %8lld | %8lld %9.1f\n",
                  static_cast<double>(r.kv_budget) / (1 << 20), r.hot_prefixes, static_cast<long long>(r.chunk_tokens),
                  r.wait_p95, pct(r.ttft_s, 0.95), static_cast<long long>(r.commits),
                  static_cast<long long>(r.publishes), static_cast<long long>(r.publish_failures),
                  static_cast<long long>(r.stale_tokens), static_cast<long long>(r.preprefill_min_chunk),
                  static_cast<long long>(r.offload_requests), static_cast<double>(r.peak_rss_bytes) / (1 << 20));
  }
  std::printf("ratios: %s\ntargets: %s\n", ratios.dump().c_str(), targets.dump().c_str());
  return 0;
}

}  // namespace

void add_bench_agents_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<AgentsBenchArgs>();
  CLI::App* sub = bench->add_subcommand(
      "agents", "Multi-agent workload: handoffs with cross-agent pre-prefill, judge calls, training, publishes");
  // Agents' prompts part ways at any token: finer KV chunks than the
  // engine's default let more of a shared prefix be reused.
  a->model.kv_chunk = 64;
  add_model_options(sub, a->model);
  AgentsWorkload& w = a->w;
  SchedWorkload& l = w.learn;
  sub->add_option("--systems", a->systems, "Systems to run, in order")->delimiter(',')->capture_default_str();
  sub->add_option("--kv-budget", a->kv_budget_mib,
                  "Sweep: KV budgets in MiB (KV, compressed KV and training state above the weights), ebb at each")
      ->delimiter(',');
  sub->add_option("--sweep-hot", a->sweep_hot, "Sweep: hot-prefix counts (default: --hot-prefixes)")->delimiter(',');
  sub->add_option("--sweep-chunk", a->sweep_chunk, "Sweep: prefill chunk sizes (default: --chunk-tokens)")
      ->delimiter(',');
  sub->add_flag("--sweep-only", a->sweep_only, "Run only the --kv-budget sweep");
  l.duration_s = 60;
  sub->add_option("--tasks", w.tasks, "Customer tasks at most (0: tasks closed-loop until --duration)")
      ->capture_default_str();
  sub->add_option("--concurrency", w.concurrency, "Tasks in flight")->capture_default_str();
  sub->add_option("--steps", w.steps, "Planner -> tool -> critic steps per task")->capture_default_str();
  sub->add_option("--system-tokens", w.system_tokens, "Tokens of each agent's system prompt")->capture_default_str();
  sub->add_option("--user-tokens", w.user_tokens, "Tokens of each task's request")->capture_default_str();
  sub->add_option("--context-tokens", w.context_tokens, "Tokens of each task's retail records")->capture_default_str();
  sub->add_option("--tool-result-tokens", w.tool_result_tokens, "Tokens of each tool result")->capture_default_str();
  sub->add_option("--gen", w.gen, "Tokens of each answer")->capture_default_str();
  sub->add_option("--handoff-delay", w.handoff_delay_s, "Seconds between a handoff and the target's request")
      ->capture_default_str();
  sub->add_option("--window-gap", w.window_gap_s,
                  "sleep-train-wake: seconds of serving between training windows (the mean, with --window-gaps random)")
      ->capture_default_str();
  sub->add_option_function<std::string>(
         "--window-gaps",
         [&w](const std::string& v) {
           if (v != "random" && v != "fixed")
             throw CLI::ValidationError("--window-gaps", "'" + v + "' is not one of random, fixed");
           w.window_random_gaps = v == "random";
         },
         "sleep-train-wake: random (seeded exponential gaps of mean --window-gap, independent of the tasks' rhythm) "
         "or fixed gaps [default: random]");
  sub->add_option("--window-steps", w.window_steps, "sleep-train-wake: optimizer steps per training window")
      ->capture_default_str();
  sub->add_option("--window-reload", w.window_reload,
                  "sleep-train-wake: drop the prefix cache at sleep and read the model back at wake (false: neither)")
      ->capture_default_str();
  sub->add_option("--hot-prefixes", w.hot_prefixes, "Stale-coverage prefill: hot prefixes per staged version")
      ->capture_default_str();
  sub->add_option("--chunk-tokens", w.chunk_tokens, "Pre-prefill and stale prefill tokens per scheduler step at most")
      ->capture_default_str();
  sub->add_option("--step-seconds", w.step_seconds,
                  "Pre-prefill and stale prefill steps end before a micro-batch that would take them past this many "
                  "seconds (ebb serve's --background-step; 0: --chunk-tokens alone)")
      ->capture_default_str();
  l.phase_s = 0.05;  // ebb serve's --background-step
  add_learning_options(sub, l);
  sub->add_option("--duration", l.duration_s,
                  "Seconds of wall time each system runs (T): no turn starts after it, and everything is counted as "
                  "it stands at T")
      ->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_agents_bench(*a); });
}

}  // namespace ebb::cli
