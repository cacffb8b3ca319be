// ebb serve's memory routes (GET /v1/memory, /v1/memory/history; POST
// /v1/memory/{evict,restore,limit,trim}) and the page at /, driven over
// loopback: the JSON's shape and sums, eviction by fraction freeing about
// that much while greedy answers stay the same, restore, the limit, Android's
// trim levels, 400s naming the field, the API key, metrics, budget mode's
// refusal, and the page rendered by headless Chromium before and after an
// eviction.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "serve_support.h"
#include "support.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using ebb::test::client;
using ebb::test::expect_openai_error;
using ebb::test::get;
using ebb::test::kKey;
using ebb::test::metric_value;
using ebb::test::post;
using ebb::test::Reply;
using ebb::test::ServerProcess;

const json kGreedy = {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};

uint64_t u64(const json& j, const char* key) { return j.at(key).get<uint64_t>(); }

// Every KV chunk's and weight unit's state chars in GET /v1/memory.
std::string all_states(const json& m) {
  std::string s;
  for (const json& L : m["layers"]) s += L["weights_char"].get<std::string>() + L["kv"].get<std::string>();
  return s;
}

class ServeMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ebb::test::TempDir("ebb-serve-memory");
    server_ = new ServerProcess({"--api-key", kKey, "--ctx", "256", "--swap-dir", dir_->path(), "--quiet"});
    ASSERT_GT(server_->port(), 0) << "no port in the server's first line: '" << server_->first_line() << "'";
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->stop(SIGTERM), 0);
    }
    delete server_;
    delete dir_;
    server_ = nullptr;
    dir_ = nullptr;
  }
  // Each test starts with no limit and everything in RAM.
  void SetUp() override {
    ASSERT_TRUE(server_ && server_->port() > 0);
    c_ = client(server_->port());
    ASSERT_EQ(post(*c_, "/v1/memory/limit", json{{"bytes", 0}}).status, 200);
    ASSERT_EQ(post(*c_, "/v1/memory/restore", json::object()).status, 200);
  }
  int port() const { return server_->port(); }

  json memory() {
    const Reply r = get(*c_, "/v1/memory");
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body;
  }
  std::string complete() {
    const Reply r = post(*c_, "/v1/completions", kGreedy);
    EXPECT_EQ(r.status, 200) << r.raw;
    if (r.status != 200) return "";
    return r.body["choices"][0]["text"].get<std::string>();
  }

  static ebb::test::TempDir* dir_;
  static ServerProcess* server_;
  std::unique_ptr<httplib::Client> c_;
};
ebb::test::TempDir* ServeMemory::dir_ = nullptr;
ServerProcess* ServeMemory::server_ = nullptr;

TEST_F(ServeMemory, TheJsonHasEveryCategoryAndItsTotalsAddUp) {
  complete();  // the prefix cache holds KV chunks now
  const json m = memory();
  EXPECT_EQ(m["object"], "memory");
  EXPECT_EQ(m["elastic"], true);
  EXPECT_EQ(m["memory_limit"], 0);
  const json& f = m["footprint"];
  for (const char* k : {"weights", "globals", "kv", "kv_spare", "scratch", "compressed", "io_buffers", "adapters",
                        "training", "kv_stored", "weights_stored", "total"})
    ASSERT_TRUE(f.contains(k) && f[k].is_number_unsigned()) << k << " in " << m.dump();
  // The request's last, partial chunks were kept for the next request (for
  // 2 s of idle time).
  EXPECT_GT(u64(f, "kv_spare"), 0u);
  // The total is what is in RAM: every category but the two on storage.
  EXPECT_EQ(u64(f, "total"), u64(f, "weights") + u64(f, "globals") + u64(f, "kv") + u64(f, "kv_spare") +
                                 u64(f, "scratch") + u64(f, "compressed") + u64(f, "io_buffers") + u64(f, "adapters") +
                                 u64(f, "training"));
  const json& s = m["by_state"];
  EXPECT_EQ(u64(s, "resident") + u64(s, "compressed") + u64(s, "working"), u64(f, "total"));
  EXPECT_EQ(u64(s, "stored"), u64(f, "kv_stored") + u64(f, "weights_stored"));
  // Per layer: the bytes add up to the categories, and the map has a state per unit.
  ASSERT_EQ(m["layers"].size(), 5u);  // stories260K
  uint64_t w = 0, kv = 0;
  size_t chunks = 0;
  for (const json& L : m["layers"]) {
    w += u64(L, "weights_bytes");
    kv += u64(L, "kv_bytes");
    EXPECT_GT(u64(L, "weights_bytes"), 0u);
    EXPECT_EQ(L["weights"], "resident");
    EXPECT_EQ(L["weights_char"], "#");
    const std::string states = L["kv"].get<std::string>();
    chunks += states.size();
    EXPECT_EQ(states, std::string(states.size(), '#'));
  }
  EXPECT_EQ(w, u64(f, "weights"));
  EXPECT_EQ(kv, u64(f, "kv"));
  EXPECT_GT(chunks, 0u);
  EXPECT_GT(kv, 0u);
  EXPECT_EQ(m["states"]["#"], "resident");
  EXPECT_EQ(m["states"]["c"], "compressed");
  EXPECT_EQ(m["states"]["s"], "stored");
  EXPECT_NE(m["grid"].get<std::string>().find("L00 W |"), std::string::npos) << m["grid"];
  for (const char* k : {"evictions", "restores", "evicted_bytes", "restored_bytes", "trims"})
    EXPECT_TRUE(m["counters"].contains(k)) << k;
}

