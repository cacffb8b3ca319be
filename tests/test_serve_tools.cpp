// ebb serve with a Jinja chat template: tool calls, constrained output and
// tool results in the history, over loopback.
//
// The model is stories260K (random-ish weights for this purpose: it knows
// nothing of tools) served with --chat-template set to Qwen3's real template
// (shared/golden/templates). Its vocabulary has no <tool_call> or
// <|im_start|> tokens: it spells them with character and byte tokens, which
// is enough here since grammars work on bytes and the parser on text. What
// is checked is what the grammar guarantees whatever the weights: a forced
// call's arguments parse and match the tool's schema, a json_schema
// response's content does, a streamed call equals the whole one at
// temperature 0, and a tool result in the history renders. A server without
// a template refuses tools by name. The official openai npm client runs the
// same checks (tests/openai_client_tools.mjs).
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace {

using nlohmann::json;
using namespace ebb::test;

std::string qwen3_template() {
  std::string path = EBB_SHARED_DIR;
  path += "/golden/templates/Qwen-Qwen3-0.6B.jinja";
  return path;
}

// A tool whose arguments are bounded (a short string, a small integer), so
// that even a model writing nonsense finishes its call well within max_tokens.
json weather_tool() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 8},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "days"], "additionalProperties": false}}})");
}

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

void expect_weather_arguments(const std::string& arguments) {
  const json a = json::parse(arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << arguments;
  ASSERT_TRUE(a.contains("city") && a["city"].is_string()) << arguments;
  EXPECT_LE(a["city"].get<std::string>().size(), 8u) << arguments;
  ASSERT_TRUE(a.contains("days") && a["days"].is_number_integer()) << arguments;
  EXPECT_GE(a["days"].get<int64_t>(), 1);
  EXPECT_LE(a["days"].get<int64_t>(), 7);
  EXPECT_EQ(a.size(), 2u) << arguments;
}

class ServeTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--api-key", kKey, "--chat-template", qwen3_template(), "--ctx", "2048", "--quiet"});
    ASSERT_GT(server_->port(), 0) << "no port in the server's first line: '" << server_->first_line() << "'";
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->stop(SIGTERM), 0);
    }
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(server_ && server_->port() > 0);
    c_ = client(server_->port());
  }
  static json forced_call_request() {
    return {{"model", "stories260K"},
            {"messages", {user("What is the weather in Oslo for 3 days?")}},
            {"tools", {weather_tool()}},
            {"tool_choice", "required"},
            {"parallel_tool_calls", false},
            {"max_tokens", 200},
            {"temperature", 0}};
  }

  static ServerProcess* server_;
  std::unique_ptr<httplib::Client> c_;
};
ServerProcess* ServeTools::server_ = nullptr;

TEST_F(ServeTools, TheFirstLineSaysTheTemplateIsUsed) {
  EXPECT_NE(server_->first_line().find("jinja, hermes calls"), std::string::npos) << server_->first_line();
}

TEST_F(ServeTools, ARequiredCallMatchesTheToolsSchema) {
  const Reply r = post(*c_, "/v1/chat/completions", forced_call_request());
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.raw;
  const json& msg = choice["message"];
  ASSERT_TRUE(msg.contains("tool_calls")) << r.raw;
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << r.raw;
  const json& call = msg["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  expect_weather_arguments(call["function"]["arguments"].get<std::string>());
}

TEST_F(ServeTools, ANamedFunctionIsCalled) {
  json req = forced_call_request();
  json other = weather_tool();
  other["function"]["name"] = "get_time";
  req["tools"] = {other, weather_tool()};
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& calls = r.body["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << r.raw;
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  expect_weather_arguments(calls[0]["function"]["arguments"].get<std::string>());
}

TEST_F(ServeTools, ArgumentsFollowTheSchemasKeyOrder) {
  // "days" before "city", as the client wrote them (not sorted).
  json req = forced_call_request();
  req.erase("tools");
  const std::string body = req.dump();
  const std::string tools = R"(,"tools":[{"type":"function","function":{"name":"get_weather","parameters":
    {"type":"object","properties":{"days":{"type":"integer","minimum":1,"maximum":7},
     "city":{"type":"string","maxLength":8}},"required":["days","city"]}}}]})";
  const Reply r = post(*c_, "/v1/chat/completions", body.substr(0, body.size() - 1) + tools);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& calls = r.body["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << r.raw;
  const std::string args = calls[0]["function"]["arguments"];
  EXPECT_EQ(args.rfind("{\"days\":", 0), 0u) << args;
}

