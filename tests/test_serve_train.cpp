// ebb serve's training jobs (/v1/training/jobs), driven over loopback on
// stories260K: a job trains, stages and publishes a version (its loss goes
// down, its files are written under --adapter-dir, a completion naming the
// adapter differs from the base), a foreground request while a long job
// runs is admitted at the next phase boundary, cancel ends a job, manual
// publishing, bad bodies get 400 naming the field, the API key is enforced,
// SIGTERM with a job running exits cleanly, and jobs after or during
// evictions of every weight layer finish. Every wait is bounded.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace ebb {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

using test::client;
using test::get;
using test::post;
using test::Reply;
using test::ServerProcess;
using test::metric_value;

// The server's arguments beyond serve_support's: the key, a short context.
std::vector<std::string> args(std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--api-key", test::kKey, "--ctx", "256", "--quiet"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Polls the job until `done(job)` or the limit; returns its last state.
json poll_job(httplib::Client& c, const std::string& id, const std::function<bool(const json&)>& done,
              std::chrono::seconds limit = 60s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  json j;
  while (std::chrono::steady_clock::now() < end) {
    const Reply r = get(c, "/v1/training/jobs/" + id);
    if (r.status != 200) {
      ADD_FAILURE() << r.raw;
      return j;
    }
    j = r.body;
    if (done(j)) return j;
    std::this_thread::sleep_for(20ms);
  }
  ADD_FAILURE() << "job " << id << " did not get there in time: " << j.dump();
  return j;
}

bool ended(const json& j) {
  const std::string s = j["state"];
  return s == "done" || s == "committed" || s == "failed" || s == "cancelled";
}

json story_samples() {
  return json::array({
      {{"text", "Once upon a time, there was a red fox named Zed. Zed loved to dance in the snow."}},
      {{"prompt", "Once upon a time, there was a red fox"}, {"completion", " named Zed. Zed loved to dance."}},
      {{"messages", {{{"role", "user"}, {"content", "Who is Zed?"}},
                     {{"role", "assistant"}, {"content", "Zed is a red fox who loves to dance."}}}},
       {"weight", 1.0}},
      {{"text", "Zed the fox danced and danced. The snow was white and Zed was happy."}},
  });
}

std::string complete(httplib::Client& c, const std::string& model) {
  const Reply r = post(c, "/v1/completions",
                       json{{"model", model}, {"prompt", "Once upon a time, there was"}, {"max_tokens", 24},
                            {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.status == 200 ? r.body["choices"][0]["text"].get<std::string>() : "";
}

class ServeTrain : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<ebb::test::TempDir>("ebb-serve-train");
    server_ = std::make_unique<ServerProcess>(args({"--adapter-dir", dir_->path()}));
    ASSERT_GT(server_->port(), 0) << "the server did not start";
    c_ = client(server_->port());
  }
  std::unique_ptr<ebb::test::TempDir> dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<httplib::Client> c_;
};

// A job trains, stages and publishes a version; its loss goes down; the
// adapter changes what the model writes; its files are in --adapter-dir.
TEST_F(ServeTrain, AJobTrainsStagesAndPublishes) {
  const std::string base = complete(*c_, "stories260K");
  const Reply r = post(*c_, "/v1/training/jobs",
                       json{{"adapter", "zed"}, {"samples", story_samples()}, {"rank", 8}, {"alpha", 16},
                            {"learning_rate", 1e-2}, {"steps", 30}, {"batch_size", 2}, {"seed", 3},
                            {"phase_seconds", 0}});  // whole samples per phase: a known count of phases
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string id = r.body["id"];
  EXPECT_EQ(r.body["object"], "training.job");
  EXPECT_EQ(r.body["adapter"], "zed");
  const json j = poll_job(*c_, id, ended);
  ASSERT_EQ(j["state"], "done") << j.dump();
  EXPECT_EQ(j["step"], 30);
  EXPECT_EQ(j["phases_run"], 30 * (2 * 2 + 1));
  EXPECT_EQ(j["commits"], 1);
  EXPECT_EQ(j["publishes"], 1);
  EXPECT_EQ(j["version_staged"], 1);
  EXPECT_EQ(j["version_published"], 1);
  EXPECT_GT(j["tokens_trained"].get<int64_t>(), 30 * 2 * 10);
  EXPECT_LT(j["loss"].get<double>(), 0.6 * j["first_loss"].get<double>()) << j.dump();
  EXPECT_GT(j["timings"]["phases"]["forward"]["max_s"].get<double>(), 0.0);
  EXPECT_TRUE(std::filesystem::exists(dir_->file("zed.gguf")));
  EXPECT_TRUE(std::filesystem::exists(dir_->file("zed.ckpt/trainer.ebbt")));
  EXPECT_FALSE(std::filesystem::exists(dir_->file("zed.gguf.tmp")));

  const std::string tuned = complete(*c_, "stories260K:zed");
  EXPECT_NE(tuned, base) << "the trained adapter does not change the greedy completion";
  EXPECT_EQ(complete(*c_, "stories260K"), base);  // the base is untouched

  const Reply list = get(*c_, "/v1/training/jobs");
  ASSERT_EQ(list.status, 200);
  ASSERT_EQ(list.body["data"].size(), 1u);
  EXPECT_EQ(list.body["data"][0]["id"], id);
  EXPECT_EQ(test::metric_value(*c_, "ebb_training_jobs{state=\"done\"}"), 1);
  EXPECT_EQ(test::metric_value(*c_, "ebb_training_jobs{state=\"running\"}"), 0);
  EXPECT_EQ(test::metric_value(*c_, "ebb_training_steps_total"), 30);
  EXPECT_EQ(test::metric_value(*c_, "ebb_training_commits_total"), 1);
  EXPECT_EQ(test::metric_value(*c_, "ebb_training_publishes_total"), 1);
  EXPECT_GT(test::metric_value(*c_, "ebb_training_tokens_total"), 0);
  EXPECT_GT(test::metric_value(*c_, "ebb_training_phase_seconds_total{phase=\"backward\"}"), 0);
}

// While a long job runs, a completion is admitted at the next phase
// boundary: it returns while the job is still running, its queue wait is
// below one phase plus a margin, and the job counts a yield. Cancel then
// ends the job at its next boundary.
TEST_F(ServeTrain, ForegroundRequestsPreemptAtPhaseBoundariesAndCancelEnds) {
  json samples = json::array();
  for (int i = 0; i < 8; ++i) {
    json t = json::array(), w = json::array();
    for (int k = 0; k < 128; ++k) {
      t.push_back(1 + (i * 131 + k * 17) % 500);
      w.push_back(1.0);
    }
    samples.push_back({{"tokens", t}, {"weights", w}});
  }
  const Reply r = post(*c_, "/v1/training/jobs",
                       json{{"adapter", "long"}, {"samples", samples}, {"steps", 100000}, {"batch_size", 4}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string id = r.body["id"];
  poll_job(*c_, id, [](const json& j) { return j["state"] == "running" && j["phases_run"].get<int64_t>() >= 10; });

  // A second job on the same adapter is refused while this one runs.
  const Reply dup = post(*c_, "/v1/training/jobs", json{{"adapter", "long"}, {"samples", samples}, {"steps", 1}});
  EXPECT_EQ(dup.status, 409) << dup.raw;

  const auto t0 = std::chrono::steady_clock::now();
  const Reply g = post(*c_, "/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 4}});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(g.status, 200) << g.raw;
  // The job's next phase after the request counts the yield.
  const json j = poll_job(*c_, id, [](const json& x) { return x["yields"].get<int64_t>() >= 1 || ended(x); }, 10s);
  EXPECT_EQ(j["state"], "running") << "the job ended before the request: it did not yield";
  EXPECT_GE(j["yields"].get<int64_t>(), 1) << j.dump();
  ASSERT_TRUE(j.contains("scheduler")) << j.dump();
  EXPECT_TRUE(j["scheduler"]["fits_window"].get<bool>()) << j.dump();
  double phase_max = 0;
  for (const char* p : {"forward", "backward", "commit"})
    phase_max = std::max(phase_max, j["timings"]["phases"][p]["max_s"].get<double>());
  const double wait_max = test::metric_value(*c_, "ebb_queue_wait_max_seconds");
  EXPECT_GE(wait_max, 0);
  EXPECT_LE(wait_max, phase_max + 0.25) << "longest phase " << phase_max << " s, request took " << took << " s";

  const Reply cancel = post(*c_, "/v1/training/jobs/" + id + "/cancel", std::string());
  ASSERT_EQ(cancel.status, 200) << cancel.raw;
  const json after = poll_job(*c_, id, ended, 10s);
  EXPECT_EQ(after["state"], "cancelled");
  EXPECT_LT(after["step"].get<int64_t>(), 100000);
  // Cancelling again is harmless, and the server still trains.
  EXPECT_EQ(post(*c_, "/v1/training/jobs/" + id + "/cancel", std::string()).status, 200);
  EXPECT_EQ(get(*c_, "/v1/training/jobs/" + id).body["state"], "cancelled");
}

// publish: "manual" stages a version that serving uses only after
// POST .../publish; continuing a loaded adapter with from_adapter.
TEST_F(ServeTrain, ManualPublishAndContinuingAnAdapter) {
  const Reply a = post(*c_, "/v1/training/jobs",
                       json{{"adapter", "fox"}, {"samples", story_samples()}, {"learning_rate", 1e-2}, {"steps", 4}});
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(poll_job(*c_, a.body["id"], ended)["state"], "done");
  const std::string v1 = complete(*c_, "stories260K:fox");
  // A long prompt asked twice on version 1: its prefix is hot.
  const json hot_req = {{"model", "stories260K:fox"},
                        {"prompt",
                         "Once upon a time there was a little girl named Lily who loved to play in the park with her "
                         "friends every day. One day she found a big red ball under a tree and she was very happy."},
                        {"max_tokens", 4},
                        {"temperature", 0}};
  ASSERT_EQ(post(*c_, "/v1/completions", hot_req).status, 200);
  ASSERT_EQ(post(*c_, "/v1/completions", hot_req).status, 200);
  const double warm0 = test::metric_value(*c_, "ebb_stale_prefill_tasks_total{outcome=\"submitted\"}");

  const Reply b = post(*c_, "/v1/training/jobs",
                       json{{"adapter", "fox"}, {"from_adapter", "fox"}, {"samples", story_samples()},
                            {"learning_rate", 2e-2}, {"epochs", 4}, {"batch_size", 2}, {"publish", "manual"}});
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(b.body["steps"], 8);  // 4 epochs of 4 samples, 2 a step
  const std::string id = b.body["id"];
  json j = poll_job(*c_, id, ended);
  ASSERT_EQ(j["state"], "committed") << j.dump();
  EXPECT_EQ(j["version_staged"], 2);
  EXPECT_TRUE(j["version_published"].is_null()) << j.dump();  // this job published nothing (version 1 is the first job's)
  EXPECT_EQ(complete(*c_, "stories260K:fox"), v1);  // still version 1
  // Staging version 2 started stale-coverage prefill of the hot prefix.
  EXPECT_GE(test::metric_value(*c_, "ebb_stale_prefill_tasks_total{outcome=\"submitted\"}") - warm0, 1);

  const Reply p = post(*c_, "/v1/training/jobs/" + id + "/publish", std::string());
  ASSERT_EQ(p.status, 200) << p.raw;
  EXPECT_EQ(p.body["state"], "done");
  EXPECT_EQ(p.body["version_published"], 2);
  EXPECT_NE(complete(*c_, "stories260K:fox"), v1);
  EXPECT_EQ(post(*c_, "/v1/training/jobs/" + id + "/publish", json{{"version", 99}}).status, 400);
}

void expect_error(const Reply& r, int status, const std::string& param) {
  EXPECT_EQ(r.status, status) << r.raw;
  ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << r.raw;
  if (!param.empty()) {
    EXPECT_EQ(r.body["error"]["param"], param) << r.raw;
  }
}

TEST_F(ServeTrain, BadBodiesAre400NamingTheField) {
  const json ok = {{"adapter", "x"}, {"samples", {{{"text", "Once upon a time there was a cat."}}}}, {"steps", 1}};
  auto with = [&](const char* key, json v) {
    json b = ok;
    b[key] = std::move(v);
    return post(*c_, "/v1/training/jobs", b);
  };
  auto sample = [&](json s) { return with("samples", json::array({std::move(s)})); };
  expect_error(post(*c_, "/v1/training/jobs", std::string("{not json")), 400, "");
  expect_error(post(*c_, "/v1/training/jobs", json::array()), 400, "");
  json no_name = ok;
  no_name.erase("adapter");
  expect_error(post(*c_, "/v1/training/jobs", no_name), 400, "adapter");
  expect_error(with("adapter", "../etc"), 400, "adapter");
  expect_error(with("adapter", "a/b"), 400, "adapter");
  expect_error(with("adapter", std::string(129, 'a')), 400, "adapter");
  expect_error(with("samples", json::array()), 400, "samples");
  expect_error(with("samples", "text"), 400, "samples");
  expect_error(sample({{"tokens", json::array({1})}}), 400, "samples[0]");  // one token
  expect_error(sample({{"tokens", {1, 2, 100000}}}), 400, "samples[0].tokens");
  expect_error(sample({{"tokens", {1, 2, 3}}, {"weights", {1, 1}}}), 400, "samples[0].weights");
  expect_error(sample({{"tokens", json::array({1, 2, 3})}, {"weights", {1, "one", 1}}}), 400, "samples[0].weights");
  json too_long = json::array();
  for (int i = 0; i < 300; ++i) too_long.push_back(5);
  expect_error(sample({{"tokens", too_long}}), 400, "samples[0].tokens");  // over --ctx 256
  expect_error(sample({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400, "samples[0].messages[0].role");
  expect_error(sample({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}), 400, "samples[0].messages");
  expect_error(sample({{"prompt", "Once"}}), 400, "samples[0].completion");
  expect_error(sample({{"prompt", "Once"}, {"completion", " upon"}, {"weight", "heavy"}}), 400, "samples[0].weight");
  expect_error(sample({{"nothing", 1}}), 400, "samples[0]");
  expect_error(sample({{"text", "a b c d"}, {"tokens", {1, 2}}}), 400, "samples[0]");
  expect_error(with("rank", 0), 400, "rank");
  expect_error(with("rank", 100000), 400, "rank");
  expect_error(with("alpha", -1), 400, "alpha");
  expect_error(with("learning_rate", -1), 400, "learning_rate");
  expect_error(with("learning_rate", "fast"), 400, "learning_rate");
  expect_error(with("steps", 0), 400, "steps");
  expect_error(with("epochs", 2), 400, "steps");  // both given
  expect_error(with("batch_size", 0), 400, "batch_size");
  expect_error(with("publish", "sometimes"), 400, "publish");
  expect_error(with("targets", "q,wizard"), 400, "targets");
  expect_error(with("targets", 7), 400, "targets");
  expect_error(with("from_adapter", "nope"), 400, "from_adapter");
  expect_error(with("commit_every", -1), 400, "commit_every");
  expect_error(get(*c_, "/v1/training/jobs/trainjob-999"), 404, "");
  expect_error(post(*c_, "/v1/training/jobs/trainjob-999/cancel", std::string()), 404, "");
  // Nothing was created, and a good body still works.
  EXPECT_EQ(get(*c_, "/v1/training/jobs").body["data"].size(), 0u);
  const Reply good = post(*c_, "/v1/training/jobs", ok);
  EXPECT_EQ(good.status, 200) << good.raw;
}

TEST_F(ServeTrain, TheApiKeyIsEnforced) {
  auto anon = client(server_->port(), /*with_key=*/false);
  const json ok = {{"adapter", "x"}, {"samples", {{{"text", "Once upon a time there was a cat."}}}}, {"steps", 1}};
  EXPECT_EQ(post(*anon, "/v1/training/jobs", ok).status, 401);
  EXPECT_EQ(get(*anon, "/v1/training/jobs").status, 401);
  EXPECT_EQ(get(*anon, "/v1/training/jobs/trainjob-1").status, 401);
  EXPECT_EQ(post(*anon, "/v1/training/jobs/trainjob-1/cancel", std::string()).status, 401);
  EXPECT_EQ(post(*anon, "/v1/training/jobs/trainjob-1/publish", std::string()).status, 401);
  EXPECT_EQ(get(*c_, "/v1/training/jobs").body["data"].size(), 0u);
}

// SIGTERM while a job runs: the job ends at a phase boundary and the server
// exits 0 promptly.
TEST(ServeTrainAlone, SigtermWithARunningJobExitsCleanly) {
  ServerProcess s(args());
  ASSERT_GT(s.port(), 0);
  auto c = client(s.port());
  json t = json::array();
  for (int k = 0; k < 64; ++k) t.push_back(1 + k * 7 % 400);
  const Reply r = post(*c, "/v1/training/jobs",
                       json{{"adapter", "bye"}, {"samples", {{{"tokens", t}}}}, {"steps", 1000000}});
  ASSERT_EQ(r.status, 200) << r.raw;
  poll_job(*c, r.body["id"], [](const json& j) { return j["phases_run"].get<int64_t>() >= 3; });
  EXPECT_EQ(s.stop(SIGTERM, 10000ms), 0);
}

// The crash on the path of on-device learning: everything evicted (POST
// /v1/memory/evict {"fraction": 1}), then a training job. Its phases read
// the dropped weight layers; they used to touch the units directly and the
// server aborted ("weight unit used while not resident"). Now the job
// finishes, and the server is still alive and answers /health. The same
// after trim level 5 (running_moderate, a tenth of the footprint).
TEST_F(ServeTrain, AJobAfterEvictingEverythingFinishesAndTheServerLives) {
  int n = 0;
  for (const json& evict : {json{{"fraction", 1}}, json{{"level", 5}}}) {
    SCOPED_TRACE(evict.dump());
    const bool trim = evict.contains("level");
    const Reply e = post(*c_, trim ? "/v1/memory/trim" : "/v1/memory/evict", evict);
    ASSERT_EQ(e.status, 200) << e.raw;
    EXPECT_GT((trim ? e.body["evict"] : e.body)["weights_dropped"].get<int64_t>(), 0) << e.raw;
    const std::string name = "t" + std::to_string(++n);
    const Reply r = post(*c_, "/v1/training/jobs", json{{"adapter", name}, {"samples", {{{"text", "hi"}}}}});
    ASSERT_EQ(r.status, 200) << r.raw;
    const json j = poll_job(*c_, r.body["id"], ended);
    EXPECT_EQ(j["state"], "done") << j.dump();
    EXPECT_EQ(j["step"], 1) << j.dump();
    const Reply h = get(*c_, "/health");
    ASSERT_EQ(h.status, 200) << "the server died";
    EXPECT_EQ(h.body["status"], "ok");
  }
  EXPECT_EQ(get(*c_, "/v1/training/jobs").body["data"].size(), 2u);
}

// Evictions while a job runs (they run between its phases, on the scheduler
// thread): the next phase acquires its layers again, the job finishes, and
// completions between them are served.
TEST_F(ServeTrain, EvictionsBetweenPhasesOfARunningJob) {
  const Reply r = post(*c_, "/v1/training/jobs",
                       json{{"adapter", "busy"}, {"samples", story_samples()}, {"steps", 40}, {"batch_size", 2}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string id = r.body["id"];
  int evictions = 0, during = 0;
  for (;;) {
    const Reply s = get(*c_, "/v1/training/jobs/" + id);
    ASSERT_EQ(s.status, 200) << "the server died after " << evictions << " evictions";
    const json& j = s.body;
    if (ended(j) || evictions >= 200) break;
    const Reply e = evictions % 3 == 2 ? post(*c_, "/v1/memory/trim", json{{"level", 5}})
                                       : post(*c_, "/v1/memory/evict", json{{"fraction", 1}});
    ASSERT_EQ(e.status, 200) << e.raw;
    ++evictions;
    during += j["state"] == "running";
    if (evictions % 10 == 0) {
      EXPECT_FALSE(complete(*c_, "stories260K").empty());
    }
    std::this_thread::sleep_for(5ms);
  }
  const json j = poll_job(*c_, id, ended);
  EXPECT_EQ(j["state"], "done") << j.dump();
  EXPECT_EQ(j["step"], 40) << j.dump();
  EXPECT_GE(during, 1) << "no eviction came while the job ran";
  EXPECT_EQ(get(*c_, "/health").status, 200);
  EXPECT_FALSE(complete(*c_, "stories260K").empty());
}

// Under --memory-budget (budget mode: weights streamed through a
// forward-only window, the head in parts) a training job is refused with a
// 400 that says why, and the server goes on serving.
TEST(ServeTrainAlone, BudgetModeRefusesTrainingWithA400) {
  ServerProcess s(args({"--memory-budget", "64MiB"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  const Reply r = post(*c, "/v1/training/jobs", json{{"adapter", "t1"}, {"samples", {{{"text", "hi"}}}}});
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("budget mode"), std::string::npos) << r.raw;
  EXPECT_EQ(get(*c, "/v1/training/jobs").body["data"].size(), 0u);
  EXPECT_EQ(get(*c, "/health").status, 200);
  EXPECT_FALSE(complete(*c, "stories260K").empty());
}

// Offload before admission in ebb serve: under --background-memory a
// training job short of memory asks the cache offloader for the shortfall
// (the prefix cache and spare KV buffers the finished requests left give
// bytes back), and, still short, stays pending with the reason in /metrics
// while requests keep being served.
TEST(ServeTrainAlone, AJobShortOfBackgroundMemoryAsksForAnOffloadAndWaits) {
  ebb::test::TempDir dir("ebb-serve-offload");
  ServerProcess s(args({"--adapter-dir", dir.path(), "--background-memory", "1MiB"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  EXPECT_EQ(metric_value(*c, "ebb_offload_requests_total{result=\"requested\"}"), 0);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(complete(*c, "stories260K").empty());  // KV for the cache
  const Reply r = post(*c, "/v1/training/jobs",
                       json{{"adapter", "off"}, {"samples", story_samples()}, {"steps", 5}, {"phase_seconds", 0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string id = r.body["id"];
  const auto end = std::chrono::steady_clock::now() + 20s;
  while ((metric_value(*c, "ebb_offload_requests_total{result=\"short\"}") < 2 ||
          metric_value(*c, "ebb_background_pending{reason=\"memory\"}") < 1) &&
         std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(20ms);
  EXPECT_GE(metric_value(*c, "ebb_offload_requests_total{result=\"requested\"}"), 2);  // asked again after the retry time
  EXPECT_GE(metric_value(*c, "ebb_offload_requests_total{result=\"short\"}"), 2);
  EXPECT_EQ(metric_value(*c, "ebb_offload_requests_total{result=\"admitted\"}"), 0);
  EXPECT_GT(metric_value(*c, "ebb_offload_freed_bytes_total"), 0);  // the finished requests' KV
  EXPECT_EQ(metric_value(*c, "ebb_background_pending{reason=\"memory\"}"), 1);
  const json j = get(*c, "/v1/training/jobs/" + id).body;
  EXPECT_EQ(j["step"], 0) << j.dump();
  EXPECT_FALSE(ended(j)) << j.dump();
  EXPECT_FALSE(complete(*c, "stories260K").empty());  // the foreground is served meanwhile
}

}  // namespace
}  // namespace ebb