TEST_F(ServeMemory, EvictByFractionFreesAboutThatMuchAndAnswersStayTheSame) {
  const std::string before_text = complete();
  ASSERT_FALSE(before_text.empty());
  const json m0 = memory();
  const uint64_t total0 = u64(m0["footprint"], "total");
  uint64_t max_unit = 0;
  for (const json& L : m0["layers"]) max_unit = std::max({max_unit, u64(L, "weights_bytes"), u64(L, "kv_bytes")});

  const Reply e = post(*c_, "/v1/memory/evict", json{{"fraction", 0.25}});
  ASSERT_EQ(e.status, 200) << e.raw;
  EXPECT_EQ(e.body["object"], "memory.evict");
  EXPECT_EQ(u64(e.body, "footprint_before"), total0);
  const uint64_t asked = u64(e.body, "requested");
  EXPECT_NEAR(static_cast<double>(asked), 0.25 * static_cast<double>(total0), 1.0);
  const uint64_t freed = u64(e.body, "freed");
  // At least what was asked, and not more than one more unit.
  EXPECT_GE(freed, asked) << e.raw;
  EXPECT_LE(freed, asked + max_unit) << e.raw;
  EXPECT_LE(u64(e.body, "footprint_after"), total0 - asked) << e.raw;

  const json m1 = memory();
  EXPECT_LE(u64(m1["footprint"], "total"), total0 - asked);
  const std::string states = all_states(m1);
  EXPECT_NE(states.find_first_not_of('#'), std::string::npos) << "no unit shows as evicted: " << m1["grid"];
  EXPECT_EQ(m1["restore_pending"], true);

  // The next completion restores what it needs and answers the same.
  EXPECT_EQ(complete(), before_text);
  const json m2 = memory();
  EXPECT_EQ(u64(m2["footprint"], "weights_stored"), 0u) << m2["grid"];
  for (const json& L : m2["layers"]) EXPECT_EQ(L["weights"], "resident") << m2["grid"];
  const std::string after = all_states(m2);
  EXPECT_EQ(after, std::string(after.size(), '#')) << m2["grid"];
}

