// ebb serve's agents and online learning loop (serve/server_agents.cpp,
// serve/server_learning.cpp), over loopback on stories260K: agent CRUD and
// its persistence across a restart (and a corrupt agents file), traces read
// back after kill -9, a corrupt or foreign trace database moved aside,
// feedback attributed to its own trace, the gate rejecting a version that
// got worse, rollback, and the whole loop learning a name from corrections
// through the official openai client (tests/openai_client_agents.mjs).
// Every wait is bounded.
#include <gtest/gtest.h>

#include <signal.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <fstream>
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

std::vector<std::string> args(const std::string& state_dir, std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--api-key", test::kKey, "--ctx", "256", "--quiet", "--state-dir", state_dir};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

Reply send(httplib::Client& c, const char* method, const std::string& path, const json& body = nullptr) {
  httplib::Result res = std::string(method) == "PATCH"    ? c.Patch(path, body.dump(), "application/json")
                        : std::string(method) == "DELETE" ? c.Delete(path)
                                                          : c.Post(path, body.dump(), "application/json");
  Reply r;
  if (!res) {
    ADD_FAILURE() << method << " " << path << ": no answer";
    return r;
  }
  r.status = res->status;
  r.raw = res->body;
  r.body = json::parse(res->body, nullptr, false);
  return r;
}

// Polls GET /v1/learning until done(it) or the limit.
json poll_learning(httplib::Client& c, const std::function<bool(const json&)>& done, std::chrono::seconds limit = 30s) {
  return test::poll_get(c, "/v1/learning", done, limit, 20ms);
}

// No round running or waiting to start.
bool idle(const json& l, const std::string& agent) {
  if (!l["agents"].contains(agent)) return true;
  const json& a = l["agents"][agent];
  return l["gates_pending"] == 0 && (a["round"].is_null() || a["round"]["state"] != "running");
}

// A story of agent `agent`: {id, text}.
std::pair<std::string, std::string> story(httplib::Client& c, const std::string& agent, int seed, int max_tokens = 40) {
  const Reply r = post(c, "/v1/completions",
                       json{{"model", "stories260K:agent/" + agent}, {"prompt", "Once upon a time"},
                            {"max_tokens", max_tokens}, {"seed", seed}});
  EXPECT_EQ(r.status, 200) << r.raw;
  if (r.status != 200) return {};
  return {r.body["id"].get<std::string>(), r.body["choices"][0]["text"].get<std::string>()};
}

// Agents: create (checked field by field), list, get, update, delete; they
// survive a restart; an unreadable agents file is moved aside.
TEST(ServeAgents, CrudAndPersistence) {
  test::TempDir dir("ebb-serve-agents");
  {
    ServerProcess s(args(dir.path()));
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    Reply r = post(*c, "/v1/agents",
                   json{{"name", "planner"}, {"role", "planner"}, {"system_prompt", "You plan."}, {"namespace", "team-a"},
                        {"tools", {"search"}}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["name"], "planner");
    EXPECT_EQ(r.body["namespace"], "team-a");
    EXPECT_EQ(r.body["adapter_policy"], "none");
    r = post(*c, "/v1/agents", json{{"name", "critic"}, {"adapter", "crit"}, {"adapter_version", 3}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["adapter_policy"], "pinned");
    EXPECT_EQ(r.body["namespace"], "agent/critic");

    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "planner"}}), 409, "agent_exists");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "bad name!"}}), 400, "", "name");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"role", "x"}}), 400, "", "name");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "x"}, {"colour", "red"}}), 400, "", "colour");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "x"}, {"learn", "yes"}}), 400, "", "learn");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "x"}, {"learn", true}}), 400, "", "adapter");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "x"}, {"adapter_version", 2}}), 400, "",
                              "adapter_version");
    test::expect_openai_error(post(*c, "/v1/agents", json{{"name", "x"}, {"feedback", "loud"}}), 400, "", "feedback");
    test::expect_openai_error(get(*c, "/v1/agents/nobody"), 404, "agent_not_found");

    r = send(*c, "PATCH", "/v1/agents/planner", json{{"system_prompt", "You plan carefully."}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["system_prompt"], "You plan carefully.");
    EXPECT_EQ(r.body["namespace"], "team-a");  // untouched fields stay
    test::expect_openai_error(send(*c, "PATCH", "/v1/agents/planner", json{{"name", "other"}}), 400, "", "name");
    test::expect_openai_error(send(*c, "PATCH", "/v1/agents/nobody", json{{"role", "x"}}), 404, "agent_not_found");
    r = post(*c, "/v1/agents/critic", json{{"role", "critic"}});  // POST updates as PATCH does
    ASSERT_EQ(r.status, 200) << r.raw;
    r = post(*c, "/v1/agents", json{{"name", "gone"}});
    ASSERT_EQ(r.status, 200);
    r = send(*c, "DELETE", "/v1/agents/gone");
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["deleted"], true);
    test::expect_openai_error(send(*c, "DELETE", "/v1/agents/gone"), 404, "agent_not_found");

    // A request naming an agent: unknown is a 404; one whose pinned adapter
    // is not loaded is a 404 naming the adapter; a plain agent serves.
    test::expect_openai_error(
        post(*c, "/v1/completions", json{{"model", "stories260K:agent/nobody"}, {"prompt", "Once"}, {"max_tokens", 2}}),
        404, "agent_not_found", "model");
    test::expect_openai_error(
        post(*c, "/v1/chat/completions",
             json{{"agent", "nobody"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}),
        404, "agent_not_found", "agent");
    test::expect_openai_error(
        post(*c, "/v1/completions", json{{"agent", "critic"}, {"prompt", "Once"}, {"max_tokens", 2}}), 404,
        "adapter_not_found", "agent");
    test::expect_openai_error(post(*c, "/v1/completions",
                                   json{{"agent", "planner"}, {"adapter", "x"}, {"prompt", "Once"}, {"max_tokens", 2}}),
                              400, "", "adapter");
    test::expect_openai_error(
        post(*c, "/v1/completions",
             json{{"agent", "planner"}, {"cache_namespace", "n"}, {"prompt", "Once"}, {"max_tokens", 2}}),
        400, "", "cache_namespace");
    r = post(*c, "/v1/chat/completions",
             json{{"model", "stories260K:agent/planner"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                  {"max_tokens", 4}});
    EXPECT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(s.stop(SIGTERM), 0);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("agents.json.tmp")));
  {
    ServerProcess s(args(dir.path()));
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    const Reply r = get(*c, "/v1/agents");
    ASSERT_EQ(r.status, 200) << r.raw;
    ASSERT_EQ(r.body["data"].size(), 2u) << r.raw;
    EXPECT_EQ(r.body["data"][0]["name"], "critic");
    EXPECT_EQ(r.body["data"][0]["role"], "critic");
    EXPECT_EQ(r.body["data"][0]["adapter_version"], 3);
    EXPECT_EQ(r.body["data"][1]["name"], "planner");
    EXPECT_EQ(r.body["data"][1]["system_prompt"], "You plan carefully.");
    EXPECT_EQ(r.body["data"][1]["tools"], json::array({"search"}));
    EXPECT_EQ(s.stop(SIGKILL), 128 + SIGKILL);  // what was written stays written
  }
  {
    std::ofstream(dir.file("agents.json")) << "{\"format\": \"ebb-agents\", \"agents\": [{\"name\": ";
    ServerProcess s(args(dir.path()));
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    Reply r = get(*c, "/v1/agents");
    ASSERT_EQ(r.status, 200);
    EXPECT_TRUE(r.body["data"].empty());
    r = get(*c, "/v1/learning");
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.body["notes"].size(), 1u) << r.raw;
    EXPECT_NE(r.body["notes"][0].get<std::string>().find("moved to"), std::string::npos) << r.raw;
    bool aside = false;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      aside = aside || e.path().filename().string().rfind("agents.json.corrupt-", 0) == 0;
    EXPECT_TRUE(aside);
    EXPECT_EQ(post(*c, "/v1/agents", json{{"name", "fresh"}}).status, 200);
  }
}

