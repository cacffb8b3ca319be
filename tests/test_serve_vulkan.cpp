// ebb serve on a Vulkan device (--device vulkan): completions give the CPU
// server's greedy text, /v1/memory says what the device holds, several
// choices of one prompt (its KV copied on the device) and cached prompt
// tokens (the prefix cache's chunks kept on the host, runtime/device_kv.h),
// wholly on the device and on a split of the layers.
// Skips without a Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>
#include <string>

#include "serve_support.h"
#include "support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using nlohmann::json;

TEST(ServeVulkan, CompletionsMemoryChoicesAndCachedTokens) {
  EBB_REQUIRE_VULKAN(be);
  test::ServerProcess cpu({}), gpu({"--device", "vulkan"});
  ASSERT_GT(cpu.port(), 0) << cpu.first_line();
  ASSERT_GT(gpu.port(), 0) << gpu.first_line() << gpu.err();
  auto cc = test::client(cpu.port()), gc = test::client(gpu.port());
  const json req = {{"prompt", "Lily"}, {"max_tokens", 12}, {"temperature", 0}};
  const test::Reply want = test::post(*cc, "/v1/completions", req);
  const test::Reply got = test::post(*gc, "/v1/completions", req);
  ASSERT_EQ(want.status, 200) << want.raw;
  ASSERT_EQ(got.status, 200) << got.raw;
  EXPECT_EQ(got.body["choices"][0]["text"], want.body["choices"][0]["text"]);
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"max_tokens", 6}};
  EXPECT_EQ(test::post(*gc, "/v1/chat/completions", chat).status, 200);
  const test::Reply mem = test::get(*gc, "/v1/memory");
  ASSERT_EQ(mem.status, 200) << mem.raw;
  const json& d = mem.body["device"];
  EXPECT_EQ(d["id"], be->info().id);
  EXPECT_GT(d["weights"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["total"].get<uint64_t>(),
            d["weights"].get<uint64_t>() + d["globals"].get<uint64_t>() + d["kv"].get<uint64_t>() +
                d["adapters"].get<uint64_t>() + d["scratch"].get<uint64_t>());
  EXPECT_GE(d["ledger"]["buffer_bytes"].get<uint64_t>(), d["total"].get<uint64_t>());
  EXPECT_EQ(mem.body["footprint"]["weights"].get<uint64_t>(), 0u) << "the layers are on the device";
  EXPECT_GT(mem.body["layers"][0]["device_weights_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(test::get(*cc, "/v1/memory").body["device"]["id"], "cpu");
  // n = 2: two choices of one prefill (the prompt's KV copied on the
  // device), greedy ones identical and equal to n = 1's; a request that
  // starts the same reports cached prompt tokens (whole chunks of 16).
  const std::string text =
      "Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day.";
  const json story = {{"prompt", text}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  json two = story;
  two["n"] = 2;
  const test::Reply r2 = test::post(*gc, "/v1/completions", two);
  ASSERT_EQ(r2.status, 200) << r2.raw;
  ASSERT_EQ(r2.body["choices"].size(), 2u) << r2.raw;
  EXPECT_EQ(r2.body["choices"][0]["text"], r2.body["choices"][1]["text"]);
  const test::Reply r1 = test::post(*gc, "/v1/completions", story);
  ASSERT_EQ(r1.status, 200) << r1.raw;
  EXPECT_EQ(r1.body["choices"][0]["text"], r2.body["choices"][0]["text"]);
  EXPECT_EQ(r1.body["choices"][0]["text"], test::post(*cc, "/v1/completions", story).body["choices"][0]["text"]);
  const int64_t cached = r1.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  EXPECT_GE(cached, 16) << r1.raw;
  EXPECT_LT(cached, r1.body["usage"]["prompt_tokens"].get<int64_t>());
}

// On a split (-ngl 2 of stories260K's 5 layers: the first 3 on the CPU):
// several choices of one prompt (the CPU layers' KV shared, the device
// layers' copied on the device) and cached prompt tokens (the prefix cache
// on, its chunks holding both sides' rows), with the CPU server's text.
TEST(ServeVulkan, OnASplitChoicesAndCachedTokens) {
  EBB_REQUIRE_VULKAN(be);
  test::ServerProcess cpu({}), split({"-ngl", "2"});
  ASSERT_GT(cpu.port(), 0) << cpu.first_line();
  ASSERT_GT(split.port(), 0) << split.first_line() << split.err();
  auto cc = test::client(cpu.port()), sc = test::client(split.port());
  const std::string text =
      "Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day.";
  const json story = {{"prompt", text}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  json two = story;
  two["n"] = 2;
  const test::Reply r2 = test::post(*sc, "/v1/completions", two);
  ASSERT_EQ(r2.status, 200) << r2.raw;
  ASSERT_EQ(r2.body["choices"].size(), 2u) << r2.raw;
  EXPECT_EQ(r2.body["choices"][0]["text"], r2.body["choices"][1]["text"]);
  const test::Reply r1 = test::post(*sc, "/v1/completions", story);
  ASSERT_EQ(r1.status, 200) << r1.raw;
  EXPECT_EQ(r1.body["choices"][0]["text"], r2.body["choices"][0]["text"]);
  EXPECT_EQ(r1.body["choices"][0]["text"], test::post(*cc, "/v1/completions", story).body["choices"][0]["text"]);
  const int64_t cached = r1.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  EXPECT_GE(cached, 16) << r1.raw;
  EXPECT_LT(cached, r1.body["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(split.err().find("prefix cache is not supported"), std::string::npos) << split.err();
}

// A random rank-4 adapter for stories260K whose greedy answers differ from the base model's.
void synth(const std::string& out, int seed) {
  const test::CliResult r = test::run_cli("adapter synth -m " + test::model_path("stories260K.gguf") +
                                          " --rank 4 --b-std 0.2 --seed " + std::to_string(seed) + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
}

// The memory routes on a device server: a limit below what it holds
// answers 200 and drops device layers, /v1/memory shows the device's held
// bytes under it and the dropped layers, a completion under it gives the
// same greedy text, a limit no step could run under is a 400 naming the
// sizes, and "off" then a restore bring every layer back; evict works too.
TEST(ServeVulkan, MemoryLimitEvictAndRestoreOnTheDevice) {
  EBB_REQUIRE_VULKAN(be);
  test::ServerProcess gpu({"--device", "vulkan"});
  ASSERT_GT(gpu.port(), 0) << gpu.first_line() << gpu.err();
  auto c = test::client(gpu.port());
  const json req = {{"prompt", "Lily"}, {"max_tokens", 12}, {"temperature", 0}};
  const test::Reply want = test::post(*c, "/v1/completions", req);
  ASSERT_EQ(want.status, 200) << want.raw;
  json m = test::get(*c, "/v1/memory").body;
  EXPECT_EQ(m["elastic"], true);
  EXPECT_EQ(m["memory_limit"].get<uint64_t>(), 0u);
  const uint64_t held = m["device"]["held"].get<uint64_t>(), weights = m["device"]["weights"].get<uint64_t>();
  uint64_t layer = 0;
  for (const json& l : m["layers"]) layer = std::max(layer, l["device_weights_bytes"].get<uint64_t>());
  ASSERT_GT(layer, 0u);
  // Room for the window (a layer and its host copy), one more layer and the KV.
  const uint64_t limit = held - weights + 3 * layer + (64u << 10);
  ASSERT_LT(limit, held);
  const test::Reply r = test::post(*c, "/v1/memory/limit", json{{"bytes", limit}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["memory_limit"].get<uint64_t>(), limit);
  EXPECT_GT(r.body["evict"]["weights_dropped"].get<int64_t>(), 0) << r.raw;
  EXPECT_GT(r.body["evict"]["freed"].get<uint64_t>(), 0u) << r.raw;
  m = test::get(*c, "/v1/memory").body;
  EXPECT_EQ(m["memory_limit"].get<uint64_t>(), limit);
  EXPECT_LE(m["device"]["held"].get<uint64_t>(), limit);
  EXPECT_GT(m["device"]["weights_dropped"].get<uint64_t>(), 0u);
  const test::Reply got = test::post(*c, "/v1/completions", req);
  ASSERT_EQ(got.status, 200) << got.raw;
  EXPECT_EQ(got.body["choices"][0]["text"], want.body["choices"][0]["text"]);
  m = test::get(*c, "/v1/memory").body;
  EXPECT_LE(m["device"]["held"].get<uint64_t>(), limit);
  const test::Reply tiny = test::post(*c, "/v1/memory/limit", json{{"bytes", 1}});
  EXPECT_EQ(tiny.status, 400) << tiny.raw;
  EXPECT_NE(tiny.raw.find("the smallest limit is"), std::string::npos) << tiny.raw;
  EXPECT_EQ(test::get(*c, "/v1/memory").body["memory_limit"].get<uint64_t>(), limit) << "the refused limit changed nothing";
  ASSERT_EQ(test::post(*c, "/v1/memory/limit", json{{"bytes", "off"}}).status, 200);
  const test::Reply back = test::post(*c, "/v1/memory/restore", json::object());
  ASSERT_EQ(back.status, 200) << back.raw;
  EXPECT_GT(back.body["restored_bytes"].get<uint64_t>(), 0u) << back.raw;
  m = test::get(*c, "/v1/memory").body;
  EXPECT_EQ(m["memory_limit"].get<uint64_t>(), 0u);
  EXPECT_EQ(m["device"]["weights_dropped"].get<uint64_t>(), 0u);
  EXPECT_EQ(m["device"]["weights"].get<uint64_t>(), weights);
  const test::Reply ev = test::post(*c, "/v1/memory/evict", json{{"fraction", 0.5}});
  ASSERT_EQ(ev.status, 200) << ev.raw;
  EXPECT_GT(ev.body["freed"].get<uint64_t>(), 0u) << ev.raw;
  EXPECT_GT(test::get(*c, "/v1/memory").body["device"]["weights_dropped"].get<uint64_t>(), 0u);
  const test::Reply after = test::post(*c, "/v1/completions", req);
  ASSERT_EQ(after.status, 200) << after.raw;
  EXPECT_EQ(after.body["choices"][0]["text"], want.body["choices"][0]["text"]);
}

// Adapters per request on the device: a request binding one gets the CPU
// server's greedy text (not the base model's), one binding none the base
// text; a new version staged and published is what the next request runs
// (the device uploads it and frees the old one); unloaded, the device
// holds no adapter bytes after the next step.
TEST(ServeVulkan, AdaptersPerRequestAndNewVersions) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vk-adapters");
  synth(dir.file("style.gguf"), 1);
  test::ServerProcess cpu({"--adapter-dir", dir.path(), "--quiet"}),
      gpu({"--adapter-dir", dir.path(), "--quiet", "--device", "vulkan"});
  ASSERT_GT(cpu.port(), 0) << cpu.first_line();
  ASSERT_GT(gpu.port(), 0) << gpu.first_line() << gpu.err();
  auto cc = test::client(cpu.port()), gc = test::client(gpu.port());
  auto text = [](httplib::Client& c, const json& extra) {
    json req = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
    for (auto it = extra.begin(); it != extra.end(); ++it) req[it.key()] = it.value();
    const test::Reply r = test::post(c, "/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.status == 200 ? r.body["choices"][0]["text"].get<std::string>() : std::string();
  };
  for (httplib::Client* c : {cc.get(), gc.get()})
    ASSERT_EQ(test::post(*c, "/v1/adapters/load", json{{"name", "style"}}).status, 200);
  const json style = {{"adapter", "style"}};
  const std::string v1 = text(*gc, style), base = text(*gc, json::object());
  EXPECT_EQ(v1, text(*cc, style));
  EXPECT_EQ(base, text(*cc, json::object()));
  EXPECT_NE(v1, base);
  // Version 2: the file changes, is staged and published on both.
  synth(dir.file("style.gguf"), 2);
  for (httplib::Client* c : {cc.get(), gc.get()}) {
    const test::Reply st = test::post(*c, "/v1/adapters/style/stage", std::string());
    ASSERT_EQ(st.status, 200) << st.raw;
    ASSERT_EQ(st.body["version"], 2);
    ASSERT_EQ(test::post(*c, "/v1/adapters/style/publish", json{{"version", 2}}).status, 200);
  }
  const std::string v2 = text(*gc, style);
  EXPECT_EQ(v2, text(*cc, style));
  EXPECT_NE(v2, v1);
  json d = test::get(*gc, "/v1/memory").body["device"];
  EXPECT_GT(d["adapters"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["total"].get<uint64_t>(), d["weights"].get<uint64_t>() + d["globals"].get<uint64_t>() +
                                            d["kv"].get<uint64_t>() + d["adapters"].get<uint64_t>() +
                                            d["scratch"].get<uint64_t>());
  ASSERT_EQ(test::post(*gc, "/v1/adapters/style/unload", std::string()).status, 200);
  EXPECT_EQ(text(*gc, json::object()), base);
  d = test::get(*gc, "/v1/memory").body["device"];
  EXPECT_EQ(d["adapters"].get<uint64_t>(), 0u);
}

// Online learning on a device engine (serve --learn): training runs on the
// CPU over the GGUF's mapping, each committed version is published, and the
// agent's next request runs it on the device (its trace names the version);
// a rollback is what the request after it runs.
TEST(ServeVulkan, LearningPublishesVersionsTheDeviceRuns) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vk-learn");
  test::ServerProcess s({"--ctx", "256", "--quiet", "--state-dir", dir.path(), "--learn", "--learn-gate", "off",
                         "--learn-min-samples", "2", "--learn-steps", "2", "--commit-every", "1", "--device", "vulkan"});
  ASSERT_GT(s.port(), 0) << s.first_line() << s.err();
  auto c = test::client(s.port());
  ASSERT_EQ(test::post(*c, "/v1/agents", json{{"name", "teller"}, {"adapter", "names"}, {"learn", true}}).status, 200);
  auto story = [&](int seed) {
    const test::Reply r = test::post(*c, "/v1/completions",
                                     json{{"model", "stories260K:agent/teller"}, {"prompt", "Once upon a time"},
                                          {"max_tokens", 12}, {"seed", seed}});
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.status == 200 ? r.body["id"].get<std::string>() : std::string();
  };
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(test::post(*c, "/v1/feedback", json{{"id", story(20 + i)}, {"reward", 1.0 + i}}).status, 200);
  json l;
  for (int i = 0; i < 1500; ++i) {  // up to 30 s
    l = test::get(*c, "/v1/learning").body;
    const json& a = l["agents"]["teller"];
    if (l["committed_versions"] == 2 && l["gates_pending"] == 0 && (a["round"].is_null() || a["round"]["state"] != "running"))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(l["published"]["names"], 2) << l.dump();
  EXPECT_EQ(test::get(*c, "/v1/learning/traces/" + story(30)).body["adapter_version"], 2);
  EXPECT_GT(test::get(*c, "/v1/memory").body["device"]["adapters"].get<uint64_t>(), 0u);
  ASSERT_EQ(test::post(*c, "/v1/learning/rollback", json{{"adapter", "names"}, {"version", 1}}).status, 200);
  EXPECT_EQ(test::get(*c, "/v1/learning/traces/" + story(31)).body["adapter_version"], 1);
}

}  // namespace
}  // namespace ebb