TEST_F(ServeMemory, EvictingEverythingThenRestoringBringsEveryUnitBack) {
  const std::string text = complete();
  const json m0 = memory();
  const uint64_t w0 = u64(m0["footprint"], "weights"), kv0 = u64(m0["footprint"], "kv");

  const Reply e = post(*c_, "/v1/memory/evict", json{{"bytes", "100%"}});
  ASSERT_EQ(e.status, 200) << e.raw;
  const json m1 = memory();
  EXPECT_EQ(u64(m1["footprint"], "weights"), 0u) << m1["grid"];
  EXPECT_EQ(u64(m1["footprint"], "weights_stored"), w0);
  EXPECT_EQ(u64(m1["footprint"], "kv"), 0u) << m1["grid"];
  for (const json& L : m1["layers"]) EXPECT_EQ(L["weights"], "stored");
  EXPECT_EQ(all_states(m1).find('#'), std::string::npos) << m1["grid"];

  const Reply r = post(*c_, "/v1/memory/restore", json::object());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["object"], "memory.restore");
  EXPECT_EQ(r.body["weights_loaded"], 5);
  EXPECT_GE(u64(r.body, "restored_bytes"), w0 + kv0);
  const json m2 = memory();
  EXPECT_EQ(u64(m2["footprint"], "weights"), w0);
  EXPECT_EQ(u64(m2["footprint"], "kv"), kv0);
  EXPECT_EQ(u64(m2["footprint"], "weights_stored"), 0u);
  EXPECT_EQ(u64(m2["footprint"], "kv_stored"), 0u);
  EXPECT_EQ(u64(m2["footprint"], "compressed"), 0u);
  const std::string states = all_states(m2);
  EXPECT_EQ(states, std::string(states.size(), '#')) << m2["grid"];
  EXPECT_EQ(complete(), text);

  // Nothing evicted: restore says so.
  const Reply again = post(*c_, "/v1/memory/restore", std::string());
  ASSERT_EQ(again.status, 200) << again.raw;
  EXPECT_EQ(u64(again.body, "restored_bytes"), 0u);
  EXPECT_NE(again.body["note"].get<std::string>().find("nothing is evicted"), std::string::npos) << again.raw;
}

TEST_F(ServeMemory, ALimitEvictsDownToItAnswersStayTheSameAndOffRemovesIt) {
  const std::string text = complete();
  const json m0 = memory();
  const uint64_t w0 = u64(m0["footprint"], "weights");
  // Half of the weights and KV: layers that do not fit are streamed.
  const Reply l = post(*c_, "/v1/memory/limit", json{{"bytes", "50%"}});
  ASSERT_EQ(l.status, 200) << l.raw;
  EXPECT_EQ(l.body["object"], "memory.limit");
  const uint64_t limit = u64(l.body, "memory_limit");
  EXPECT_GT(limit, 0u);
  EXPECT_LT(limit, w0 + u64(m0["footprint"], "kv"));
  EXPECT_GT(u64(l.body["evict"], "freed"), 0u) << l.raw;
  EXPECT_LE(u64(l.body["evict"]["after"], "in_ram"), limit) << l.raw;
  EXPECT_EQ(memory()["memory_limit"], limit);
  EXPECT_EQ(metric_value(*c_, "ebb_memory_limit_bytes"), static_cast<double>(limit));

  EXPECT_EQ(complete(), text);  // streamed layers give the same answer
  const json m1 = memory();
  EXPECT_LT(u64(m1["footprint"], "weights"), w0) << "the limit let every layer back: " << m1.dump();

  const Reply off = post(*c_, "/v1/memory/limit", json{{"bytes", "off"}});
  ASSERT_EQ(off.status, 200) << off.raw;
  EXPECT_EQ(u64(off.body, "memory_limit"), 0u);
  EXPECT_EQ(complete(), text);
  const json m2 = memory();
  EXPECT_EQ(m2["memory_limit"], 0);
  EXPECT_EQ(u64(m2["footprint"], "weights"), w0) << m2["grid"];
  EXPECT_EQ(metric_value(*c_, "ebb_memory_limit_bytes"), 0);

  // A number of bytes works too.
  const Reply n = post(*c_, "/v1/memory/limit", json{{"bytes", w0}});
  ASSERT_EQ(n.status, 200) << n.raw;
  EXPECT_EQ(u64(n.body, "memory_limit"), w0);
}