// Creates a learning agent; adapter `adapter`.
void learning_agent(httplib::Client& c, const std::string& name, const std::string& adapter) {
  const Reply r = post(c, "/v1/agents", json{{"name", name}, {"adapter", adapter}, {"learn", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
}

// Every turn of a learning agent is a trace: written off the decode path,
// committed, and read back after kill -9 with its token ids and text.
TEST(ServeLearning, TracesSurviveKill9) {
  test::TempDir dir("ebb-serve-traces");
  std::vector<std::pair<std::string, std::string>> turns;
  std::vector<int> prompt_ids;
  {
    ServerProcess s(args(dir.path(), {"--learn"}));
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    learning_agent(*c, "teller", "names");
    post(*c, "/v1/agents", json{{"name", "quiet"}});  // not learning: no traces
    for (int i = 0; i < 3; ++i) turns.push_back(story(*c, "teller", 10 + i));
    story(*c, "quiet", 1);
    const Reply tk = post(*c, "/tokenize", json{{"content", "Once upon a time"}, {"add_special", true}});
    ASSERT_EQ(tk.status, 200);
    prompt_ids = tk.body["tokens"].get<std::vector<int>>();
    const json l = poll_learning(*c, [](const json& j) { return j["traces"] == 3; });
    EXPECT_EQ(l["traces_recorded"], 3);
    EXPECT_EQ(l["traces_dropped"], 0);
    EXPECT_EQ(s.stop(SIGKILL), 128 + SIGKILL);
  }
  ServerProcess s(args(dir.path(), {"--learn"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  const Reply l = get(*c, "/v1/learning");
  EXPECT_EQ(l.body["traces"], 3) << l.raw;
  EXPECT_TRUE(l.body["notes"].empty()) << l.raw;
  for (const auto& [id, text] : turns) {
    const Reply t = get(*c, "/v1/learning/traces/" + id);
    ASSERT_EQ(t.status, 200) << t.raw;
    EXPECT_EQ(t.body["agent"], "teller");
    EXPECT_EQ(t.body["adapter"], "names");
    EXPECT_TRUE(t.body["adapter_version"].is_null());  // no version yet: the base model ran
    EXPECT_EQ(t.body["text"], text);
    EXPECT_EQ(t.body["prompt_token_ids"].get<std::vector<int>>(), prompt_ids);
    EXPECT_EQ(t.body["token_ids"].size(), 40u);
    const Reply d = post(*c, "/detokenize", json{{"tokens", t.body["token_ids"]}});
    EXPECT_EQ(d.body["content"], text);  // the sampled ids are the text's
    EXPECT_GE(t.body["ttft_s"].get<double>(), 0.0);
    EXPECT_TRUE(t.body["feedback"].is_null());
  }
  test::expect_openai_error(get(*c, "/v1/learning/traces/cmpl-none-1"), 404, "trace_not_found");
}

// An agent's system prompt goes before a chat that has none, and not before
// one that has its own (seen in the traces' prompt token ids).
TEST(ServeLearning, TheAgentsSystemPromptComesFirst) {
  test::TempDir dir("ebb-serve-system");
  ServerProcess s(args(dir.path(), {"--learn"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  ASSERT_EQ(post(*c, "/v1/agents",
                 json{{"name", "teller"}, {"adapter", "n"}, {"learn", true}, {"system_prompt", "Tell of dragons."}})
                .status,
            200);
  const auto prompt_of = [&](const json& messages) {
    const Reply r = post(*c, "/v1/chat/completions",
                         json{{"agent", "teller"}, {"messages", messages}, {"max_tokens", 2}});
    EXPECT_EQ(r.status, 200) << r.raw;
    const Reply t = get(*c, "/v1/learning/traces/" + r.body.value("id", std::string("none")));
    EXPECT_EQ(t.status, 200) << t.raw;
    return post(*c, "/detokenize", json{{"tokens", t.body["prompt_token_ids"]}}).body["content"].get<std::string>();
  };
  const std::string with = prompt_of(json::array({{{"role", "user"}, {"content", "A story?"}}}));
  EXPECT_NE(with.find("Tell of dragons."), std::string::npos) << with;
  EXPECT_LT(with.find("Tell of dragons."), with.find("A story?")) << with;
  const std::string own = prompt_of(json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "A story?"}}}));
  EXPECT_EQ(own.find("dragons"), std::string::npos) << own;
  EXPECT_NE(own.find("Be brief."), std::string::npos) << own;
}

// A trace database that is not one, or another program's, is moved aside and
// a fresh one serves; the server says so and does not crash.
TEST(ServeLearning, CorruptOrForeignDatabaseIsMovedAside) {
  for (const std::string kind : {"garbage", "foreign"}) {
    SCOPED_TRACE(kind);
    test::TempDir dir("ebb-serve-baddb");
    const std::string db = dir.file("traces.sqlite");
    if (kind == "garbage") {
      std::ofstream(db) << std::string(8192, 'x');
    } else {
      sqlite3* h = nullptr;
      ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
      ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE songs (title TEXT); INSERT INTO songs VALUES ('x');", nullptr, nullptr,
                             nullptr),
                SQLITE_OK);
      sqlite3_close(h);
    }
    ServerProcess s(args(dir.path(), {"--learn"}));
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    learning_agent(*c, "teller", "names");
    story(*c, "teller", 1, 4);
    const json l = poll_learning(*c, [](const json& j) { return j["traces"] == 1; });
    ASSERT_EQ(l["notes"].size(), 1u) << l.dump();
    const std::string note = l["notes"][0];
    EXPECT_NE(note.find(kind == "garbage" ? "not a database" : "another program's"), std::string::npos) << note;
    EXPECT_NE(note.find("fresh one"), std::string::npos) << note;
    int aside = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      aside += e.path().filename().string().rfind("traces.sqlite.bad-", 0) == 0 &&
               e.path().filename().string().find('-', 18) == std::string::npos;
    EXPECT_EQ(aside, 1);
  }
}

// Feedback lands on the trace of the response it names; bad feedback is a
// 400 naming the field, an unknown id a 404, and none without --learn.
TEST(ServeLearning, FeedbackAttachesToItsTrace) {
  test::TempDir dir("ebb-serve-feedback");
  ServerProcess s(args(dir.path(), {"--learn", "--learn-min-samples", "1000"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  learning_agent(*c, "a", "ad-a");
  learning_agent(*c, "b", "ad-b");
  const auto a1 = story(*c, "a", 1, 8), b1 = story(*c, "b", 2, 8), a2 = story(*c, "a", 3, 8);
  Reply r = post(*c, "/v1/feedback", json{{"id", b1.first}, {"reward", 0.5}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["agent"], "b");
  EXPECT_EQ(r.body["applied"], true);
  EXPECT_EQ(r.body["weight"], 0.5);  // the first reward: baseline 0
  r = post(*c, "/v1/feedback", json{{"id", a2.first}, {"rating", "down"}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["agent"], "a");
  EXPECT_EQ(get(*c, "/v1/learning/traces/" + b1.first).body["feedback"]["reward"], 0.5);
  EXPECT_EQ(get(*c, "/v1/learning/traces/" + b1.first).body["feedback"]["source"], "client");
  EXPECT_EQ(get(*c, "/v1/learning/traces/" + a2.first).body["feedback"]["reward"], -1.0);
  EXPECT_TRUE(get(*c, "/v1/learning/traces/" + a1.first).body["feedback"].is_null());
  // A second reward of agent b: its advantage is against b's baseline (0.5), not a's.
  const auto b2 = story(*c, "b", 4, 8);
  r = post(*c, "/v1/feedback", json{{"id", b2.first}, {"reward", 1.5}});
  EXPECT_EQ(r.body["weight"], 1.0) << r.raw;
  EXPECT_EQ(get(*c, "/v1/learning").body["feedback"], 3);

  test::expect_openai_error(post(*c, "/v1/feedback", json{{"id", "cmpl-none-9"}, {"reward", 1}}), 404,
                            "trace_not_found", "id");
  test::expect_openai_error(post(*c, "/v1/feedback", json{{"id", a1.first}, {"reward", 1}, {"correction", "x"}}), 400);
  test::expect_openai_error(post(*c, "/v1/feedback", json{{"id", a1.first}}), 400, "", "reward");
  test::expect_openai_error(post(*c, "/v1/feedback", json{{"id", a1.first}, {"reward", "lots"}}), 400, "", "reward");
  test::expect_openai_error(post(*c, "/v1/feedback", json{{"id", a1.first}, {"rating", 9}}), 400, "", "rating");
  test::expect_openai_error(post(*c, "/v1/feedback", json{{"id", a1.first}, {"stars", 1}}), 400, "", "stars");
  test::expect_openai_error(post(*c, "/v1/feedback", json{{"reward", 1}}), 400, "", "id");

  ServerProcess off(args(dir.path() + "/off"));
  ASSERT_GT(off.port(), 0);
  auto c2 = client(off.port());
  test::expect_openai_error(post(*c2, "/v1/feedback", json{{"id", a1.first}, {"reward", 1}}), 400, "learning_off");
}

// Rewards below the baseline push the agent's own stories away: the round's
// version is worse on the held-back story and the gate keeps it unpublished.
TEST(ServeLearning, GateRejectsAWorseVersion) {
  test::TempDir dir("ebb-serve-gate");
  ServerProcess s(args(dir.path(), {"--learn", "--learn-min-samples", "3", "--learn-lr", "0.05", "--learn-steps", "8"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  learning_agent(*c, "teller", "names");
  // One seed: every turn tells the same story. The first, rewarded, is held
  // back; the next three are punished (advantages -2, -1, -2/3).
  for (int i = 0; i < 4; ++i) {
    const auto t = story(*c, "teller", 7, 24);
    const Reply r = post(*c, "/v1/feedback", json{{"id", t.first}, {"reward", i == 0 ? 1.0 : -1.0}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["heldout"], i == 0);
    EXPECT_EQ(r.body["weight"].get<double>() < 0, i > 0);
  }
  const json l = poll_learning(*c, [](const json& j) { return j["committed_versions"] == 1 && idle(j, "teller"); });
  ASSERT_EQ(l["versions"].size(), 1u) << l.dump();
  const json& v = l["versions"][0];
  EXPECT_EQ(v["gate"], "rejected") << l.dump();
  EXPECT_GT(v["heldout_loss"].get<double>(), v["heldout_loss_published"].get<double>()) << l.dump();
  EXPECT_TRUE(v["gated_against"].is_null());  // against the base model
  EXPECT_EQ(l["published_versions"], 0);
  EXPECT_EQ(l["rejected_versions"], 1);
  EXPECT_TRUE(l["published"].empty()) << l.dump();
  EXPECT_EQ(l["train_steps"], 8);
  // The agent still serves, on the base model.
  const auto t = story(*c, "teller", 8, 4);
  EXPECT_TRUE(get(*c, "/v1/learning/traces/" + t.first).body["adapter_version"].is_null());
}

// A round of several commits whose first version fails its gate: the
// rejected version goes (the agent stays on the base model) and the round
// goes on; its later versions are gated against the base model, never with
// an error (a version the next commit replaced before its gate began is
// "superseded"), and no rejected version is ever served.
TEST(ServeLearning, ARejectedFirstVersionLeavesTheRoundsNextCommitsGatedNormally) {
  test::TempDir dir("ebb-serve-gate-first");
  ServerProcess s(args(dir.path(), {"--learn", "--learn-min-samples", "3", "--learn-lr", "0.05", "--learn-steps", "8",
                                    "--commit-every", "2"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  learning_agent(*c, "teller", "names");
  // As in GateRejectsAWorseVersion: the held-back story rewarded, the
  // punished ones make every version worse on it.
  for (int i = 0; i < 4; ++i) {
    const auto t = story(*c, "teller", 7, 24);
    ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", t.first}, {"reward", i == 0 ? 1.0 : -1.0}}).status, 200);
  }
  const json l = poll_learning(*c, [](const json& j) { return j["committed_versions"] == 4 && idle(j, "teller"); });
  ASSERT_EQ(l["versions"].size(), 4u) << l.dump();
  EXPECT_EQ(l["versions"][0]["gate"], "rejected") << l.dump();
  int gated = 0;
  for (const json& v : l["versions"]) {
    const std::string g = v["gate"].get<std::string>();
    EXPECT_EQ(g.find("error"), std::string::npos) << l.dump();
    EXPECT_TRUE(g == "rejected" || g == "superseded") << l.dump();
    if (g == "rejected") {
      ++gated;
      EXPECT_TRUE(v["gated_against"].is_null()) << "no version passed: against the base model; " << l.dump();
    }
  }
  EXPECT_GE(gated, 2) << "the round's last version is gated too; " << l.dump();
  EXPECT_EQ(l["published_versions"], 0);
  EXPECT_TRUE(l["published"].empty()) << l.dump();
  EXPECT_EQ(l["train_steps"], 8);
  const auto t = story(*c, "teller", 8, 4);
  EXPECT_TRUE(get(*c, "/v1/learning/traces/" + t.first).body["adapter_version"].is_null());
}

// With the gate off every version is published; rollback publishes an
// earlier one again, and the agent's next turn runs on it.
TEST(ServeLearning, Rollback) {
  test::TempDir dir("ebb-serve-rollback");
  ServerProcess s(args(dir.path(), {"--learn", "--learn-gate", "off", "--learn-min-samples", "2", "--learn-steps", "2",
                                    "--commit-every", "1"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  learning_agent(*c, "teller", "names");
  for (int i = 0; i < 3; ++i) {
    const auto t = story(*c, "teller", 20 + i, 16);
    ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", t.first}, {"reward", 1.0 + i}}).status, 200);
  }
  const json l = poll_learning(*c, [](const json& j) { return j["committed_versions"] == 2 && idle(j, "teller"); });
  EXPECT_EQ(l["published_versions"], 2) << l.dump();
  EXPECT_EQ(l["published"]["names"], 2) << l.dump();
  EXPECT_EQ(l["versions"][0]["gate"], "off");
  auto t = story(*c, "teller", 30, 4);
  EXPECT_EQ(get(*c, "/v1/learning/traces/" + t.first).body["adapter_version"], 2);

  Reply r = post(*c, "/v1/learning/rollback", json{{"adapter", "names"}, {"version", 1}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(get(*c, "/v1/learning").body["published"]["names"], 1);
  EXPECT_EQ(get(*c, "/v1/learning").body["rollbacks"], 1);
  t = story(*c, "teller", 31, 4);
  EXPECT_EQ(get(*c, "/v1/learning/traces/" + t.first).body["adapter_version"], 1);
  test::expect_openai_error(post(*c, "/v1/learning/rollback", json{{"adapter", "names"}, {"version", 9}}), 404,
                            "adapter_not_found", "version");
  test::expect_openai_error(post(*c, "/v1/learning/rollback", json{{"adapter", "nope"}, {"version", 1}}), 404,
                            "adapter_not_found", "adapter");
  test::expect_openai_error(post(*c, "/v1/learning/rollback", json{{"adapter", "names"}}), 400, "", "version");
}

// ebb serve --judge: the judge of agents that name none (their "judge" is
// null), checked at start (a bad value is a usage error, exit 2); an agent
// that names its own keeps it.
TEST(ServeLearning, AServerWideJudgeAppliesToAgentsThatNameNone) {
  test::TempDir dir("ebb-serve-default-judge");
  const std::string model = test::model_path("stories260K.gguf");
  const std::string serve = "serve -m " + model + " --learn --state-dir " + dir.path() + " --port 0 ";
  test::CliResult bad = test::run_cli(serve + "--judge oracle");
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_NE(bad.err.find("--judge"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("judge.kind"), std::string::npos) << bad.err;
  bad = test::run_cli(serve + "--judge prompt:" + dir.path() + "/missing.txt");
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_NE(bad.err.find("missing.txt"), std::string::npos) << bad.err;
  const std::string bad_tmpl = dir.path() + "/bad.txt", good_tmpl = dir.path() + "/judge.txt";
  std::ofstream(bad_tmpl) << "Score {answer}: ";
  bad = test::run_cli(serve + "--judge prompt:" + bad_tmpl);
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_NE(bad.err.find("judge.prompt"), std::string::npos) << bad.err;
  bad = test::run_cli("serve -m " + model + " --port 0 --judge client");
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_NE(bad.err.find("--judge needs --learn"), std::string::npos) << bad.err;

  // --judge client: a correction to an agent without a judge trains nothing;
  // one that names the rule judge takes it.
  {
    ServerProcess s(args(dir.path() + "/a", {"--learn", "--learn-min-samples", "1000", "--judge", "client"}));
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    Reply r = post(*c, "/v1/agents", json{{"name", "plain"}, {"adapter", "p"}, {"learn", true}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_TRUE(r.body["judge"].is_null()) << r.raw;  // the server's
    r = post(*c, "/v1/agents", json{{"name", "ruled"}, {"adapter", "q"}, {"learn", true}, {"judge", "rule"}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["judge"]["kind"], "rule");
    const auto tp = story(*c, "plain", 1, 8), tr = story(*c, "ruled", 1, 8);
    r = post(*c, "/v1/feedback", json{{"id", tp.first}, {"correction", "Once upon a time there was a cat."}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["applied"], false) << r.raw;
    EXPECT_NE(r.body["reason"].get<std::string>().find("client"), std::string::npos) << r.raw;
    r = post(*c, "/v1/feedback", json{{"id", tr.first}, {"correction", "Once upon a time there was a cat."}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["applied"], true) << r.raw;
  }
  // --judge prompt:FILE: the file's template scores an agent's correction
  // in the background.
  std::ofstream(good_tmpl) << "Story: {response}\nThe reader said: {feedback}\nScore from 0 to 9: ";
  ServerProcess s(args(dir.path() + "/b", {"--learn", "--learn-min-samples", "1000", "--judge", "prompt:" + good_tmpl}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  learning_agent(*c, "teller", "names");
  const auto t = story(*c, "teller", 2, 8);
  const Reply r = post(*c, "/v1/feedback", json{{"id", t.first}, {"correction", "call her Zorba, not Lily"}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["judging"], true) << r.raw;
  const json l = poll_learning(*c, [](const json& j) { return j["judge_calls"] == 1 && j["judge_pending"] == 0; });
  ASSERT_EQ(l["judges"].size(), 1u) << l.dump();
  EXPECT_EQ(l["judges"][0]["id"], t.first);
}

// A judge prompt (judge.kind "prompt") scores feedback that has no reward:
// /v1/feedback answers at once (judging), the call runs in the background
// on the scheduler, its answer forced to a digit by the judge's grammar,
// and the score lands on the right trace as a reward (source "judge").
// An answer with no score is a judge failure, in /v1/learning and
// /metrics, and trains nothing. Bad judges are 400s naming the field.
TEST(ServeLearning, JudgePromptScoresFeedbackInTheBackground) {
  test::TempDir dir("ebb-serve-judge");
  ServerProcess s(args(dir.path(), {"--learn", "--learn-min-samples", "1000"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  const std::string tmpl = "Story: {response}\nThe reader said: {feedback}\nScore from 0 to 9: ";
  Reply r = post(*c, "/v1/agents",
                 json{{"name", "teller"}, {"adapter", "names"}, {"learn", true},
                      {"judge", {{"kind", "prompt"}, {"prompt", tmpl}, {"grammar", "root ::= [0-9]"}, {"max_tokens", 2}}}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["judge"]["kind"], "prompt");
  EXPECT_EQ(r.body["judge"]["grammar"], "root ::= [0-9]");
  const auto t1 = story(*c, "teller", 1, 12), t2 = story(*c, "teller", 2, 12);
  r = post(*c, "/v1/feedback", json{{"id", t2.first}, {"correction", "call her Zorba, not Lily"}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["judging"], true) << r.raw;
  EXPECT_EQ(r.body["applied"], false);
  json l = poll_learning(*c, [](const json& j) { return j["judge_calls"] == 1 && j["judge_pending"] == 0; });
  EXPECT_EQ(l["judge_failures"], 0) << l.dump();
  ASSERT_EQ(l["judges"].size(), 1u) << l.dump();
  const json& jc = l["judges"][0];
  EXPECT_EQ(jc["id"], t2.first);
  EXPECT_EQ(jc["foreground_active_at_start"], 0);  // foreground-first
  ASSERT_TRUE(jc["answer"].is_string()) << jc.dump();
  const std::string answer = jc["answer"];
  ASSERT_EQ(answer.size(), 1u) << answer;
  ASSERT_TRUE(answer[0] >= '0' && answer[0] <= '9') << answer;
  const double reward = (answer[0] - '0' - 5) / 5.0;
  EXPECT_DOUBLE_EQ(jc["reward"].get<double>(), reward);
  // The reward is on the trace the feedback named, the correction kept; the other has none.
  const json fb = get(*c, "/v1/learning/traces/" + t2.first).body["feedback"];
  EXPECT_DOUBLE_EQ(fb["reward"].get<double>(), reward) << fb.dump();
  EXPECT_EQ(fb["source"], "judge");
  EXPECT_EQ(fb["correction"], "call her Zorba, not Lily");
  EXPECT_TRUE(get(*c, "/v1/learning/traces/" + t1.first).body["feedback"].is_null());
  EXPECT_EQ(l["feedback"], 1);  // the judge's score is that feedback, not more
  EXPECT_EQ(l["agents"]["teller"]["rewards"], 1);  // the baseline took the score
  EXPECT_EQ(jc["applied"], reward != 0.0) << jc.dump();  // a first reward of 0 has advantage 0
  EXPECT_EQ(test::metric_value(*c, "ebb_learning_judge_calls_total"), 1);

  // A judge whose grammar forces letters: no score, a failure, no sample.
  r = post(*c, "/v1/agents",
           json{{"name", "odd"}, {"adapter", "odd"}, {"learn", true},
                {"judge", {{"kind", "prompt"}, {"prompt", tmpl}, {"grammar", "root ::= [a-z] [a-z] [a-z]"}}}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const auto t3 = story(*c, "odd", 3, 12);
  const int64_t samples = l["samples"];
  ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", t3.first}, {"correction", "better"}}).status, 200);
  l = poll_learning(*c, [](const json& j) { return j["judge_calls"] == 2 && j["judge_pending"] == 0; });
  EXPECT_EQ(l["judge_failures"], 1) << l.dump();
  EXPECT_EQ(l["samples"], samples);
  EXPECT_EQ(l["judges"][1]["ok"], false);
  EXPECT_EQ(l["judges"][1]["answer"].get<std::string>().size(), 3u);
  EXPECT_NE(l["last_error"].get<std::string>().find("no score"), std::string::npos) << l.dump();
  EXPECT_TRUE(get(*c, "/v1/learning/traces/" + t3.first).body["feedback"]["reward"].is_null());
  EXPECT_EQ(test::metric_value(*c, "ebb_learning_judge_failures_total"), 1);
  // A rewarded feedback is not judged: the reward trains as given.
  r = post(*c, "/v1/feedback", json{{"id", t1.first}, {"reward", 2.0}});
  EXPECT_EQ(r.body["judging"], false) << r.raw;
  EXPECT_EQ(r.body["applied"], true) << r.raw;

  // Bad judges: 400 naming the field.
  const auto bad = [&](const json& judge, const char* param) {
    const Reply b = post(*c, "/v1/agents", json{{"name", "bad"}, {"judge", judge}});
    test::expect_openai_error(b, 400, "", param);
  };
  bad({{"kind", "oracle"}}, "judge.kind");
  bad({{"kind", "prompt"}}, "judge.prompt");
  bad({{"kind", "prompt"}, {"prompt", "{story}"}}, "judge.prompt");
  bad({{"kind", "prompt"}, {"prompt", "{response}"}, {"grammar", "root ::= ("}}, "judge.grammar");
  bad({{"kind", "prompt"}, {"prompt", "{response}"}, {"max_tokens", 0}}, "judge.max_tokens");
  bad({{"kind", "rule"}, {"temperature", 1}}, "judge.temperature");
}

// The learning state survives kill -9: the versions with their gates, the
// published version per adapter (here one rolled back to), the counters,
// the replay buffer and baseline; the published version's weights are
// served again (the same greedy story). A weight file that is not one is
// left out with a note, never a crash.
TEST(ServeLearning, StateSurvivesKill9) {
  test::TempDir dir("ebb-serve-state");
  const std::vector<std::string> a = args(dir.path(), {"--learn", "--learn-gate", "off", "--learn-min-samples", "2",
                                                       "--learn-steps", "2", "--commit-every", "1"});
  json before;
  std::string text;
  {
    ServerProcess s(a);
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    learning_agent(*c, "teller", "names");
    for (int i = 0; i < 3; ++i) {
      const auto t = story(*c, "teller", 20 + i, 16);
      ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", t.first}, {"reward", 1.0 + i}}).status, 200);
    }
    poll_learning(*c, [](const json& j) { return j["committed_versions"] == 2 && idle(j, "teller"); });
    ASSERT_EQ(post(*c, "/v1/learning/rollback", json{{"adapter", "names"}, {"version", 1}}).status, 200);
    const auto t = story(*c, "teller", 40, 24);
    text = t.second;
    EXPECT_EQ(get(*c, "/v1/learning/traces/" + t.first).body["adapter_version"], 1);
    before = poll_learning(*c, [](const json& j) { return j["state"]["saved"] == true; });
    EXPECT_EQ(s.stop(SIGKILL), 128 + SIGKILL);
  }
  ASSERT_EQ(before["published"]["names"], 1) << before.dump();
  ASSERT_EQ(before["versions"].size(), 2u) << before.dump();
  const auto same = [&](const json& after) {
    for (const char* k : {"feedback", "samples", "train_steps", "committed_versions", "published_versions",
                          "rejected_versions", "rollbacks", "published", "versions"})
      EXPECT_EQ(after[k], before[k]) << k;
    for (const char* k : {"replay", "heldout", "baseline", "rewards", "rounds"})
      EXPECT_EQ(after["agents"]["teller"][k], before["agents"]["teller"][k]) << k;
  };
  {
    ServerProcess s(a);
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    const json after = get(*c, "/v1/learning").body;
    same(after);
    EXPECT_EQ(after["state"]["restored"]["adapter_versions_loaded"], 2) << after.dump();
    EXPECT_TRUE(after["notes"].empty()) << after.dump();
    const auto t = story(*c, "teller", 40, 24);
    EXPECT_EQ(t.second, text);  // the published version serves again
    EXPECT_EQ(get(*c, "/v1/learning/traces/" + t.first).body["adapter_version"], 1);
    EXPECT_EQ(s.stop(SIGKILL), 128 + SIGKILL);
  }
  // Version 2's weights damaged: it is left out, said so; version 1 serves.
  std::ofstream(dir.file("learned/names/v2.gguf"), std::ios::trunc) << "not a gguf file";
  ServerProcess s(a);
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  const json after = get(*c, "/v1/learning").body;
  ASSERT_EQ(after["notes"].size(), 1u) << after.dump();
  EXPECT_NE(after["notes"][0].get<std::string>().find("version 2 was not restored"), std::string::npos) << after.dump();
  EXPECT_EQ(after["published"]["names"], 1);
  EXPECT_EQ(story(*c, "teller", 40, 24).second, text);
}

// The whole loop learns something real, through the official openai client:
// an agent whose user corrects the heroine's name in its stories ("call her
// Zorba, not Lily") names Zorba in at least half of its stories after a
// bounded number of feedback turns, while serving, without a restart.
TEST(ServeLearning, LearnsANameFromCorrections) {
  test::TempDir dir("ebb-serve-zorba");
  ServerProcess s(args(dir.path(), {"--learn"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  const test::ScriptRun run = test::run_openai_script("openai_client_agents.mjs", s.port());
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("ok: learned"), std::string::npos) << run.out;
  std::printf("%s", run.out.c_str());
}

}  // namespace
}  // namespace ebb
