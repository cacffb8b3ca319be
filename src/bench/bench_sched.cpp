// ebb bench sched (LOCAL Figure 8, on the CPU): one mixed workload, replayed
// under several scheduler configurations on a fresh engine each:
//
//   agents       A closed-loop agents, each a conversation (a system prompt,
//                then turns of user tokens and a greedy answer) with think
//                time between turns (exponential, seeded: the same trace for
//                every system). Foreground, bound to the adapter once it has
//                a published version.
//   judge        after every turn a background judge call: the turn's
//                conversation plus a short instruction, a few greedy tokens.
//   training     one LoRA training job on fixed samples (TrainJob: one
//                trainer phase per scheduler step), staging a version every
//                `commit_every` steps; a publisher publishes each staged
//                version after `publish_wait` seconds.
//   stale prefill when a version is staged, its hot prefixes are prefilled
//                under it in the background (runtime/stale_prefill.h), so
//                the first request after the publish finds its KV.
//
// Systems: foreground-first (the default), round-robin and fifo policies;
// non-preemptible (foreground-first, but each training unit is a whole
// optimizer step); no-stale-prefill (foreground-first without warm-up).
// Reported per system: foreground queue wait (submission to admission,
// the scheduler's measure) p50/p95/p99, TTFT (client side, submission to
// the first sampled token) p50/p95/p99, training commits and publishes, the
// prefill seconds of each agent's first request after a publish (p50/p99),
// and the wait attributed to each kind of work that ran meanwhile.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/sched_workload.h"
#include "cli/options.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/scheduler.h"
#include "runtime/stats.h"