TEST_F(ServeMemory, TrimLevelsEvictTheirShareOfTheFootprint) {
  complete();
  const double before = metric_value(*c_, "ebb_memory_trim_total{level=\"running_low\"}");
  ASSERT_GE(before, 0);
  const Reply t = post(*c_, "/v1/memory/trim", json{{"level", "running_low"}});
  ASSERT_EQ(t.status, 200) << t.raw;
  EXPECT_EQ(t.body["object"], "memory.trim");
  EXPECT_EQ(t.body["level"], 10);
  EXPECT_EQ(t.body["name"], "running_low");
  EXPECT_DOUBLE_EQ(t.body["fraction"].get<double>(), 0.25);
  const uint64_t total = u64(t.body, "footprint_before");
  EXPECT_NEAR(static_cast<double>(u64(t.body, "bytes")), 0.25 * static_cast<double>(total), 1.0);
  EXPECT_GE(u64(t.body["evict"], "freed"), u64(t.body, "bytes")) << t.raw;
  EXPECT_LT(u64(t.body, "footprint_after"), total);
  EXPECT_EQ(metric_value(*c_, "ebb_memory_trim_total{level=\"running_low\"}"), before + 1);

  // Numbers and Android's constant names work; complete gives back all it can.
  const Reply c = post(*c_, "/v1/memory/trim", json{{"level", 80}});
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["name"], "complete");
  EXPECT_DOUBLE_EQ(c.body["fraction"].get<double>(), 1.0);
  const json m = memory();
  EXPECT_EQ(u64(m["footprint"], "weights"), 0u) << m["grid"];
  const Reply named = post(*c_, "/v1/memory/trim", json{{"level", "TRIM_MEMORY_UI_HIDDEN"}});
  ASSERT_EQ(named.status, 200) << named.raw;
  EXPECT_EQ(named.body["level"], 20);
  EXPECT_DOUBLE_EQ(named.body["fraction"].get<double>(), 0.25);
}

TEST_F(ServeMemory, BadValuesAre400NamingTheField) {
  struct Case {
    const char* path;
    std::string body;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/memory/evict", "{}", "bytes"},
      {"/v1/memory/evict", R"({"bytes": 10, "fraction": 0.5})", "bytes"},
      {"/v1/memory/evict", R"({"fraction": 0})", "fraction"},
      {"/v1/memory/evict", R"({"fraction": 1.5})", "fraction"},
      {"/v1/memory/evict", R"({"fraction": "half"})", "fraction"},
      {"/v1/memory/evict", R"({"bytes": -5})", "bytes"},
      {"/v1/memory/evict", R"({"bytes": 0})", "bytes"},
      {"/v1/memory/evict", R"({"bytes": 1.5})", "bytes"},
      {"/v1/memory/evict", R"({"bytes": "lots"})", "bytes"},
      {"/v1/memory/evict", R"({"bytes": [1]})", "bytes"},
      {"/v1/memory/limit", "{}", "bytes"},
      {"/v1/memory/limit", R"({"bytes": "12 parsecs"})", "bytes"},
      {"/v1/memory/limit", R"({"bytes": -1})", "bytes"},
      {"/v1/memory/trim", "{}", "level"},
      {"/v1/memory/trim", R"({"level": 7})", "level"},
      {"/v1/memory/trim", R"({"level": "sideways"})", "level"},
      {"/v1/memory/trim", R"({"level": true})", "level"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.path) + " " + c.body);
    const Reply r = post(*c_, c.path, c.body);
    expect_openai_error(r, 400, "", c.param);
    // The message says what the field must be.
    EXPECT_NE(r.raw.find(c.param), std::string::npos) << r.raw;
  }
  expect_openai_error(post(*c_, "/v1/memory/evict", std::string("{not json")), 400, "invalid_json");
  expect_openai_error(post(*c_, "/v1/memory/evict", std::string("[1, 2]")), 400);
  expect_openai_error(get(*c_, "/v1/memory/history?since=yesterday"), 400, "", "since");
  // Nothing was evicted by any of them.
  EXPECT_EQ(u64(memory()["footprint"], "weights_stored"), 0u);
}

