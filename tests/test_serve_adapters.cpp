// ebb serve's /v1/adapters routes, driven over loopback: the listing, loads
// by name from --adapter-dir only (bad names, absolute paths, symlinks out
// of the directory, missing and malformed files), stage then publish
// (which version a plain request uses; a staged one only when asked by
// version; greedy answers equal `ebb run --lora FILE`), unload, the metrics;
// and stale-coverage prefill: staging prefills the hot prefixes of the
// published version under the staged one, requests on the published
// version are unaffected, and after publication a request takes that KV
// from the cache and answers as a recompute does.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using ebb::test::client;
using ebb::test::expect_openai_error;
using ebb::test::get;
using ebb::test::kKey;
using ebb::test::post;
using ebb::test::Reply;
using ebb::test::ServerProcess;

// A random rank-4 adapter for stories260K (B's spread large enough that
// greedy answers change).
void synth(const std::string& out, int seed) {
  const ebb::test::CliResult r = ebb::test::run_cli("adapter synth -m " + ebb::test::model_path("stories260K.gguf") +
                                                    " --rank 4 --b-std 0.2 --seed " + std::to_string(seed) + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
}

// `ebb run`'s greedy answer with the adapter file, as the server is set up.
std::string ebb_run(const std::string& lora, const std::string& prompt, int n) {
  const ebb::test::CliResult r =
      ebb::test::run_cli("run -m " + ebb::test::model_path("stories260K.gguf") + " --lora " + lora + " -p '" + prompt +
                         "' -n " + std::to_string(n) + " --temp 0 -t 1 --kv-chunk 16 --batch 16");
  EXPECT_EQ(r.status, 0) << r.err;
  return r.out;
}

const char* kLong =
    "Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day. "
    "One day she found a big red ball under a tree and she was very happy. She took the ball home and showed it to "
    "her mom";

class ServeAdapters : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ebb::test::TempDir("ebb-adapters");
    outside_ = new ebb::test::TempDir("ebb-outside");
    synth(dir_->file("style.gguf"), 1);
    synth(dir_->file("other.gguf"), 3);
    synth(dir_->file("warm.gguf"), 5);
    synth(outside_->file("secret.gguf"), 4);
    std::ofstream(dir_->file("bad.gguf")) << "this is not a GGUF file";
    std::filesystem::create_symlink(outside_->file("secret.gguf"), dir_->file("escape.gguf"));
    std::filesystem::create_symlink(dir_->file("other.gguf"), dir_->file("alias.gguf"));  // inside: fine
    std::filesystem::create_directory(dir_->file("sub"));
    server_ = new ServerProcess({"--api-key", kKey, "--adapter-dir", dir_->path(), "--ctx", "512", "--quiet"});
    ASSERT_GT(server_->port(), 0) << "no port in the server's first line: '" << server_->first_line() << "'";
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->stop(SIGTERM), 0);
    }
    delete server_;
    delete dir_;
    delete outside_;
    server_ = nullptr;
    dir_ = outside_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(server_ && server_->port() > 0);
    c_ = client(server_->port());
  }

  Reply complete(const json& extra, const std::string& prompt, int n = 16) {
    json req = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}};
    for (auto it = extra.begin(); it != extra.end(); ++it) req[it.key()] = it.value();
    return post(*c_, "/v1/completions", req);
  }
  std::string text_of(const Reply& r) {
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.status == 200 ? r.body["choices"][0]["text"].get<std::string>() : "";
  }
  // usage.prompt_tokens_details.cached_tokens; -1 when absent.
  static int64_t cached_of(const Reply& r) {
    return r.body.contains(json::json_pointer("/usage/prompt_tokens_details/cached_tokens"))
               ? r.body.at(json::json_pointer("/usage/prompt_tokens_details/cached_tokens")).get<int64_t>()
               : -1;
  }
  json versions(const std::string& name) {
    Reply l = get(*c_, "/v1/adapters");
    EXPECT_EQ(l.status, 200) << l.raw;
    for (const json& a : l.body["data"])
      if (a["name"] == name) return a;
    return json();
  }
  double metric(const std::string& name) { return ebb::test::metric_value(*c_, name); }

  static ebb::test::TempDir* dir_;
  static ebb::test::TempDir* outside_;
  static ServerProcess* server_;
  std::unique_ptr<httplib::Client> c_;
};
ebb::test::TempDir* ServeAdapters::dir_ = nullptr;
ebb::test::TempDir* ServeAdapters::outside_ = nullptr;
ServerProcess* ServeAdapters::server_ = nullptr;

