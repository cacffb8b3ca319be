// ebb serve's handoffs (serve/server_handoffs.cpp): POST /v1/handoffs
// pre-prefills each target agent's prompt prefix through the server's
// scheduler, and the target's next request finds it in the prefix cache
// (usage.prompt_tokens_details.cached_tokens), with the same greedy text as
// without a handoff; a publish of the target's adapter re-plans it (the
// stale counter); bad bodies are refused naming the field. Over loopback on
// stories260K (KV chunks of 16); every wait is bounded (GET /v1/handoffs
// polled), nothing is timed.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
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

constexpr int64_t kChunk = 16;  // ServerProcess's --kv-chunk

const char* kSystem = "You are the tool agent. You look things up and say what you found, in few words.";
const char* kPlan =
    "Plan: first find the little girl named Lily who lost her red ball in the park, then ask her mom where the "
    "ball went, then tell the dog to bring it back home before the rain.";

// Polls GET /v1/handoffs until done(its body) or 30 s.
json poll_handoffs(httplib::Client& c, const std::function<bool(const json&)>& done) {
  return test::poll_get(c, "/v1/handoffs", done);
}

// Every task submitted so far has ended (the scheduler holds none of them).
bool tasks_ended(const json& h, int64_t submitted) {
  return h["stats"]["tasks_submitted"].get<int64_t>() >= submitted && h["stats"]["tasks_running"] == 0;
}

json chat_messages() {
  return json::array({{{"role", "user"}, {"content", kPlan}}});
}

// The agent's chat answer (greedy): {text, cached_tokens, prompt_tokens}.
struct Answer {
  std::string text;
  int64_t cached = -1, prompt = -1;
};
Answer chat(httplib::Client& c, const std::string& agent, const json& messages) {
  const Reply r = post(c, "/v1/chat/completions",
                       json{{"agent", agent}, {"messages", messages}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.raw;
  if (r.status != 200) return {};
  return {r.body["choices"][0]["message"]["content"].get<std::string>(),
          r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
          r.body["usage"]["prompt_tokens"].get<int64_t>()};
}

Answer complete(httplib::Client& c, const std::string& agent, const std::string& prompt) {
  const Reply r = post(c, "/v1/completions",
                       json{{"agent", agent}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.raw;
  if (r.status != 200) return {};
  return {r.body["choices"][0]["text"].get<std::string>(),
          r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
          r.body["usage"]["prompt_tokens"].get<int64_t>()};
}

std::vector<std::string> args(std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--api-key", test::kKey, "--ctx", "512", "--quiet"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// A handoff of chat messages to "tool": its next chat request with those
// messages finds the prefix (whole chunks) cached and answers what the
// same agent without a handoff answers ("twin": same system prompt, its own
// namespace, 0 cached). A completions prefix to "critic" the same way.
// GET /v1/handoffs and /metrics count it all.
TEST(ServeHandoffs, TheTargetsRequestFindsItsPrefixCached) {
  ServerProcess s(args());
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  for (const char* name : {"tool", "twin"})
    ASSERT_EQ(post(*c, "/v1/agents", json{{"name", name}, {"system_prompt", kSystem}}).status, 200);
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "critic"}}).status, 200);
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "planner"}}).status, 200);

  // Without a handoff: nothing cached.
  const Answer alone = chat(*c, "twin", chat_messages());
  EXPECT_EQ(alone.cached, 0);

  Reply r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"tool"}}, {"messages", chat_messages()}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["id"].get<std::string>().rfind("handoff-", 0), 0u) << r.raw;
  ASSERT_EQ(r.body["targets"].size(), 1u);
  const json& t = r.body["targets"][0];
  EXPECT_EQ(t["agent"], "tool");
  EXPECT_EQ(t["planned"], true) << r.raw;
  EXPECT_GT(t["priority"].get<double>(), 0);
  const int64_t prefix = t["tokens"].get<int64_t>();
  const int64_t whole = t["prefill_tokens"].get<int64_t>();
  EXPECT_EQ(whole, prefix / kChunk * kChunk);
  ASSERT_GE(whole, 2 * kChunk) << r.raw;
  json h = poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 1); });
  EXPECT_EQ(h["pending"]["handoffs"], 1) << h.dump();
  EXPECT_EQ(h["pending"]["targets"], 1) << h.dump();
  EXPECT_EQ(h["stats"]["tasks_completed"], 1) << h.dump();
  EXPECT_GE(h["stats"]["tokens_prefilled"].get<int64_t>(), whole) << h.dump();

  const Answer handed = chat(*c, "tool", chat_messages());
  EXPECT_GT(handed.prompt, prefix);  // the request's prompt continues the prefix with the generation prompt
  EXPECT_GE(handed.cached, whole);
  EXPECT_EQ(handed.text, alone.text);  // greedy, bit-exact KV
  h = get(*c, "/v1/handoffs").body;
  EXPECT_EQ(h["pending"]["targets"], 0) << h.dump();
  EXPECT_EQ(h["stats"]["consumed"], 1) << h.dump();

  // A completions prefix: the text as /v1/completions tokenizes it.
  const std::string story = std::string("Once upon a time. ") + kPlan;
  const Answer story_alone = complete(*c, "planner", story + " Then");
  EXPECT_EQ(story_alone.cached, 0);
  r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"critic"}}, {"prompt", story}, {"priority", 4.0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["targets"][0]["planned"], true) << r.raw;
  const int64_t story_whole = r.body["targets"][0]["prefill_tokens"].get<int64_t>();
  ASSERT_GE(story_whole, kChunk);
  poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 2); });
  const Answer critic = complete(*c, "critic", story + " Then");
  EXPECT_GE(critic.cached, story_whole);
  EXPECT_EQ(critic.text, story_alone.text);

  // A second handoff of the same prefix to the same target: already covered.
  r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"critic"}}, {"prompt", story}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["targets"][0]["planned"], false) << r.raw;

  h = get(*c, "/v1/handoffs").body;
  EXPECT_EQ(h["stats"]["handoffs"], 3) << h.dump();
  EXPECT_EQ(h["stats"]["tasks_submitted"], 2) << h.dump();
  EXPECT_EQ(h["pending"]["targets"], 1) << h.dump();  // the third, not consumed yet
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_handoffs_total"), 3);
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_tasks_total{outcome=\"completed\"}"), 2);
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_tokens_total"), h["stats"]["tokens_prefilled"].get<double>());
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_stale_total"), 0);
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_consumed_total"), 2);
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_pending_targets"), 1);
  EXPECT_EQ(s.stop(SIGTERM), 0);  // a pending handoff does not hold the shutdown up
}