TEST_F(ServeMemory, TheApiKeyIsRequiredOnTheMemoryRoutesButNotThePage) {
  auto none = client(port(), /*with_key=*/false);
  expect_openai_error(get(*none, "/v1/memory"), 401, "invalid_api_key");
  expect_openai_error(get(*none, "/v1/memory/history"), 401, "invalid_api_key");
  for (const char* p : {"/v1/memory/evict", "/v1/memory/restore", "/v1/memory/limit", "/v1/memory/trim"})
    expect_openai_error(post(*none, p, json{{"fraction", 1.0}, {"bytes", 0}, {"level", 80}}.dump()), 401,
                        "invalid_api_key");
  auto wrong = client(port(), false);
  wrong->set_bearer_token_auth("not-the-key");
  expect_openai_error(post(*wrong, "/v1/memory/evict", json{{"fraction", 1.0}}), 401, "invalid_api_key");
  EXPECT_EQ(u64(memory()["footprint"], "weights_stored"), 0u) << "an unauthorized request evicted";

  // The page is static and open; it holds no data and loads nothing from elsewhere.
  auto page = none->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("connect-src 'self'"), std::string::npos);
  EXPECT_NE(page->body.find("<canvas"), std::string::npos);
  EXPECT_NE(page->body.find("/v1/memory/history"), std::string::npos);
  EXPECT_EQ(page->body.find("http://"), std::string::npos);
  EXPECT_EQ(page->body.find("https://"), std::string::npos);
  EXPECT_EQ(page->body.find(" src="), std::string::npos);
}

TEST_F(ServeMemory, MetricsCountEvictionsRestoresAndBytes) {
  complete();
  const double ev0 = metric_value(*c_, "ebb_memory_evictions_total{route=\"evict\"}");
  const double by0 = metric_value(*c_, "ebb_memory_evicted_bytes_total");
  const double re0 = metric_value(*c_, "ebb_memory_restores_total");
  const double rb0 = metric_value(*c_, "ebb_memory_restored_bytes_total");
  ASSERT_GE(ev0, 0);
  ASSERT_GE(by0, 0);
  ASSERT_GE(re0, 0);
  ASSERT_GE(rb0, 0);
  EXPECT_EQ(metric_value(*c_, "ebb_memory_elastic"), 1);
  const Reply e = post(*c_, "/v1/memory/evict", json{{"bytes", 100000}});
  ASSERT_EQ(e.status, 200) << e.raw;
  EXPECT_EQ(metric_value(*c_, "ebb_memory_evictions_total{route=\"evict\"}"), ev0 + 1);
  EXPECT_EQ(metric_value(*c_, "ebb_memory_evicted_bytes_total"), by0 + static_cast<double>(u64(e.body, "freed")));
  const Reply r = post(*c_, "/v1/memory/restore", json::object());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(metric_value(*c_, "ebb_memory_restores_total"), re0 + 1);
  EXPECT_EQ(metric_value(*c_, "ebb_memory_restored_bytes_total"),
            rb0 + static_cast<double>(u64(r.body, "restored_bytes")));
  EXPECT_GT(u64(r.body, "restored_bytes"), 0u);
  const json m = memory();
  EXPECT_GE(m["counters"]["evictions"].get<int64_t>(), 1);
  EXPECT_GE(m["counters"]["restores"].get<int64_t>(), 1);
}

TEST_F(ServeMemory, HistoryHasASampleASecondWithMemoryByStateAndLoad) {
  std::this_thread::sleep_for(2500ms);
  const Reply h = get(*c_, "/v1/memory/history");
  ASSERT_EQ(h.status, 200) << h.raw;
  EXPECT_EQ(h.body["object"], "memory.history");
  EXPECT_EQ(h.body["interval_s"], 1.0);
  EXPECT_EQ(h.body["capacity"], 600);
  const json& s = h.body["samples"];
  ASSERT_GE(s.size(), 2u) << h.raw;
  for (size_t i = 0; i < s.size(); ++i) {
    const json& x = s[i];
    EXPECT_EQ(u64(x, "total"), u64(x, "weights") + u64(x, "globals") + u64(x, "kv") + u64(x, "compressed") +
                                   u64(x, "other"));
    for (const char* k : {"kv_stored", "weights_stored", "tok_s", "decode_tok_s", "fg_waiting", "fg_running",
                          "bg_waiting", "generated_tokens"})
      EXPECT_TRUE(x.contains(k)) << k;
    if (i > 0) {
      const double dt = x["t"].get<double>() - s[i - 1]["t"].get<double>();
      EXPECT_GT(dt, 0.5);
      EXPECT_LT(dt, 3.0);
    }
  }
  // ?since gives only what came after.
  const double last = s.back()["t"].get<double>();
  const Reply later = get(*c_, "/v1/memory/history?since=" + std::to_string(last + 0.001));
  ASSERT_EQ(later.status, 200);
  EXPECT_LE(later.body["samples"].size(), 1u);
  for (const json& x : later.body["samples"]) EXPECT_GT(x["t"].get<double>(), last);
}