// n choices each get their own copy of the grammar: every choice of a
// sampled n = 3 is a valid call (a shared grammar state would break all
// but one), and streamed the same with a seed.
TEST_F(ServeTools, EveryChoiceOfNIsAValidCall) {
  json req = forced_call_request();
  req["n"] = 3;
  req["temperature"] = 1.0;
  req["seed"] = 9;
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 3u) << r.raw;
  for (int i = 0; i < 3; ++i) {
    const json& choice = r.body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.raw;
    const json& calls = choice["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), 1u) << r.raw;
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    expect_weather_arguments(calls[0]["function"]["arguments"].get<std::string>());
  }
  const Streamed s = stream(*c_, "/v1/chat/completions", req, true);
  std::map<int, std::string> args;
  for (const json& ch : s.chunks)
    for (const json& c : ch["choices"])
      if (c["delta"].contains("tool_calls"))
        for (const json& t : c["delta"]["tool_calls"]) args[c["index"]] += t["function"].value("arguments", "");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(args[i], r.body["choices"][i]["message"]["tool_calls"][0]["function"]["arguments"]) << i;
}

TEST_F(ServeTools, AStreamedCallEqualsTheWholeOne) {
  const Reply whole = post(*c_, "/v1/chat/completions", forced_call_request());
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const json& call = whole.body["choices"][0]["message"]["tool_calls"][0];

  const Streamed s = stream(*c_, "/v1/chat/completions", forced_call_request(), /*chat=*/true);
  ASSERT_TRUE(s.done && s.done_last);
  ASSERT_FALSE(s.chunks.empty());
  EXPECT_EQ(s.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  std::string name, arguments, id;
  int calls = 0;
  for (const json& c : s.chunks) {
    const json& d = c["choices"][0]["delta"];
    if (!d.contains("tool_calls")) continue;
    for (const json& t : d["tool_calls"]) {
      EXPECT_EQ(t["index"], 0);
      if (t.contains("id")) {
        ++calls;
        id = t["id"];
      }
      if (t.contains("function") && t["function"].contains("name")) name += t["function"]["name"].get<std::string>();
      if (t.contains("function") && t["function"].contains("arguments"))
        arguments += t["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(name, call["function"]["name"]);
  EXPECT_EQ(arguments, call["function"]["arguments"]);
  EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(ServeTools, AJsonSchemaResponseMatchesTheSchema) {
  const json schema = json::parse(R"({"type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer", "n"], "additionalProperties": false})");
  const json req = {{"model", "stories260K"},
                    {"messages", {user("Answer in JSON.")}},
                    {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}},
                    {"max_tokens", 200},
                    {"temperature", 0}};
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop") << r.raw;
  const json content = json::parse(r.body["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(content.is_object()) << r.raw;
  ASSERT_TRUE(content.contains("answer") && content["answer"].is_string()) << r.raw;
  EXPECT_LE(content["answer"].get<std::string>().size(), 10u);
  ASSERT_TRUE(content.contains("n") && content["n"].is_number_integer()) << r.raw;
  EXPECT_EQ(content.size(), 2u);
}

TEST_F(ServeTools, AJsonObjectResponseIsAnObject) {
  const json req = {{"model", "stories260K"},
                    {"messages", {user("Answer in JSON.")}},
                    {"response_format", {{"type", "json_object"}}},
                    {"max_tokens", 300},
                    {"temperature", 0}};
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  // A free-form object may run past max_tokens; when it ends, it parses.
  if (r.body["choices"][0]["finish_reason"] == "stop") {
    const json content = json::parse(r.body["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(content.is_object()) << r.raw;
  } else {
    EXPECT_EQ(r.body["choices"][0]["message"]["content"].get<std::string>().rfind("{", 0), 0u) << r.raw;
  }
}

TEST_F(ServeTools, AToolResultRoundTripRenders) {
  const json req = {
      {"model", "stories260K"},
      {"messages",
       {user("What is the weather in Oslo?"),
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Oslo", "days": 1})"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "Sunny, 12 C"}}}},
      {"tools", {weather_tool()}},
      {"max_tokens", 16},
      {"temperature", 0}};
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(r.body["usage"]["prompt_tokens"].get<int64_t>(), 0);
}

TEST_F(ServeTools, ABadGrammarIsA400NamingIt) {
  const json req = {{"model", "stories260K"},
                    {"messages", {user("hi")}},
                    {"grammar", "root ::= undefined_rule"},
                    {"max_tokens", 4}};
  expect_openai_error(post(*c_, "/v1/chat/completions", req), 400, "", "grammar");
}

TEST_F(ServeTools, AGbnfGrammarConstrainsTheOutput) {
  const json req = {{"model", "stories260K"},
                    {"messages", {user("yes or no?")}},
                    {"grammar", R"(root ::= "yes" | "no")"},
                    {"max_tokens", 16},
                    {"temperature", 0}};
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string content = r.body["choices"][0]["message"]["content"];
  EXPECT_TRUE(content == "yes" || content == "no") << r.raw;
}

TEST_F(ServeTools, ToolChoiceAutoAnswersWithALazyGrammar) {
  // The weights never write <tool_call>, so the lazy grammar stays off:
  // the answer is plain content, unconstrained.
  json req = forced_call_request();
  req["tool_choice"] = "auto";
  req["max_tokens"] = 16;
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length") << r.raw;
  EXPECT_TRUE(choice["message"]["content"].is_string()) << r.raw;
}

TEST_F(ServeTools, ThinkingIsReasoningContentWholeAndStreamed) {
  // A grammar makes the model write Qwen3's reasoning block and an answer.
  const json req = {{"model", "stories260K"},
                    {"messages", {user("Think first.")}},
                    {"grammar", R"(root ::= "<think>\nhmm\n</think>\n\nok")"},
                    {"max_tokens", 64},
                    {"temperature", 0}};
  const Reply r = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& msg = r.body["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "hmm") << r.raw;
  EXPECT_EQ(msg["content"], "ok") << r.raw;

  const Streamed s = stream(*c_, "/v1/chat/completions", req, /*chat=*/true);
  ASSERT_TRUE(s.done && s.done_last);
  std::string reasoning;
  for (const json& c : s.chunks) {
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "hmm");
  EXPECT_EQ(s.text, "ok");
}

// The official openai npm client (scripts/setup.sh installs it into
// BUILD/npm) on the same server: tools, streamed calls, a tool result, a
// json_schema response (tests/openai_client_tools.mjs).
TEST_F(ServeTools, TheOfficialClientCallsTools) {
  const ScriptRun run = run_openai_script("openai_client_tools.mjs", server_->port());
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("openai client tools: all checks passed"), std::string::npos) << run.out;
}

TEST(ServeToolsFallback, AServerWithoutATemplateRefusesToolsByName) {
  ServerProcess server({"--api-key", kKey, "--quiet"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  auto c = client(server.port());
  const json req = {{"model", "stories260K"},
                    {"messages", {user("hi")}},
                    {"tools", {weather_tool()}},
                    {"max_tokens", 4}};
  const Reply refused = post(*c, "/v1/chat/completions", req);
  expect_openai_error(refused, 400, "", "tools");
  EXPECT_NE(refused.raw.find("--chat-template"), std::string::npos) << refused.raw;
  // Constraints do not need a template.
  const json g = {{"model", "stories260K"},
                  {"messages", {user("hi")}},
                  {"grammar", R"(root ::= "ok")"},
                  {"max_tokens", 8},
                  {"temperature", 0}};
  const Reply r = post(*c, "/v1/chat/completions", g);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "ok") << r.raw;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServeToolsFallback, AChatTemplateFileThatCannotBeUsedIsAnError) {
  ebb::test::TempDir dir("ebb-serve-tools");
  const std::string bad = dir.file("bad.jinja");
  std::FILE* f = std::fopen(bad.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("{% if %}", f);
  std::fclose(f);
  const CliResult r = run_cli("serve -m " + model_path("stories260K.gguf") + " --port 0 --chat-template " + bad);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
  const CliResult missing =
      run_cli("serve -m " + model_path("stories260K.gguf") + " --port 0 --chat-template " + dir.file("none.jinja"));
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("neither a format name"), std::string::npos) << missing.err;
}

// `ebb synth --chat-template`: a synthetic model that carries Qwen3's real
// template in its file, with the family's markers as single tokens, serves
// tool calls with no --chat-template option: random weights still make a
// call that matches the schema, and its end-of-turn token ends it.
TEST(ServeSynthTemplate, AModelCarryingItsTemplateServesToolCalls) {
  TempDir dir("ebb-synth-tools");
  const std::string model = dir.file("qwen3-tools.gguf");
  const CliResult made = run_cli("synth tiny --type q8_0 -o " + model + " --chat-template " + qwen3_template());
  ASSERT_EQ(made.status, 0) << made.out << made.err;
  ServerProcess server({"--ctx", "2048", "--quiet"}, model);
  ASSERT_GT(server.port(), 0) << server.first_line();
  EXPECT_NE(server.first_line().find("jinja, hermes calls"), std::string::npos) << server.first_line();
  auto c = client(server.port(), /*with_key=*/false);
  json req = {{"messages", {user("What is the weather in Oslo for 3 days?")}},
              {"tools", {weather_tool()}},
              {"tool_choice", "required"},
              {"max_tokens", 200},
              {"seed", 7}};
  const Reply r = post(*c, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.raw;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.raw;
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  expect_weather_arguments(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>());
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