// The same through a real Jinja template (Qwen3's, with --chat-template):
// its rendering without the generation prompt is what the request's
// rendering begins with, so the whole chunks of the prefix are cached.
TEST(ServeHandoffs, AJinjaTemplatesPrefixIsCachedToo) {
  ServerProcess s({"--api-key", test::kKey, "--ctx", "1024", "--quiet", "--chat-template",
                   std::string(EBB_SHARED_DIR) + "/golden/templates/Qwen-Qwen3-0.6B.jinja"});
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  for (const char* name : {"tool", "twin"})
    ASSERT_EQ(post(*c, "/v1/agents", json{{"name", name}, {"system_prompt", kSystem}}).status, 200);
  const Answer alone = chat(*c, "twin", chat_messages());
  EXPECT_EQ(alone.cached, 0);
  const Reply r =
      post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"tool"}}, {"messages", chat_messages()}});
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["targets"][0]["planned"], true) << r.raw;
  const int64_t whole = r.body["targets"][0]["prefill_tokens"].get<int64_t>();
  ASSERT_GE(whole, 2 * kChunk) << r.raw;
  poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 1); });
  const Answer handed = chat(*c, "tool", chat_messages());
  EXPECT_GE(handed.cached, whole);
  EXPECT_EQ(handed.text, alone.text);

  // With tools: the template renders them into the prompt (Qwen3: in the
  // system message), so the handoff carries the tools the requests send.
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "lookup",
    "description": "Looks an order up", "parameters": {"type": "object",
      "properties": {"order": {"type": "string", "maxLength": 8}}, "required": ["order"]}}}])");
  const auto with_tools = [&](const std::string& agent) {
    const Reply a = post(*c, "/v1/chat/completions",
                         json{{"agent", agent}, {"messages", chat_messages()}, {"tools", tools}, {"tool_choice", "none"},
                              {"max_tokens", 12}, {"temperature", 0}});
    EXPECT_EQ(a.status, 200) << a.raw;
    return a.status == 200 ? a.body : json::object();
  };
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "looker"}, {"system_prompt", kSystem}}).status, 200);
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "looker2"}, {"system_prompt", kSystem}}).status, 200);
  const json tools_alone = with_tools("looker2");
  EXPECT_EQ(tools_alone["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const Reply t = post(*c, "/v1/handoffs",
                       json{{"source", "planner"}, {"targets", {"looker"}}, {"messages", chat_messages()}, {"tools", tools}});
  ASSERT_EQ(t.status, 200) << t.raw;
  ASSERT_EQ(t.body["targets"][0]["planned"], true) << t.raw;
  const int64_t tools_whole = t.body["targets"][0]["prefill_tokens"].get<int64_t>();
  EXPECT_GT(tools_whole, whole);  // the tools are in it
  poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 2); });
  const json tools_handed = with_tools("looker");
  EXPECT_GE(tools_handed["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), tools_whole);
  EXPECT_EQ(tools_handed["choices"][0]["message"], tools_alone["choices"][0]["message"]);
}

// With the KV chunk the context picks (--kv-chunk 0: the largest power of
// two <= ctx/4, here 64) and F32 KV, the tasks run under the geometry the
// requests' sessions have, so their chunks are the ones the request looks up.
TEST(ServeHandoffs, TheTasksUseTheRequestsKvGeometry) {
  ServerProcess s({"--api-key", test::kKey, "--ctx", "256", "--kv-chunk", "0", "--kv-type", "f32", "--quiet"});
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  for (const char* name : {"tool", "twin"}) ASSERT_EQ(post(*c, "/v1/agents", json{{"name", name}}).status, 200);
  const std::string prompt = std::string(kPlan) + " " + kPlan;
  const Answer alone = complete(*c, "twin", prompt);
  EXPECT_EQ(alone.cached, 0);
  const Reply r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"tool"}}, {"prompt", prompt}});
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["targets"][0]["planned"], true) << r.raw;
  const int64_t whole = r.body["targets"][0]["prefill_tokens"].get<int64_t>();
  EXPECT_EQ(whole % 64, 0) << r.raw;
  ASSERT_GE(whole, 64) << r.raw;
  poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 1); });
  const Answer handed = complete(*c, "tool", prompt);
  EXPECT_GE(handed.cached, whole);
  EXPECT_EQ(handed.text, alone.text);
  // A shutdown right after a handoff (its task may be running) ends cleanly.
  ASSERT_EQ(post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"twin"}}, {"prompt", prompt + " Again."}})
                .status,
            200);
  EXPECT_EQ(s.stop(SIGTERM), 0);
}