// Budget mode turns elastic memory off: the routes say so instead of evicting.
TEST(ServeMemoryBudget, ElasticMemoryOffIsAClearConflict) {
  ServerProcess server({"--memory-budget", "90%", "--ctx", "128", "--quiet"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  auto c = client(server.port(), false);
  const Reply m = get(*c, "/v1/memory");
  ASSERT_EQ(m.status, 200) << m.raw;
  EXPECT_EQ(m.body["elastic"], false);
  EXPECT_EQ(m.body["layers"].size(), 5u);
  for (const char* p : {"/v1/memory/evict", "/v1/memory/restore", "/v1/memory/trim"}) {
    SCOPED_TRACE(p);
    const Reply r = post(*c, p, json{{"fraction", 0.5}, {"level", 10}}.dump());
    expect_openai_error(r, 409, "elastic_memory_off");
    EXPECT_NE(r.raw.find("budget mode"), std::string::npos) << r.raw;
  }
  expect_openai_error(post(*c, "/v1/memory/limit", json{{"bytes", "1MiB"}}), 409, "elastic_memory_off");
  EXPECT_EQ(metric_value(*c, "ebb_memory_elastic"), 0);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// ---- the page, rendered by headless Chromium ----

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

// The DOM after the page's script ran for `budget_ms` of virtual time.
std::string dump_dom(const std::string& chromium, const std::string& url, const std::string& profile_dir,
                     int budget_ms = 4000) {
  const std::string cmd = "timeout 60 " + chromium +
                          " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run"
                          " --disable-extensions --user-data-dir=" +
                          profile_dir + " --virtual-time-budget=" + std::to_string(budget_ms) + " --dump-dom '" + url +
                          "' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[8192];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// Chromium missing is a failure, not a skip: scripts/setup.sh installs it.
TEST_F(ServeMemory, ThePageRendersTheResidencyMapAndShowsAnEviction) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty()) << "chromium is not installed: run scripts/setup.sh (apt-get install chromium)";
  complete();
  const json m0 = memory();
  size_t chunks = 0;
  for (const json& L : m0["layers"]) chunks += L["kv"].get<std::string>().size();
  ASSERT_GT(chunks, 0u);
  ebb::test::TempDir profile("ebb-chromium");
  const std::string url = "http://127.0.0.1:" + std::to_string(port()) + "/#key=" + kKey;

  const std::string before = dump_dom(chromium, url, profile.path());
  ASSERT_NE(before.find("id=\"residency\""), std::string::npos) << before.substr(0, 2000);
  EXPECT_EQ(before.find("class=\"err\""), std::string::npos) << "the page shows an error: " << before.substr(0, 4000);
  // A weight cell per layer and a cell per KV chunk, all resident.
  EXPECT_EQ(count(before, "class=\"cell w\""), 5u) << before.substr(0, 4000);
  EXPECT_EQ(count(before, "\" data-state=\"resident\""), 5u + chunks) << before.substr(0, 4000);
  EXPECT_EQ(count(before, "\" data-state=\"stored\""), 0u);
  EXPECT_NE(before.find("id=\"s-ram\">"), std::string::npos);
  EXPECT_NE(before.find("<canvas id=\"chart\""), std::string::npos);
  // Learning is off on this server: the panel says so and shows no numbers.
  EXPECT_NE(before.find("<div id=\"learning\" data-enabled=\"false\""), std::string::npos) << before.substr(0, 4000);
  EXPECT_NE(before.find("Learning is off: start ebb serve with --learn"), std::string::npos);
  EXPECT_EQ(count(before, "class=\"version\""), 0u);

  const Reply e = post(*c_, "/v1/memory/evict", json{{"fraction", 1.0}});
  ASSERT_EQ(e.status, 200) << e.raw;
  const std::string after = dump_dom(chromium, url, profile.path());
  // Every weight layer dropped (stored), every KV chunk compressed or stored.
  EXPECT_EQ(count(after, "class=\"cell w\" data-state=\"stored\""), 5u) << after.substr(0, 4000);
  EXPECT_EQ(count(after, "\" data-state=\"resident\""), 0u) << after.substr(0, 4000);
  EXPECT_EQ(count(after, "\" data-state=\"compressed\"") + count(after, "\" data-state=\"stored\"") +
                count(after, "\" data-state=\"stored-compressed\""),
            5u + chunks)
      << after.substr(0, 4000);

  // Without the key the page says it needs one (headless Chromium answers
  // the prompt with nothing) and shows no map.
  const std::string keyless = dump_dom(chromium, "http://127.0.0.1:" + std::to_string(port()) + "/", profile.path() + "-2");
  EXPECT_NE(keyless.find("class=\"err\""), std::string::npos) << keyless.substr(0, 3000);
  EXPECT_EQ(count(keyless, "class=\"cell"), 0u);
  std::filesystem::remove_all(profile.path() + "-2");
}

// The chat panel: ?demo=TEXT sends TEXT once the page has loaded; the
// answer streams in (a DOM update per delta) and ends; the memory map keeps
// its cells; the axis labels are distinct even before any sample.
TEST_F(ServeMemory, ThePageChatsWithStreamedAnswers) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty()) << "chromium is not installed: run scripts/setup.sh (apt-get install chromium)";
  ebb::test::TempDir profile("ebb-chromium-chat");
  const std::string url = "http://127.0.0.1:" + std::to_string(port()) + "/?demo=Once%20upon%20a%20time#key=" + kKey;
  const std::string dom = dump_dom(chromium, url, profile.path(), 8000);
  EXPECT_EQ(dom.find("class=\"err\""), std::string::npos) << "the page shows an error: " << dom.substr(0, 4000);
  EXPECT_NE(dom.find("<div class=\"msg user\">Once upon a time</div>"), std::string::npos) << dom.substr(0, 6000);
  const std::smatch m = [&] {
    std::smatch r;
    std::regex_search(dom, r, std::regex(R"re(<div class="msg assistant" data-chunks="([0-9]+)" data-done="([^"]*)">([^<]*)</div>)re"));
    return r;
  }();
  ASSERT_FALSE(m.empty()) << dom.substr(0, 6000);
  EXPECT_GT(std::stoi(m[1].str()), 1) << "the answer came in more than one delta";
  EXPECT_EQ(m[2].str(), "1") << "the stream ended with [DONE]";
  EXPECT_GE(m[3].str().size(), 8u) << m[3].str();
  // The choice lists the base model by its id.
  EXPECT_NE(dom.find("<option value=\"stories260K\">stories260K (base model)</option>"), std::string::npos)
      << dom.substr(0, 6000);
  // The map is drawn beside the chat; the stats line names the tokens.
  EXPECT_EQ(count(dom, "class=\"cell w\""), 5u);
  EXPECT_TRUE(std::regex_search(dom, std::regex(R"re(id="chat-stats">[0-9]+ tokens in )re"))) << dom.substr(0, 6000);
  EXPECT_NE(dom.find("live · "), std::string::npos);
  // Each chart's five axis labels are all different.
  for (const char* chart : {"chart", "load"}) {
    std::smatch l;
    ASSERT_TRUE(std::regex_search(dom, l, std::regex(std::string("<canvas id=\"") + chart + R"re(" [^>]*data-ylabels="([^"]*)")re")))
        << chart << dom.substr(0, 6000);
    std::vector<std::string> labels;
    std::stringstream in(l[1].str());
    for (std::string t; std::getline(in, t, '|');) labels.push_back(t);
    ASSERT_EQ(labels.size(), 5u) << l[1].str();
    EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()).size(), 5u) << chart << ": " << l[1].str();
  }
}