namespace ebb::cli {
namespace {

using nlohmann::json;

struct SchedBenchArgs {
  ModelArgs model;
  SchedWorkload w;
  std::vector<std::string> systems = {"foreground-first", "round-robin", "fifo", "non-preemptible",
                                      "no-stale-prefill"};
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

json result_json(const SchedRun& r) {
  json attr = json::object();
  for (const auto& [k, s] : r.wait_behind_s) attr[k] = s;
  return {{"system", r.system},
          {"wall_s", r.wall_s},
          {"run_s", r.run_s},
          {"turns", r.turns},
          {"queue_wait_s", {{"p50", r.wait_p50}, {"p95", r.wait_p95}, {"p99", r.wait_p99}, {"max", r.wait_max}}},
          {"ttft_s", {{"p50", pct(r.ttft_s, 0.5)}, {"p95", pct(r.ttft_s, 0.95)}, {"p99", pct(r.ttft_s, 0.99)}}},
          {"post_publish_prefill_s",
           {{"n", r.post_publish_prefill_s.size()},
            {"p50", pct(r.post_publish_prefill_s, 0.5)},
            {"p99", pct(r.post_publish_prefill_s, 0.99)}}},
          {"train_commits", r.commits},
          {"publishes", r.publishes},
          {"train_steps", r.train_steps},
          {"judge_calls", r.judge_calls},
          {"stale_prefill_tasks", r.stale_tasks},
          {"stale_prefill_completed", r.stale_completed},
          {"stale_prefill_tokens", r.stale_tokens},
          {"stale_prefill_chunks", r.stale_chunks},
          {"wait_behind_s", attr}};
}

int run_sched_bench(SchedBenchArgs& a) {
  for (const std::string& s : a.systems)
    if (!sched_system_known(s))
      throw UsageError("bench sched: unknown system '" + s +
                       "' (foreground-first, round-robin, fifo, non-preemptible, no-stale-prefill)");
  validate(a.w);
  a.model.prefix_cache = true;
  std::vector<SchedRun> runs;
  for (const std::string& system : a.systems) {
    std::fprintf(stderr, "bench sched: %s\n", system.c_str());
    std::unique_ptr<Engine> engine = make_engine(a.model);
    runs.push_back(run_sched_workload(*engine, a.w, system));
  }
  const auto find = [&](const std::string& s) -> const SchedRun* {
    for (const SchedRun& r : runs)
      if (r.system == s) return &r;
    return nullptr;
  };
  const SchedRun* ff = find("foreground-first");
  const SchedRun* fifo = find("fifo");
  const SchedRun* rr = find("round-robin");
  const SchedRun* np = find("non-preemptible");
  const SchedRun* ns = find("no-stale-prefill");
  json ratios = json::object();
  const auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  if (ff && fifo) {
    ratios["fifo_over_ff_wait_p95"] = ratio(fifo->wait_p95, ff->wait_p95);
    ratios["fifo_over_ff_wait_p99"] = ratio(fifo->wait_p99, ff->wait_p99);
  }
  if (ff && np) ratios["nonpreempt_over_ff_ttft_p95"] = ratio(pct(np->ttft_s, 0.95), pct(ff->ttft_s, 0.95));
  if (ff && rr) ratios["ff_minus_rr_commits"] = ff->commits - rr->commits;
  // Only when both systems had a request after a publish (a run whose
  // publishes all came after the agents' last turns measures nothing).
  if (ff && ns && !ff->post_publish_prefill_s.empty() && !ns->post_publish_prefill_s.empty()) {
    const double with = pct(ff->post_publish_prefill_s, 0.99), without = pct(ns->post_publish_prefill_s, 0.99);
    ratios["stale_prefill_p99_reduction"] = without > 0 ? 1.0 - with / without : 0.0;
  }
  if (a.json) {
    json j;
    j["model"] = a.model.model;
    j["workload"] = workload_json(a.w);
    for (const SchedRun& r : runs) j["systems"].push_back(result_json(r));
    j["ratios"] = ratios;
    j["targets"] = {{"fifo_over_ff_wait_p95", ">= 3.1"},
                    {"fifo_over_ff_wait_p99", ">= 3.4"},
                    {"nonpreempt_over_ff_ttft_p95", ">= 1.55"},
                    {"ff_minus_rr_commits", ">= 0"},
                    {"stale_prefill_p99_reduction", ">= 0.25"}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("ebb bench sched: %s; %s\n", a.model.model.c_str(), workload_json(a.w).dump().c_str());
  std::printf("%-18s %7s %7s %6s | %23s | %23s | %7s %5s | %17s\n", "system", "turns s", "run s", "turns",
              "queue wait p50/95/99 s", "TTFT p50/95/99 s", "commits", "pubs", "1st after pub p99");
  for (const SchedRun& r : runs) {
    std::printf("%-18s %7.1f %7.1f %6lld | %7.3f %7.3f %7.3f | %7.3f %7.3f %7.3f | %7lld %5lld | %9.3f (n %zu)\n",
                r.system.c_str(), r.wall_s, r.run_s, static_cast<long long>(r.turns), r.wait_p50, r.wait_p95, r.wait_p99,
                pct(r.ttft_s, 0.5), pct(r.ttft_s, 0.95), pct(r.ttft_s, 0.99), static_cast<long long>(r.commits),
                static_cast<long long>(r.publishes), pct(r.post_publish_prefill_s, 0.99),
                r.post_publish_prefill_s.size());
  }
  std::printf("foreground wait attributed to what ran meanwhile (share of the wait):\n");
  for (const SchedRun& r : runs) {
    double total = 0;
    for (const auto& [k, s] : r.wait_behind_s) total += s;
    std::printf("  %-18s", r.system.c_str());
    for (const auto& [k, s] : r.wait_behind_s) std::printf(" %s %.1f%%", k.c_str(), total > 0 ? 100 * s / total : 0.0);
    std::printf("\n");
  }
  std::printf("stale-coverage prefill (tasks completed / submitted, tokens run, KV chunks cached):\n");
  for (const SchedRun& r : runs)
    std::printf("  %-18s %lld / %lld, %lld tokens, %lld chunks\n", r.system.c_str(),
                static_cast<long long>(r.stale_completed), static_cast<long long>(r.stale_tasks),
                static_cast<long long>(r.stale_tokens), static_cast<long long>(r.stale_chunks));
  std::printf("ratios (targets: fifo/ff wait p95 >= 3.1, p99 >= 3.4; non-preemptible/ff TTFT p95 >= 1.55; ff commits "
              ">= rr; stale prefill p99 reduction >= 25%%):\n  %s\n",
              ratios.dump().c_str());
  return 0;
}

}  // namespace

void add_learning_options(CLI::App* sub, SchedWorkload& w) {
  sub->add_option("--judge-gen", w.judge_gen, "Tokens of each judge call")->capture_default_str();
  sub->add_option("--train-samples", w.train_samples, "Training samples")->capture_default_str();
  sub->add_option("--train-tokens", w.train_tokens, "Tokens per training sample")->capture_default_str();
  sub->add_option("--rank", w.rank, "LoRA rank of the trained adapter")->capture_default_str();
  sub->add_option("--commit-every", w.commit_every, "Optimizer steps per committed (staged) version")
      ->capture_default_str();
  sub->add_option("--phase-seconds", w.phase_s, "Trainer phases sized to about this many seconds (0: whole samples)")
      ->capture_default_str();
  sub->add_option("--publish-wait", w.publish_wait_s, "Seconds between staging a version and publishing it")
      ->capture_default_str();
  sub->add_option("--window", w.window_s, "W_bg: the background window, seconds")->capture_default_str();
  sub->add_option("--seed", w.seed, "Seed of the workload (prompts, think times)")->capture_default_str();
}

void add_bench_sched_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<SchedBenchArgs>();
  CLI::App* sub = bench->add_subcommand(
      "sched", "Scheduler policies on a mixed workload: foreground turns, judge calls, training, stale prefill");
  add_model_options(sub, a->model);
  SchedWorkload& w = a->w;
  sub->add_option("--systems", a->systems, "Systems to run, in order")->delimiter(',')->capture_default_str();
  sub->add_option("--agents", w.agents, "Concurrent agents (conversations)")->capture_default_str();
  sub->add_option("--turns", w.turns, "Turns per agent")->capture_default_str();
  sub->add_option("--think", w.think_s, "Mean think time between an agent's turns, seconds")->capture_default_str();
  sub->add_option("--system-tokens", w.system_tokens, "Tokens of each agent's system prompt")->capture_default_str();
  sub->add_option("--user-tokens", w.user_tokens, "Tokens of each user message")->capture_default_str();
  sub->add_option("--gen", w.gen, "Tokens of each answer")->capture_default_str();
  add_learning_options(sub, w);
  sub->add_option("--duration", w.duration_s,
                  "Seconds each system runs: training goes on after the agents' last turn until then (0: ends with "
                  "the agents)")
      ->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_sched_bench(*a); });
}

}  // namespace ebb::cli