// Unknown targets are a 404 naming them; a malformed body a 400 naming its
// field; nothing of a refused handoff is counted.
TEST(ServeHandoffs, BadHandoffsAreRefused) {
  ServerProcess s(args());
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "tool"}}).status, 200);
  const json msgs = chat_messages();
  const auto body = [&](json patch) {
    json b = {{"source", "planner"}, {"targets", {"tool"}}, {"messages", msgs}};
    for (const auto& [k, v] : patch.items()) {
      if (v.is_null())
        b.erase(k);
      else
        b[k] = v;
    }
    return b;
  };
  Reply r = post(*c, "/v1/handoffs", body({{"targets", {"tool", "nobody"}}}));
  test::expect_openai_error(r, 404, "agent_not_found", "targets");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("nobody"), std::string::npos) << r.raw;
  test::expect_openai_error(post(*c, "/v1/handoffs", std::string("{\"source\": ")), 400, "", "");
  test::expect_openai_error(post(*c, "/v1/handoffs", json::array({1})), 400);
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"source", nullptr}})), 400, "", "source");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"source", "bad name!"}})), 400, "", "source");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"targets", nullptr}})), 400, "", "targets");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"targets", json::array()}})), 400, "", "targets");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"targets", {"tool", "tool"}}})), 400, "", "targets");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"targets", {3}}})), 400, "", "targets");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"targets", std::vector<std::string>(17, "tool")}})), 400, "",
                            "targets");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"messages", nullptr}})), 400, "", "messages");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"prompt", "text"}})), 400, "", "prompt");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"messages", json::array()}})), 400, "", "messages");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"messages", {{{"content", "no role"}}}}})), 400);
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"messages", nullptr}, {"prompt", 7}})), 400, "", "prompt");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"priority", 0}})), 400, "", "priority");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"priority", -1.5}})), 400, "", "priority");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"priority", "high"}})), 400, "", "priority");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"colour", "red"}})), 400, "", "colour");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"messages", nullptr}, {"prompt", "x"}, {"tools", json::array()}})),
                            400, "", "tools");
  // stories260K has no Jinja template here: tools are not served.
  test::expect_openai_error(
      post(*c, "/v1/handoffs",
           body({{"tools", json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])")}})),
      400, "", "tools");
  test::expect_openai_error(post(*c, "/v1/handoffs", body({{"messages", nullptr}, {"prompt", std::string(3000, 'a')}})),
                            400, "context_length_exceeded", "prompt");
  const json h = get(*c, "/v1/handoffs").body;
  EXPECT_EQ(h["stats"]["handoffs"], 0) << h.dump();
  EXPECT_EQ(h["pending"]["targets"], 0) << h.dump();
}

// A random rank-4 adapter for stories260K (B's spread large enough that
// greedy answers change).
void synth(const std::string& out, int seed) {
  const test::CliResult r = test::run_cli("adapter synth -m " + test::model_path("stories260K.gguf") +
                                          " --rank 4 --b-std 0.2 --seed " + std::to_string(seed) + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
}

// The target follows the published version of its adapter: a publish of
// another version between the handoff and its request makes the planned
// prefix stale (counted) and re-plans it under the new version, which the
// request then finds cached, answering as the new version answers.
TEST(ServeHandoffs, APublishOfTheTargetsAdapterReplansIt) {
  test::TempDir dir("ebb-serve-handoffs");
  synth(dir.file("style.gguf"), 1);
  synth(dir.file("style2.gguf"), 2);
  ServerProcess s(args({"--adapter-dir", dir.path()}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  ASSERT_EQ(post(*c, "/v1/adapters/load", json{{"name", "style"}}).status, 200);
  for (const char* name : {"tool", "twin"})
    ASSERT_EQ(post(*c, "/v1/agents", json{{"name", name}, {"system_prompt", kSystem}, {"adapter", "style"}}).status,
              200);

  Reply r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"tool"}}, {"messages", chat_messages()}});
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["targets"][0]["planned"], true) << r.raw;
  const int64_t whole = r.body["targets"][0]["prefill_tokens"].get<int64_t>();
  poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 1); });

  // Version 2, staged then published: the plan under version 1 is stale.
  r = post(*c, "/v1/adapters/style/stage", json{{"file", "style2.gguf"}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const uint64_t v2 = r.body["version"].get<uint64_t>();
  ASSERT_EQ(post(*c, "/v1/adapters/style/publish", json{{"version", v2}}).status, 200);
  // Re-planned under version 2 (at the scheduler's next step boundary): a
  // second task ran, or the staged version's stale-coverage prefill had
  // covered it already.
  const auto replanned = [](const json& j) {
    return j["stats"]["stale"] == 1 && j["stats"]["tasks_running"] == 0 &&
           j["stats"]["tasks_submitted"].get<int64_t>() + j["stats"]["nothing_missing"].get<int64_t>() == 2;
  };
  const json h = poll_handoffs(*c, replanned);
  EXPECT_TRUE(replanned(h)) << h.dump();
  EXPECT_EQ(h["pending"]["targets"], 1) << h.dump();
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_stale_total"), 1);

  const Answer alone = chat(*c, "twin", chat_messages());  // its own namespace: nothing cached
  EXPECT_EQ(alone.cached, 0);
  const Answer handed = chat(*c, "tool", chat_messages());
  EXPECT_GE(handed.cached, whole);
  EXPECT_EQ(handed.text, alone.text);  // version 2's answer
  EXPECT_EQ(get(*c, "/v1/handoffs").body["stats"]["consumed"], 1);

  // A rollback to version 1 is a publish too: a pending target planned
  // under version 2 is stale again, re-planned under version 1.
  const auto planned_or_covered = [](const json& j) {
    return j["stats"]["tasks_submitted"].get<int64_t>() + j["stats"]["nothing_missing"].get<int64_t>();
  };
  r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"tool"}}, {"prompt", kPlan}});
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["targets"][0]["planned"], true) << r.raw;
  const int64_t whole1 = r.body["targets"][0]["prefill_tokens"].get<int64_t>();
  const int64_t before = planned_or_covered(poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 3); }));
  r = post(*c, "/v1/learning/rollback", json{{"adapter", "style"}, {"version", 1}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const json after = poll_handoffs(*c, [&](const json& j) {
    return j["stats"]["stale"] == 2 && j["stats"]["tasks_running"] == 0 && planned_or_covered(j) > before;
  });
  EXPECT_EQ(after["stats"]["stale"], 2) << after.dump();
  EXPECT_EQ(after["pending"]["targets"], 1) << after.dump();
  const Answer twin1 = complete(*c, "twin", kPlan);
  EXPECT_EQ(twin1.cached, 0);
  const Answer tool1 = complete(*c, "tool", kPlan);
  EXPECT_GE(tool1.cached, whole1);
  EXPECT_EQ(tool1.text, twin1.text);  // version 1's answer
  EXPECT_EQ(test::metric_value(*c, "ebb_preprefill_stale_total"), 2);
}

// The learning loop's publishes too (--learn, gate off: every committed
// version is published): a learning agent's pending handoff, planned under
// its published version, is stale when a round publishes the next one, and
// is re-planned under it.
TEST(ServeHandoffs, ALearningRoundsPublishReplansIt) {
  test::TempDir dir("ebb-serve-handoffs-learn");
  ServerProcess s(args({"--state-dir", dir.path(), "--learn", "--learn-gate", "off", "--learn-min-samples", "2",
                        "--learn-steps", "2", "--commit-every", "1"}));
  ASSERT_GT(s.port(), 0) << s.first_line();
  auto c = client(s.port());
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "teller"}, {"adapter", "names"}, {"learn", true}}).status, 200);
  ASSERT_EQ(post(*c, "/v1/agents", json{{"name", "twin"}, {"adapter", "names"}}).status, 200);
  // Stories to give feedback on, now and after the handoff (a request of
  // the agent after it would consume it).
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    const Reply r = post(*c, "/v1/completions",
                         json{{"agent", "teller"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"seed", i}});
    ASSERT_EQ(r.status, 200) << r.raw;
    ids.push_back(r.body["id"].get<std::string>());
  }
  const auto learning = [&](const std::function<bool(const json&)>& done) {
    const auto end = std::chrono::steady_clock::now() + 30s;
    json j;
    while (std::chrono::steady_clock::now() < end) {
      j = get(*c, "/v1/learning").body;
      if (done(j)) return j;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "/v1/learning did not get there in time: " << j.dump();
    return j;
  };
  const auto idle = [](const json& l) {
    const json& a = l["agents"]["teller"];
    return l["gates_pending"] == 0 && (a["round"].is_null() || a["round"]["state"] != "running");
  };
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", ids[i]}, {"reward", 1.0 + i}}).status, 200);
  json l = learning([&](const json& j) { return j["published_versions"].get<int64_t>() >= 1 && idle(j); });
  const int64_t published = l["published_versions"].get<int64_t>();

  Reply r = post(*c, "/v1/handoffs", json{{"source", "planner"}, {"targets", {"teller"}}, {"prompt", kPlan}});
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["targets"][0]["planned"], true) << r.raw;
  const int64_t whole = r.body["targets"][0]["prefill_tokens"].get<int64_t>();
  poll_handoffs(*c, [](const json& j) { return tasks_ended(j, 1); });

  for (int i = 3; i < 8; ++i)  // some are held back: enough for a round
    ASSERT_EQ(post(*c, "/v1/feedback", json{{"id", ids[i]}, {"reward", 1.0 + i}}).status, 200);
  l = learning([&](const json& j) { return j["published_versions"].get<int64_t>() > published && idle(j); });
  const json h = poll_handoffs(*c, [](const json& j) {
    return j["stats"]["stale"].get<int64_t>() >= 1 && j["stats"]["tasks_running"] == 0 &&
           j["stats"]["tasks_submitted"].get<int64_t>() + j["stats"]["nothing_missing"].get<int64_t>() >= 2;
  });
  EXPECT_GE(h["stats"]["stale"].get<int64_t>(), 1) << h.dump();
  // Each committed version was warmed for the pending target as its gate
  // began (gate off: published in the same step), and that task was kept.
  EXPECT_GE(h["stats"]["staged_planned"].get<int64_t>(), 1) << h.dump();
  EXPECT_GE(h["stats"]["staged_promoted"].get<int64_t>(), 1) << h.dump();
  const Answer alone = complete(*c, "twin", kPlan);  // the same published version, its own namespace
  EXPECT_EQ(alone.cached, 0);
  const Answer handed = complete(*c, "teller", kPlan);
  EXPECT_GE(handed.cached, whole);
  EXPECT_EQ(handed.text, alone.text);
}

}  // namespace
}  // namespace ebb
