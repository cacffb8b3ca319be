// ebb bench agents on the tiny stories model (seconds): every system
// prints its row with the fields scripts read; pre-prefill runs only in the
// systems that have it and makes the targets' prompts come from the prefix
// cache; sleep-train-wake trains in windows; every system runs the same
// wall time; the KV-budget sweep runs ebb under each budget with commits;
// bad values are refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support.h"

namespace ebb {
namespace {

using test::CliResult;
using test::run_cli;

const std::string kSmall =
    " --threads 1 --tasks 1 --concurrency 1 --steps 2 --context-tokens 160 --tool-result-tokens 32 --gen 4"
    " --handoff-delay 0.4 --train-samples 2 --train-tokens 16 --rank 2 --commit-every 1 --publish-wait 0.1"
    " --window-gap 0.3 --duration 4 --json";

TEST(BenchAgents, EachSystemReportsItsRowAndPrePrefillFillsTheCache) {
  const std::string model = test::model_path("stories260K.gguf");
  const CliResult r =
      run_cli("bench agents -m " + model + kSmall + " --systems ebb,no-preprefill,sleep-train-wake --kv-budget 4");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  ASSERT_EQ(j["systems"].size(), 3u);
  for (const auto& s : j["systems"]) {
    for (const char* k : {"system", "ttft_mean_s", "ttft_p95_s", "ttft_p99_s", "wait_p95_s", "wait_p99_s", "commits",
                          "publishes", "preprefill_tasks", "preprefill_s", "attribution", "peak_rss_bytes"})
      EXPECT_TRUE(s.contains(k)) << k;
    EXPECT_EQ(s["turns"], 6);  // 2 steps of planner, tool, critic: the same sequence for every system
    EXPECT_GT(s["peak_rss_bytes"].get<double>(), 0);
  }
  const auto& ebb = j["systems"][0];
  const auto& nopp = j["systems"][1];
  const auto& stw = j["systems"][2];
  EXPECT_EQ(ebb["system"], "ebb");
  EXPECT_GT(ebb["preprefill_tasks"].get<int>(), 0);
  EXPECT_GT(ebb["preprefill_tokens"].get<int>(), 0);
  EXPECT_EQ(nopp["preprefill_tasks"], 0);
  EXPECT_EQ(stw["preprefill_tasks"], 0);
  // The targets' prefixes were in the cache when their requests came.
  EXPECT_GT(ebb["cached_tokens"].get<int>(), nopp["cached_tokens"].get<int>());
  EXPECT_GT(stw["train_windows"].get<int>(), 0);
  // Each window: a sleep, --window-steps (5) optimizer steps with their
  // commits staged before serving resumes, a wake that reads the model back
  // (counted at T: a window in progress then has made some of its commits).
  EXPECT_GE(stw["commits"].get<int>(), 5 * stw["train_windows"].get<int>());
  EXPECT_LE(stw["commits"].get<int>(), 5 * (stw["train_windows"].get<int>() + 1));
  EXPECT_GT(stw["train_window_wake_s"].get<double>(), 0);
  EXPECT_GE(stw["train_window_sleep_s"].get<double>(), 0);
  EXPECT_EQ(ebb["train_windows"], 0);
  EXPECT_GT(ebb["commits"].get<int>(), 0);
  // The sweep: ebb under a 4 MiB budget, training admitted.
  ASSERT_EQ(j["sweep"].size(), 1u);
  EXPECT_EQ(j["sweep"][0]["kv_budget_bytes"], 4u << 20);
  EXPECT_GT(j["sweep"][0]["commits"].get<int>(), 0);
  EXPECT_EQ(j["sweep"][0]["publish_failures"], 0);
}

// Every system runs for exactly --duration of wall time: tasks keep coming
// closed-loop until then (--tasks 0), nothing is counted after it, and the
// rates are over that window.
TEST(BenchAgents, EverySystemRunsTheSameWallTimeWithTasksClosedLoop) {
  const std::string model = test::model_path("stories260K.gguf");
  const CliResult r = run_cli("bench agents -m " + model +
                              " --threads 1 --tasks 0 --concurrency 2 --steps 1 --context-tokens 64"
                              " --tool-result-tokens 16 --gen 2 --handoff-delay 0.2 --train-samples 2"
                              " --train-tokens 16 --rank 2 --commit-every 1 --publish-wait 0.1 --window-gap 0.3"
                              " --duration 2.5 --systems ebb,sleep-train-wake --json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  ASSERT_EQ(j["systems"].size(), 2u);
  for (const auto& s : j["systems"]) {
    SCOPED_TRACE(s["system"].get<std::string>());
    // A task of one step is 3 turns and 2 handoff pauses of 0.2 s: each of
    // the 2 workers starts more than one task in 2.5 s.
    EXPECT_GT(s["tasks_started"].get<int>(), 2);
    EXPECT_GE(s["tasks_completed"].get<int>(), 2);
    EXPECT_GE(s["turns"].get<int>(), 3 * s["tasks_completed"].get<int>());
    // Counted at T, not after the last task.
    EXPECT_GE(s["wall_s"].get<double>(), 2.5);
    EXPECT_LT(s["wall_s"].get<double>(), 3.5);
    EXPECT_GE(s["run_s"].get<double>(), s["wall_s"].get<double>());
    EXPECT_NEAR(s["commits_per_min"].get<double>(), 60.0 * s["commits"].get<double>() / s["wall_s"].get<double>(),
                1e-6);
    EXPECT_GT(s["commits"].get<int>(), 0);
  }
}

TEST(BenchAgents, RefusesBadValuesByName) {
  const std::string model = test::model_path("stories260K.gguf");
  // {arguments, what the error names}
  const std::pair<const char*, const char*> cases[] = {
      {"--systems ebb,warp", "unknown system 'warp'"}, {"--kv-budget 0", "--kv-budget"},
      {"--steps 0", "--steps"},                        {"--window-steps 0", "--window-steps"},
      {"--window-gaps sometimes", "--window-gaps"},    {"--step-seconds -1", "--step-seconds"},
      {"--duration 0", "--duration"}};
  for (const auto& [args, names] : cases) {
    const CliResult r = run_cli("bench agents -m " + model + " " + args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(names), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace ebb