// The learning panel with --learn: after a few turns and their feedback
// (through the HTTP API: two versions committed and published, the gate
// off), the page shows the counts and versions GET /v1/learning reports;
// clicking "Roll back to v1" (/?click=rollback-names-1) publishes v1 again,
// and the panel shows it.
TEST(ServeLearningPage, ShowsTheLoopAndRollsBack) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty()) << "chromium is not installed: run scripts/setup.sh (apt-get install chromium)";
  ebb::test::TempDir dir("ebb-serve-learn-page");
  ServerProcess server({"--api-key", kKey, "--ctx", "256", "--quiet", "--state-dir", dir.path(), "--learn",
                        "--learn-gate", "off", "--learn-min-samples", "2", "--learn-steps", "2", "--commit-every", "1"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  auto c = client(server.port());
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "teller"}, {"adapter", "names"}, {"learn", true}}).status, 200);
  for (int i = 0; i < 3; ++i) {
    const Reply r = post(*c, "/v1/completions", json{{"model", "stories260K:agent/teller"}, {"prompt", "Once upon a time"},
                                                     {"max_tokens", 16}, {"seed", 20 + i}});
    ASSERT_EQ(r.status, 200) << r.raw;
    ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", r.body["id"]}, {"reward", 1.0 + i}}).status, 200);
  }
  json l;
  for (int i = 0; i < 1500; ++i) {  // 30 s at most
    l = get(*c, "/v1/learning").body;
    const json& round = l["agents"]["teller"]["round"];  // null between rounds
    const bool running = round.is_object() && round.value("state", "") == "running";
    if (l["committed_versions"] == 2 && l["gates_pending"] == 0 && !running) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(l["committed_versions"], 2) << l.dump();
  ASSERT_EQ(l["published"]["names"], 2) << l.dump();

  ebb::test::TempDir profile("ebb-chromium-learn");
  const std::string url =
      "http://127.0.0.1:" + std::to_string(server.port()) + "/?click=rollback-names-1#key=" + kKey;
  const std::string dom = dump_dom(chromium, url, profile.path());
  EXPECT_EQ(dom.find("class=\"err\""), std::string::npos) << "the page shows an error: " << dom.substr(0, 4000);
  const json after = get(*c, "/v1/learning").body;
  EXPECT_EQ(after["published"]["names"], 1) << after.dump();  // the click rolled back
  EXPECT_EQ(after["rollbacks"], 1);
  const size_t at = dom.find("<div id=\"learning\"");
  ASSERT_NE(at, std::string::npos) << dom.substr(0, 4000);
  const std::string panel = dom.substr(at, 12000);
  EXPECT_NE(panel.find("data-enabled=\"true\""), std::string::npos) << panel;
  const auto shown = [&](const std::string& id) {
    std::smatch m;
    if (!std::regex_search(panel, m, std::regex("id=\"" + id + "\">([^<]*)<"))) return std::string("(absent)");
    return m[1].str();
  };
  EXPECT_EQ(shown("l-traces"), std::to_string(after["traces"].get<int64_t>()));
  EXPECT_EQ(shown("l-feedback"), std::to_string(after["feedback"].get<int64_t>()));
  EXPECT_EQ(shown("l-steps"), std::to_string(after["train_steps"].get<int64_t>()));
  EXPECT_EQ(shown("l-versions"), "2 / 2 / 0");
  EXPECT_EQ(shown("l-rollbacks"), "1");
  EXPECT_EQ(shown("l-judge"), "0 / 0");
  EXPECT_EQ(shown("l-rewards"), std::to_string(after["agents"]["teller"]["rewards"].get<int64_t>()) + " / " +
                                    std::to_string(after["samples"].get<int64_t>()));
  // A row per version with its gate, v1 now the published one, and a
  // button to roll back to v2.
  EXPECT_EQ(count(panel, "class=\"version\""), 2u) << panel;
  EXPECT_NE(panel.find("data-adapter=\"names\" data-version=\"1\" data-gate=\"off\" data-current=\"1\""),
            std::string::npos) << panel;
  EXPECT_NE(panel.find("data-adapter=\"names\" data-version=\"2\" data-gate=\"off\" data-current=\"0\""),
            std::string::npos) << panel;
  EXPECT_NE(panel.find("id=\"rollback-names-2\""), std::string::npos) << panel;
  EXPECT_EQ(panel.find("id=\"rollback-names-1\""), std::string::npos) << panel;
  EXPECT_NE(panel.find("<td class=\"published-version\">1</td>"), std::string::npos) << panel;
  EXPECT_NE(panel.find("names: v1 published again"), std::string::npos) << panel;
}

}  // namespace