TEST_F(ServeAdapters, TheRoutesNeedTheApiKey) {
  auto none = client(server_->port(), /*with_key=*/false);
  expect_openai_error(get(*none, "/v1/adapters"), 401, "invalid_api_key");
  expect_openai_error(post(*none, "/v1/adapters/load", json{{"name", "other"}}), 401, "invalid_api_key");
  expect_openai_error(post(*none, "/v1/adapters/other/publish", json{{"version", 1}}), 401, "invalid_api_key");
}

TEST_F(ServeAdapters, LoadByNameListsEveryVersionWithItsDetails) {
  Reply r = post(*c_, "/v1/adapters/load", json{{"name", "other"}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["name"], "other");
  EXPECT_EQ(r.body["version"], 1);
  EXPECT_EQ(r.body["state"], "published");
  EXPECT_EQ(r.body["created"], true);
  EXPECT_EQ(r.body["rank"], 4);
  EXPECT_EQ(r.body["source"], "other.gguf");  // relative to the adapter directory
  EXPECT_EQ(r.body["digest"].get<std::string>().size(), 16u);
  const json a = versions("other");
  ASSERT_TRUE(a.is_object());
  EXPECT_EQ(a["published_version"], 1);
  ASSERT_EQ(a["versions"].size(), 1u);
  const json& v = a["versions"][0];
  for (const char* k : {"version", "digest", "state", "published", "rank", "alpha", "targets", "format", "bytes", "users",
                        "source"})
    EXPECT_TRUE(v.contains(k)) << k << ": " << v.dump();
  EXPECT_EQ(v["digest"], r.body["digest"]);
  EXPECT_EQ(v["targets"], "q k v o gate up down");
  EXPECT_GT(v["bytes"].get<int64_t>(), 0);
  // Loading the same bytes again is the same version; a symlink inside the
  // directory is followed.
  Reply again = post(*c_, "/v1/adapters/load", json{{"name", "other.gguf"}});
  ASSERT_EQ(again.status, 200) << again.raw;
  EXPECT_EQ(again.body["version"], 1);
  EXPECT_EQ(again.body["created"], false);
  Reply alias = post(*c_, "/v1/adapters/load", json{{"name", "alias"}});
  ASSERT_EQ(alias.status, 200) << alias.raw;
  EXPECT_EQ(alias.body["name"], "alias");
  EXPECT_EQ(alias.body["digest"], r.body["digest"]);
  // /v1/models lists them for requests.
  Reply m = get(*c_, "/v1/models");
  std::vector<std::string> ids;
  for (const json& d : m.body["data"]) ids.push_back(d["id"].get<std::string>());
  EXPECT_NE(std::find(ids.begin(), ids.end(), "stories260K:other"), ids.end()) << m.raw;
  EXPECT_EQ(complete({{"model", "stories260K:other"}}, "Once upon a time", 4).status, 200);
}

TEST_F(ServeAdapters, BadNamesAndFilesAreRefusedWithTheRightStatus) {
  const std::string long_name(129, 'a');
  for (const std::string& name : {std::string("../x"), std::string("/etc/passwd"), std::string("a/b"),
                                  std::string(".hidden"), std::string("x..y"), std::string(""), long_name,
                                  std::string("a b"), std::string("sub/../other"), outside_->file("secret.gguf")}) {
    Reply r = post(*c_, "/v1/adapters/load", json{{"name", name}});
    expect_openai_error(r, 400, "invalid_adapter_name", "name");
  }
  expect_openai_error(post(*c_, "/v1/adapters/load", json{{"name", 7}}), 400, "", "name");
  expect_openai_error(post(*c_, "/v1/adapters/load", json{{"name", "other"}, {"publish", "yes"}}), 400, "", "publish");
  expect_openai_error(post(*c_, "/v1/adapters/load", std::string("{not json")), 400);
  // A missing file.
  Reply missing = post(*c_, "/v1/adapters/load", json{{"name", "missing"}});
  expect_openai_error(missing, 404, "adapter_not_found", "name");
  EXPECT_NE(missing.body["error"]["message"].get<std::string>().find("missing.gguf"), std::string::npos) << missing.raw;
  // A malformed file: the loader's message.
  Reply bad = post(*c_, "/v1/adapters/load", json{{"name", "bad"}});
  expect_openai_error(bad, 400, "invalid_adapter_file");
  EXPECT_NE(bad.body["error"]["message"].get<std::string>().find("bad.gguf"), std::string::npos) << bad.raw;
  // A symlink that leads out of the directory (to a valid adapter).
  Reply escape = post(*c_, "/v1/adapters/load", json{{"name", "escape"}});
  expect_openai_error(escape, 403, "adapter_outside_dir");
  EXPECT_TRUE(versions("escape").is_null());
  EXPECT_TRUE(versions("bad").is_null());
  // Routes on a name that is not loaded, or not a name.
  expect_openai_error(post(*c_, "/v1/adapters/nope/publish", json{{"version", 1}}), 404, "adapter_not_found");
  expect_openai_error(post(*c_, "/v1/adapters/nope/unload", std::string()), 404, "adapter_not_found");
  expect_openai_error(post(*c_, "/v1/adapters/nope/stage", std::string()), 404, "adapter_not_found");
  expect_openai_error(post(*c_, "/v1/adapters/.x/stage", std::string()), 400, "invalid_adapter_name");
}

TEST_F(ServeAdapters, StageThenPublishChangesWhatAPlainRequestUses) {
  const std::string prompt = "Once upon a time";
  ASSERT_EQ(post(*c_, "/v1/adapters/load", json{{"name", "style"}}).status, 200);
  const std::string v1 = text_of(complete({{"model", "stories260K:style"}}, prompt));
  EXPECT_EQ(ebb_run(dir_->file("style.gguf"), prompt, 16), v1 + "\n");
  const std::string base = text_of(complete({}, prompt));
  EXPECT_NE(v1, base);

  // The file changes: staging reads it again as version 2.
  synth(dir_->file("style.gguf"), 2);
  Reply st = post(*c_, "/v1/adapters/style/stage", std::string());
  ASSERT_EQ(st.status, 200) << st.raw;
  EXPECT_EQ(st.body["version"], 2);
  EXPECT_EQ(st.body["state"], "staged");
  EXPECT_EQ(st.body["created"], true);
  const json listed = versions("style");
  EXPECT_EQ(listed["published_version"], 1);
  ASSERT_EQ(listed["versions"].size(), 2u);
  EXPECT_EQ(listed["versions"][1]["state"], "staged");

  // Plain requests stay on version 1; version 2 only when asked for.
  EXPECT_EQ(text_of(complete({{"model", "stories260K:style"}}, prompt)), v1);
  const std::string v2 = text_of(complete({{"model", "stories260K:style"}, {"adapter_version", 2}}, prompt));
  EXPECT_NE(v2, v1);
  EXPECT_EQ(ebb_run(dir_->file("style.gguf"), prompt, 16), v2 + "\n");
  EXPECT_EQ(text_of(complete({{"adapter", "style"}, {"adapter_version", 1}}, prompt)), v1);
  EXPECT_EQ(complete({{"adapter", "style"}, {"adapter_version", 9}}, prompt).status, 400);
  expect_openai_error(complete({{"adapter_version", 1}}, prompt), 400, "", "adapter_version");

  // The same bytes staged again are the same version.
  Reply same = post(*c_, "/v1/adapters/style/stage", json{{"file", "style.gguf"}});
  ASSERT_EQ(same.status, 200) << same.raw;
  EXPECT_EQ(same.body["version"], 2);
  EXPECT_EQ(same.body["created"], false);

  expect_openai_error(post(*c_, "/v1/adapters/style/publish", json::object()), 400, "", "version");
  expect_openai_error(post(*c_, "/v1/adapters/style/publish", json{{"version", 9}}), 404, "adapter_not_found", "version");
  Reply pub = post(*c_, "/v1/adapters/style/publish", json{{"version", 2}});
  ASSERT_EQ(pub.status, 200) << pub.raw;
  EXPECT_EQ(pub.body["state"], "published");
  EXPECT_EQ(versions("style")["published_version"], 2);
  EXPECT_EQ(text_of(complete({{"model", "stories260K:style"}}, prompt)), v2);

  // Unload: not the published version while others remain; a staged one;
  // then the whole adapter.
  expect_openai_error(post(*c_, "/v1/adapters/style/unload", json{{"version", 2}}), 409, "adapter_version_published");
  expect_openai_error(post(*c_, "/v1/adapters/style/unload", json{{"version", 7}}), 404, "adapter_not_found");
  ASSERT_EQ(post(*c_, "/v1/adapters/style/publish", json{{"version", 1}}).status, 200);
  Reply un = post(*c_, "/v1/adapters/style/unload", json{{"version", 2}});
  ASSERT_EQ(un.status, 200) << un.raw;
  EXPECT_EQ(un.body["unloaded_versions"], json::array({2}));
  EXPECT_EQ(versions("style")["versions"].size(), 1u);
  EXPECT_EQ(complete({{"adapter", "style"}, {"adapter_version", 2}}, prompt).status, 400);
  EXPECT_EQ(text_of(complete({{"adapter", "style"}}, prompt)), v1);
  Reply all = post(*c_, "/v1/adapters/style/unload", std::string());
  ASSERT_EQ(all.status, 200) << all.raw;
  EXPECT_TRUE(versions("style").is_null());
  expect_openai_error(complete({{"model", "stories260K:style"}}, prompt), 404, "model_not_found");
}

TEST_F(ServeAdapters, StagingPrefillsHotPrefixesThatServeRequestsOnceItIsPublished) {
  ASSERT_EQ(post(*c_, "/v1/adapters/load", json{{"name", "warm"}}).status, 200);
  const json on_v1 = {{"model", "stories260K:warm"}};
  const Reply first = complete(on_v1, kLong, 8);
  ASSERT_EQ(first.status, 200) << first.raw;
  const Reply second = complete(on_v1, kLong, 8);  // its prompt's chunks are reused: hot
  ASSERT_EQ(second.status, 200) << second.raw;
  const int64_t hot = cached_of(second);
  ASSERT_GE(hot, 48) << second.raw;
  const std::string answer_v1 = text_of(second);

  const double tokens0 = metric("ebb_stale_prefill_tokens_total");
  const double done0 = metric("ebb_stale_prefill_tasks_total{outcome=\"completed\"}");
  ASSERT_GE(tokens0, 0);
  synth(dir_->file("warm.gguf"), 6);
  Reply st = post(*c_, "/v1/adapters/warm/stage", std::string());
  ASSERT_EQ(st.status, 200) << st.raw;
  EXPECT_EQ(st.body["version"], 2);
  EXPECT_GE(st.body["stale_prefill_tasks"].get<int>(), 1) << st.raw;
  // The tasks run when no request does.
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (metric("ebb_stale_prefill_tasks_running") != 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(metric("ebb_stale_prefill_tasks_running"), 0);
  EXPECT_GE(metric("ebb_stale_prefill_tasks_total{outcome=\"completed\"}") - done0, 1);
  EXPECT_GE(metric("ebb_stale_prefill_tokens_total") - tokens0, static_cast<double>(hot));

  // Requests on version 1 are unaffected.
  const Reply still = complete(on_v1, kLong, 8);
  EXPECT_EQ(text_of(still), answer_v1);
  EXPECT_EQ(cached_of(still), hot);

  // Published: a plain request takes the prefilled KV and answers as a
  // recompute (another namespace, nothing cached) and `ebb run` do.
  ASSERT_EQ(post(*c_, "/v1/adapters/warm/publish", json{{"version", 2}}).status, 200);
  const Reply hit = complete(on_v1, kLong, 8);
  ASSERT_EQ(hit.status, 200) << hit.raw;
  EXPECT_EQ(cached_of(hit), hot) << hit.raw;
  json fresh = on_v1;
  fresh["cache_namespace"] = "recompute";
  const Reply recompute = complete(fresh, kLong, 8);
  EXPECT_EQ(cached_of(recompute), 0) << recompute.raw;
  EXPECT_EQ(text_of(hit), text_of(recompute));
  EXPECT_NE(text_of(hit), answer_v1);
  EXPECT_EQ(ebb_run(dir_->file("warm.gguf"), kLong, 8), text_of(hit) + "\n");
}

TEST_F(ServeAdapters, MetricsCountAdaptersAndOperations) {
  ASSERT_EQ(post(*c_, "/v1/adapters/load", json{{"name", "other"}}).status, 200);
  EXPECT_GE(metric("ebb_adapters_loaded"), 1);
  EXPECT_GE(metric("ebb_adapter_versions_loaded{state=\"published\"}"), 1);
  EXPECT_GE(metric("ebb_adapter_operations_total{op=\"load\"}"), 1);
  for (const char* m : {"ebb_adapter_versions_loaded{state=\"staged\"}", "ebb_adapter_operations_total{op=\"stage\"}",
                        "ebb_adapter_operations_total{op=\"publish\"}", "ebb_adapter_operations_total{op=\"unload\"}",
                        "ebb_stale_prefill_tasks_total{outcome=\"submitted\"}", "ebb_stale_prefill_tasks_running",
                        "ebb_stale_prefill_tokens_total", "ebb_stale_prefill_chunks_total"})
    EXPECT_GE(metric(m), 0) << m;
}

TEST(ServeAdaptersAlone, WithoutAnAdapterDirLoadingOverHttpIsRefused) {
  ServerProcess server({"--quiet"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  auto c = client(server.port(), /*with_key=*/false);
  Reply r = post(*c, "/v1/adapters/load", json{{"name", "style"}});
  expect_openai_error(r, 403, "no_adapter_dir");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("--adapter-dir"), std::string::npos) << r.raw;
  Reply l = get(*c, "/v1/adapters");
  EXPECT_EQ(l.status, 200) << l.raw;
  EXPECT_EQ(l.body["data"], json::array());
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
