// OpenAI's wire format (serve/openai.h) without a server: request validation
// (every error names its field), and the response, logprob and stream-chunk
// shapes the openai npm client reads.
//
// The serve layer is not part of the ebb library (only the CLI compiles it),
// so this test compiles openai.h's sources itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support.h"

#include "serve/openai.cpp"
#include "serve/openai_messages.cpp"
#include "serve/openai_request.cpp"
#include "serve/openai_response.cpp"

namespace {

using nlohmann::json;
using namespace ebb;
using namespace ebb::serve;

RequestLimits limits() {
  RequestLimits l;
  l.model_id = "m";
  l.n_vocab = 1000;
  l.n_ctx = 4096;
  l.served = ServedFeatures::all();
  return l;
}

CompletionRequest parse(const json& body, Endpoint ep = Endpoint::kChat) {
  return parse_completion_request(body, ep, limits());
}

json chat(json extra = json::object()) {
  json b = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

// The request is refused with a 400 whose param is `param` and whose message
// contains `says`.
void expect_400(const json& body, const std::string& param, const std::string& says = "",
                Endpoint ep = Endpoint::kChat) {
  SCOPED_TRACE(body.dump());
  try {
    parse(body, ep);
    ADD_FAILURE() << "accepted; expected a 400 naming '" << param << "'";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().param, param) << e.error().message;
    EXPECT_NE(e.error().message.find(says), std::string::npos) << e.error().message;
  }
}

TEST(OpenAIRequest, MessagesInFullShape) {
  const json body = {
      {"messages",
       {{{"role", "developer"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Weather in "}}, {{"type", "text"}, {"text", "Paris?"}}}}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"reasoning_content", "need a tool"},
         {"tool_calls",
          {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}},
           {{"id", "call_2"}, {"type", "function"}, {"function", {{"name", "raw"}, {"arguments", "not json"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"name", "get_weather"}, {"content", "18C"}},
        {{"role", "function"}, {"name", "legacy"}, {"content", "ok"}}}}};
  const CompletionRequest r = parse(body);
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Weather in Paris?");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].role, "tool");
  const json& m = r.chat_messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], (json{{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1]["content"], "Weather in Paris?");
  EXPECT_TRUE(m[2]["content"].is_null());
  EXPECT_EQ(m[2]["reasoning_content"], "need a tool");
  // Arguments parsed into an object for the template; a string that is not JSON stays a string.
  EXPECT_EQ(m[2]["tool_calls"][0],
            (json{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}));
  EXPECT_EQ(m[2]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(m[3], (json{{"role", "tool"}, {"name", "get_weather"}, {"content", "18C"}, {"tool_call_id", "call_1"}}));
  EXPECT_EQ(m[4]["role"], "tool");
  EXPECT_EQ(m[4]["name"], "legacy");
}

TEST(OpenAIRequest, MessageErrorsNameTheField) {
  const json image = {{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}};
  expect_400({{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, image}}}}}},
             "messages[0].content[1]", "ebb does not accept image inputs");
  expect_400({{"messages", {{{"role", "user"}, {"content", {{{"type", "input_audio"}}}}}}}}, "messages[0].content[0]",
             "audio inputs");
  expect_400({{"messages", {{{"role", "assistant"}}}}}, "messages[0].content", "required");
  expect_400({{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "tool"}, {"content", "r"}}}}},
             "messages[1].tool_call_id");
  expect_400({{"messages", {{{"role", "assistant"}, {"tool_calls", {{"x", 1}}}}}}}, "messages[0].tool_calls");
  expect_400({{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"type", "function"}}}}}}}},
             "messages[0].tool_calls[0].function");
  expect_400({{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"type", "function"}, {"function", {{"name", 3}}}}}}}}}},
             "messages[0].tool_calls[0].function.name");
  expect_400({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}, "messages[0].role", "'wizard'");
  expect_400({{"messages", json::array()}}, "messages");
}

json weather_tool() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Current weather"},
            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}},
            {"strict", true}}}};
}

TEST(OpenAIRequest, Tools) {
  CompletionRequest r = parse(chat({{"tools", {weather_tool(), {{"type", "function"}, {"function", {{"name", "now"}}}}}}}));
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].description, "Current weather");
  EXPECT_TRUE(r.tools[0].strict);
  EXPECT_EQ(r.tools[0].parameters["properties"]["city"]["type"], "string");
  EXPECT_EQ(r.tools[1].parameters, (json{{"type", "object"}, {"properties", json::object()}}));
  EXPECT_EQ(r.tools_json[0], weather_tool());
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  EXPECT_TRUE(r.parallel_tool_calls);
  EXPECT_EQ(parse(chat()).tool_choice, ToolChoice::kNone);  // no tools: no calls

  r = parse(chat({{"tools", {weather_tool()}},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                  {"parallel_tool_calls", false}}));
  EXPECT_EQ(r.tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(r.tool_choice_name, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(parse(chat({{"tools", {weather_tool()}}, {"tool_choice", "required"}})).tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(parse(chat({{"tools", {weather_tool()}}, {"tool_choice", "none"}})).tool_choice, ToolChoice::kNone);

  // Legacy functions / function_call.
  r = parse(chat({{"functions", {weather_tool()["function"]}}, {"function_call", {{"name", "get_weather"}}}}));
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tool_choice, ToolChoice::kFunction);

  json bad_name = weather_tool();
  bad_name["function"]["name"] = "get weather";
  expect_400(chat({{"tools", {bad_name}}}), "tools[0].function.name", "a-z");
  bad_name["function"]["name"] = std::string(65, 'a');
  expect_400(chat({{"tools", {bad_name}}}), "tools[0].function.name");
  json bad_params = weather_tool();
  bad_params["function"]["parameters"] = "object";
  expect_400(chat({{"tools", {bad_params}}}), "tools[0].function.parameters");
  bad_params["function"]["parameters"] = {{"type", "string"}};
  expect_400(chat({{"tools", {bad_params}}}), "tools[0].function.parameters");
  expect_400(chat({{"tools", {{{"type", "retrieval"}}}}}), "tools[0].type");
  expect_400(chat({{"tools", {weather_tool(), weather_tool()}}}), "tools[1].function.name", "twice");
  expect_400(chat({{"tools", weather_tool()}}), "tools");
  expect_400(chat({{"tools", {weather_tool()}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}}),
             "tool_choice.function.name", "not in 'tools'");
  expect_400(chat({{"tools", {weather_tool()}}, {"tool_choice", "sometimes"}}), "tool_choice");
  expect_400(chat({{"tool_choice", "required"}}), "tool_choice", "no 'tools'");
  expect_400(chat({{"tools", {weather_tool()}}, {"parallel_tool_calls", "yes"}}), "parallel_tool_calls");
  expect_400({{"prompt", "x"}, {"tools", {weather_tool()}}}, "tools", "chat", Endpoint::kCompletions);
}

TEST(OpenAIRequest, ResponseFormatAndGrammar) {
  EXPECT_EQ(parse(chat({{"response_format", {{"type", "text"}}}})).response_format.kind, OutputConstraint::kNone);
  EXPECT_EQ(parse(chat({{"response_format", {{"type", "json_object"}}}})).response_format.kind,
            OutputConstraint::kJsonObject);
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}};
  CompletionRequest r = parse(chat(
      {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schema}, {"strict", true}}}}}}));
  EXPECT_EQ(r.response_format.kind, OutputConstraint::kJsonSchema);
  EXPECT_EQ(r.response_format.schema, schema);
  EXPECT_EQ(r.response_format.name, "answer");
  EXPECT_TRUE(r.response_format.strict);
  r = parse(chat({{"json_schema", schema}}));
  EXPECT_EQ(r.response_format.kind, OutputConstraint::kJsonSchema);
  EXPECT_EQ(r.response_format.schema, schema);
  r = parse({{"prompt", "x"}, {"grammar", "root ::= \"yes\" | \"no\""}}, Endpoint::kCompletions);
  EXPECT_EQ(r.response_format.kind, OutputConstraint::kGrammar);
  EXPECT_EQ(r.response_format.grammar, "root ::= \"yes\" | \"no\"");
  // A grammar with tools is fine only when the tools cannot be called.
  EXPECT_EQ(parse(chat({{"tools", {weather_tool()}}, {"tool_choice", "none"}, {"grammar", "root ::= \"x\""}}))
                .response_format.kind,
            OutputConstraint::kGrammar);

  expect_400(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}}),
             "response_format.json_schema.name");
  expect_400(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", "x"}}}}}}),
             "response_format.json_schema.schema");
  expect_400(chat({{"response_format", {{"type", "yaml"}}}}), "response_format.type");
  expect_400(chat({{"response_format", "json"}}), "response_format");
  expect_400(chat({{"grammar", "root ::= \"x\""}, {"json_schema", schema}}), "grammar", "at most one");
  expect_400(chat({{"response_format", {{"type", "json_object"}}}, {"json_schema", schema}}), "json_schema", "at most one");
  expect_400(chat({{"tools", {weather_tool()}}, {"grammar", "root ::= \"x\""}}), "grammar", "tools");
  expect_400(chat({{"grammar", 5}}), "grammar");
}

TEST(OpenAIRequest, LogprobsNAndSeed) {
  CompletionRequest r = parse(chat({{"logprobs", true}, {"top_logprobs", 5}, {"n", 3}}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 5);
  EXPECT_EQ(r.n, 3);
  EXPECT_FALSE(parse(chat()).logprobs);
  EXPECT_EQ(parse(chat()).n, 1);
  expect_400(chat({{"top_logprobs", 2}}), "top_logprobs", "logprobs");
  EXPECT_FALSE(parse(chat({{"top_logprobs", 0}})).logprobs);  // a client's default, harmless
  expect_400(chat({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs");
  expect_400(chat({{"logprobs", 1}}), "logprobs");
  r = parse({{"prompt", "x"}, {"logprobs", 3}}, Endpoint::kCompletions);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(parse({{"prompt", "x"}, {"logprobs", 0}}, Endpoint::kCompletions).logprobs);
  expect_400({{"prompt", "x"}, {"logprobs", 6}}, "logprobs", "", Endpoint::kCompletions);
  expect_400({{"prompt", "x"}, {"logprobs", true}}, "logprobs", "", Endpoint::kCompletions);
  expect_400(chat({{"n", 0}}), "n");
  expect_400(chat({{"n", 9}}), "n");
  EXPECT_EQ(parse(chat({{"seed", -1}})).gen.sampling.seed, 0u);  // 0: the sampler draws one
  EXPECT_EQ(parse(chat()).gen.sampling.seed, 0u);
  EXPECT_EQ(parse(chat({{"seed", 42}})).gen.sampling.seed, 42u);
  EXPECT_NE(parse(chat({{"seed", 0}})).gen.sampling.seed, 0u);  // a client's 0 is a fixed seed
  expect_400(chat({{"seed", "x"}}), "seed");
}

TEST(OpenAIRequest, StopsTokenIdsAndExtras) {
  CompletionRequest r = parse(chat({{"stop", {"END", 7, "", "###"}}, {"return_token_ids", true},
                                    {"stream", true}, {"stream_options", {{"include_usage", true}}},
                                    {"logit_bias", {{"5", -100}, {"12", 2.5}}},
                                    {"chat_template_kwargs", {{"enable_thinking", false}}}}));
  EXPECT_EQ(r.gen.stop_strings, (std::vector<std::string>{"END", "###"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<TokenId>{7}));
  EXPECT_TRUE(r.return_token_ids);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[0], (std::pair<TokenId, float>{5, -100.0f}));
  EXPECT_EQ(r.logit_bias[1], (std::pair<TokenId, float>{12, 2.5f}));
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(parse(chat({{"stop", 3}})).stop_token_ids, (std::vector<TokenId>{3}));
  expect_400(chat({{"stop", {"a", 1000}}}), "stop", "stop[1]");
  expect_400(chat({{"stop", {{"a", 1}}}}), "stop");
  expect_400(chat({{"stop", std::vector<int>(17, 1)}}), "stop", "at most 16");
  expect_400(chat({{"logit_bias", {{"x", 1}}}}), "logit_bias");
  expect_400(chat({{"logit_bias", {{"5", 101}}}}), "logit_bias");
  expect_400(chat({{"logit_bias", {{"1000", 1}}}}), "logit_bias");
  expect_400(chat({{"return_token_ids", 1}}), "return_token_ids");
  expect_400(chat({{"stream_options", {{"include_usage", "yes"}}}}), "stream_options.include_usage");
  // What ebb cannot do is refused, not ignored; unknown fields are ignored.
  expect_400(chat({{"audio", {{"voice", "alloy"}}}}), "audio");
  expect_400(chat({{"modalities", {"text", "audio"}}}), "modalities");
  EXPECT_NO_THROW(parse(chat({{"modalities", {"text"}}, {"some_future_field", 1}, {"user", "u"}})));
  expect_400(chat({{"prediction", {{"type", "content"}, {"content", "x"}}}}), "prediction");
  expect_400({{"prompt", "x"}, {"suffix", "y"}}, "suffix", "", Endpoint::kCompletions);
  expect_400({{"prompt", "x"}, {"echo", true}}, "echo", "", Endpoint::kCompletions);
  expect_400({{"prompt", "x"}, {"best_of", 3}}, "best_of", "", Endpoint::kCompletions);
  // The older fields behave as before.
  r = parse({{"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"temperature", 0}}, Endpoint::kCompletions);
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.gen.max_tokens, 5);
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  expect_400({{"prompt", "x"}, {"max_tokens", 5000}}, "max_tokens", "context", Endpoint::kCompletions);
}

// A server that has not learnt a feature refuses requests for it (a 400
// naming the field), rather than answering as if it had not been asked.
TEST(OpenAIRequest, WhatTheServerDoesNotServeIsRefused) {
  RequestLimits plain = limits();
  plain.served = ServedFeatures{};
  const auto refused = [&](const json& body, const std::string& param, Endpoint ep = Endpoint::kChat) {
    SCOPED_TRACE(body.dump());
    try {
      parse_completion_request(body, ep, plain);
      ADD_FAILURE() << "accepted";
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error().status, 400);
      EXPECT_EQ(e.error().param, param);
      EXPECT_NE(e.error().message.find("does not support"), std::string::npos) << e.error().message;
    }
  };
  EXPECT_NO_THROW(parse_completion_request(chat({{"n", 1}, {"tool_choice", "none"}, {"stop", "x"}}), Endpoint::kChat, plain));
  refused(chat({{"tools", {weather_tool()}}}), "tools");
  refused({{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}}}},
          "messages[0].tool_calls");
  refused({{"messages", {{{"role", "tool"}, {"tool_call_id", "c"}, {"content", "r"}}}}}, "messages[0].role");
  refused(chat({{"response_format", {{"type", "json_object"}}}}), "response_format");
  refused({{"prompt", "x"}, {"grammar", "root ::= \"a\""}}, "grammar", Endpoint::kCompletions);
  refused(chat({{"logprobs", true}}), "logprobs");
  refused(chat({{"n", 2}}), "n");
  refused(chat({{"return_token_ids", true}}), "return_token_ids");
  refused(chat({{"stop", {"a", 3}}}), "stop");
  refused(chat({{"logit_bias", {{"3", 1}}}}), "logit_bias");
}

// ---- responses ----

TokenLogprob lp(TokenId id, std::string text, float logprob, std::vector<TopLogprob> top = {}) {
  return TokenLogprob{id, std::move(text), logprob, std::move(top)};
}

TEST(OpenAIResponse, ToolCallsReasoningAndChoices) {
  CompletionRequest r = parse(chat({{"n", 3}}));
  std::vector<Choice> cs(3);
  cs[0].parsed = ParsedOutput{"", "Need the weather.", {{"call_a", "get_weather", R"({"city":"Paris"})"}}};
  cs[0].completion_tokens = 5;
  cs[1].parsed = ParsedOutput{"It is sunny.", "", {}};
  cs[1].completion_tokens = 7;
  cs[2].parsed = ParsedOutput{"Checking", "", {{"call_b", "f", "{}"}}};
  cs[2].stop = StopReason::kMaxTokens;
  cs[2].completion_tokens = 1;
  const Usage u = total_usage(10, 2, cs);
  EXPECT_EQ(u.prompt_tokens, 10);
  EXPECT_EQ(u.completion_tokens, 13);
  const json j = completion_response(r, "chatcmpl-1", 123, cs, u);
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 3u);
  const json& c0 = j["choices"][0];
  EXPECT_EQ(c0["index"], 0);
  EXPECT_EQ(c0["finish_reason"], "tool_calls");
  EXPECT_TRUE(c0["message"]["content"].is_null());  // only calls
  EXPECT_EQ(c0["message"]["role"], "assistant");
  EXPECT_EQ(c0["message"]["reasoning_content"], "Need the weather.");
  EXPECT_EQ(c0["message"]["tool_calls"],
            json::parse(R"([{"id": "call_a", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}])"));
  EXPECT_TRUE(c0["message"]["tool_calls"][0]["function"]["arguments"].is_string());
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["message"], (json{{"role", "assistant"}, {"content", "It is sunny."}}));
  EXPECT_EQ(j["choices"][2]["finish_reason"], "length");  // cut off, calls or not
  EXPECT_EQ(j["choices"][2]["message"]["content"], "Checking");
  EXPECT_EQ(j["usage"]["total_tokens"], 23);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_FALSE(j.contains("prompt_token_ids"));
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

TEST(OpenAIResponse, ChatLogprobs) {
  CompletionRequest r = parse(chat({{"logprobs", true}, {"top_logprobs", 2}}));
  Choice c;
  c.text = "é!";
  c.logprobs = {lp(5, "\xc3\xa9", -0.25f, {{5, "\xc3\xa9", -0.25f}, {9, "e", -1.5f}}), lp(6, "!", -0.5f, {{6, "!", -0.5f}})};
  const json j = completion_response(r, "x", 1, std::span<const Choice>(&c, 1), Usage{});
  const json& l = j["choices"][0]["logprobs"];
  EXPECT_TRUE(l["refusal"].is_null());
  ASSERT_EQ(l["content"].size(), 2u);
  EXPECT_EQ(l["content"][0]["token"], "é");
  EXPECT_FLOAT_EQ(l["content"][0]["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(l["content"][0]["bytes"], (json{195, 169}));
  ASSERT_EQ(l["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(l["content"][0]["top_logprobs"][1], (json{{"token", "e"}, {"logprob", -1.5f}, {"bytes", {101}}}));
  EXPECT_EQ(l["content"][1]["token"], "!");
}

TEST(OpenAIResponse, CompletionLogprobsAndTokenIds) {
  CompletionRequest r = parse({{"prompt", "x"}, {"logprobs", 1}, {"return_token_ids", true}}, Endpoint::kCompletions);
  Choice c;
  c.text = "Once upon";
  c.logprobs = {lp(11, "Once", -0.1f, {{11, "Once", -0.1f}}), lp(12, " upon", -0.2f, {{12, " upon", -0.2f}})};
  c.token_ids = {11, 12};
  const std::vector<TokenId> prompt = {1, 2, 3};
  const json j = completion_response(r, "cmpl-1", 1, std::span<const Choice>(&c, 1), Usage{}, prompt);
  EXPECT_EQ(j["object"], "text_completion");
  const json& l = j["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], (json{"Once", " upon"}));
  EXPECT_EQ(l["text_offset"], (json{0, 4}));
  EXPECT_FLOAT_EQ(l["token_logprobs"][1].get<float>(), -0.2f);
  EXPECT_FLOAT_EQ(l["top_logprobs"][0]["Once"].get<float>(), -0.1f);
  EXPECT_EQ(j["choices"][0]["token_ids"], (json{11, 12}));
  EXPECT_EQ(j["prompt_token_ids"], (json{1, 2, 3}));
  EXPECT_EQ(completion_logprobs(c.logprobs, 10)["text_offset"], (json{10, 14}));
}

TEST(OpenAIResponse, OldSignaturesKeepTheirShape) {
  CompletionRequest r = parse(chat());
  const json j = completion_response(r, "id", 7, "hello", StopReason::kStopString, Usage{3, 2, 0});
  EXPECT_EQ(j["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "hello"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  const std::string fin = "length";
  EXPECT_EQ(stream_chunk(r, "id", 7, "", true, nullptr)["choices"][0]["delta"],
            (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(stream_chunk(r, "id", 7, "", false, &fin)["choices"][0]["delta"], json::object());
}

// Folds stream chunks as the openai npm client's ChatCompletionStream does:
// content and reasoning appended, tool calls gathered by index.
json fold_stream(const std::vector<json>& chunks, size_t n) {
  json msgs = json::array();
  for (size_t i = 0; i < n; ++i) msgs.push_back({{"content", ""}, {"reasoning_content", ""}, {"tool_calls", json::array()}});
  std::vector<std::string> finish(n);
  for (const json& ch : chunks) {
    EXPECT_EQ(ch["object"], "chat.completion.chunk");
    for (const json& c : ch["choices"]) {
      const size_t i = c["index"].get<size_t>();
      const json& d = c["delta"];
      if (c["finish_reason"].is_string()) finish[i] = c["finish_reason"];
      if (d.contains("content")) msgs[i]["content"] = msgs[i]["content"].get<std::string>() + d["content"].get<std::string>();
      if (d.contains("reasoning_content"))
        msgs[i]["reasoning_content"] =
            msgs[i]["reasoning_content"].get<std::string>() + d["reasoning_content"].get<std::string>();
      for (const json& tc : d.value("tool_calls", json::array())) {
        const size_t k = tc["index"].get<size_t>();
        json& calls = msgs[i]["tool_calls"];
        if (calls.size() <= k) calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
        if (tc.contains("id")) calls[k]["id"] = tc["id"];
        if (tc.contains("function") && tc["function"].contains("name")) calls[k]["function"]["name"] = tc["function"]["name"];
        if (tc.contains("function") && tc["function"].contains("arguments"))
          calls[k]["function"]["arguments"] =
              calls[k]["function"]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
      }
    }
  }
  for (size_t i = 0; i < n; ++i) msgs[i]["finish_reason"] = finish[i];
  return msgs;
}

// Two choices of a Hermes-format model with thinking, streamed with their
// deltas interleaved 5 bytes at a time, and the same outputs parsed whole.
struct StreamedPair {
  CompletionRequest r;
  std::vector<json> chunks;  // as sent (each went through sse())
  json whole;                // the non-streamed response
};

StreamedPair stream_two_choices() {
  const ChatOutputFormat f = chat_output_format(ToolCallSyntax::kHermes, true);
  const std::vector<std::string> outputs = {
      "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
      "<think>short</think>Plain answer, no tools."};
  StreamedPair out;
  out.r = parse(chat({{"n", 2}, {"tools", {weather_tool()}}, {"stream", true}}));
  std::vector<Choice> whole(outputs.size());
  std::vector<std::unique_ptr<ChatStreamParser>> parsers;
  for (size_t i = 0; i < outputs.size(); ++i) {
    int n = 0;
    auto ids = [i, n]() mutable { return "call_" + std::to_string(i) + "_" + std::to_string(n++); };
    parsers.push_back(std::make_unique<ChatStreamParser>(f, true, ids));
    whole[i].parsed = parse_chat_output(f, outputs[i], true, ids);
  }
  for (size_t at = 0; at < 400; at += 5) {
    std::vector<StreamChoice> cs;
    for (size_t i = 0; i < outputs.size(); ++i) {
      StreamChoice c;
      c.index = static_cast<int>(i);
      c.first = at == 0;
      if (at < outputs[i].size()) {
        c.deltas = parsers[i]->feed(outputs[i].substr(at, 5));
      } else if (at - 5 < outputs[i].size()) {
        c.deltas = parsers[i]->finish();
        c.finish_reason = finish_reason(StopReason::kEndOfGeneration, !whole[i].parsed->tool_calls.empty());
      } else {
        continue;
      }
      cs.push_back(std::move(c));
    }
    if (!cs.empty()) out.chunks.push_back(json::parse(sse(stream_chunk(out.r, "s", 1, cs)).substr(6)));
  }
  out.whole = completion_response(out.r, "s", 1, whole, Usage{});
  return out;
}

TEST(OpenAIResponse, StreamedChunksAddUpToTheWholeResponse) {
  const StreamedPair s = stream_two_choices();
  const json got = fold_stream(s.chunks, 2);
  const json& want = s.whole;
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const json& m = want["choices"][i]["message"];
    EXPECT_EQ(got[i]["content"], m["content"].is_null() ? json("") : m["content"]);
    EXPECT_EQ(got[i]["reasoning_content"], m.value("reasoning_content", json("")));
    EXPECT_EQ(got[i]["tool_calls"], m.value("tool_calls", json::array()));
    EXPECT_EQ(got[i]["finish_reason"], want["choices"][i]["finish_reason"]);
  }
  EXPECT_EQ(want["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(want["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(got[0]["tool_calls"][1]["id"], "call_0_1");
}

// The official client (npm's openai, installed by scripts/setup.sh into
// BUILD/npm) reads the same stream with its own accumulator
// (chat.completions.stream -> finalChatCompletion) and the whole response,
// through a fetch that serves them without a server.
TEST(OpenAIResponse, TheOfficialClientReadsStreamAndWhole) {
  const std::string cli = EBB_CLI_PATH;
  const std::string prefix = cli.substr(0, cli.rfind('/')) + "/npm";
  if (std::system("node --version >/dev/null 2>&1") != 0 ||
      !std::filesystem::exists(prefix + "/node_modules/openai/package.json"))
    GTEST_SKIP() << "node or the openai npm package (" << prefix << ") is missing: run scripts/setup.sh";
  const StreamedPair s = stream_two_choices();
  ebb::test::TempDir dir("ebb-openai");
  {
    std::ofstream sse_file(dir.file("stream.sse"));
    for (const json& c : s.chunks) sse_file << sse(c);
    sse_file << "data: [DONE]\n\n";
    std::ofstream whole_file(dir.file("whole.json"));
    whole_file << s.whole.dump();
    std::ofstream js(dir.file("check.mjs"));
    js << R"JS(
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
const [prefix, ssePath, wholePath, toolsJson] = process.argv.slice(2);
const mod = createRequire(join(prefix, 'package.json'))('openai');
const OpenAI = mod.OpenAI ?? mod.default ?? mod;
let body = null;
const client = new OpenAI({ apiKey: 'k', baseURL: 'http://127.0.0.1:9/v1', maxRetries: 0,
  fetch: async () => new Response(body.text, { status: 200, headers: { 'content-type': body.type } }) });
const params = { model: 'm', messages: [{ role: 'user', content: 'hi' }], tools: JSON.parse(toolsJson), n: 2 };
body = { text: readFileSync(ssePath, 'utf8'), type: 'text/event-stream' };
const streamed = await client.chat.completions.stream(params).finalChatCompletion();
body = { text: readFileSync(wholePath, 'utf8'), type: 'application/json' };
const whole = await client.chat.completions.create(params);
console.log(JSON.stringify({ streamed, whole }));
)JS";
  }
  const std::string cmd = "timeout 60 node " + dir.file("check.mjs") + " " + prefix + " " + dir.file("stream.sse") + " " +
                          dir.file("whole.json") + " '" + json::array({weather_tool()}).dump() + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  const json got = json::parse(out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  for (const char* how : {"streamed", "whole"}) {
    SCOPED_TRACE(how);
    const json& cs = got[how]["choices"];
    ASSERT_EQ(cs.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const json& want = s.whole["choices"][i];
      EXPECT_EQ(cs[i]["index"], i);
      EXPECT_EQ(cs[i]["finish_reason"], want["finish_reason"]);
      EXPECT_EQ(cs[i]["message"]["role"], "assistant");
      EXPECT_EQ(cs[i]["message"]["content"], want["message"]["content"]);
      const json calls = want["message"].value("tool_calls", json::array());
      ASSERT_EQ(cs[i]["message"].value("tool_calls", json::array()).size(), calls.size());
      for (size_t k = 0; k < calls.size(); ++k) {
        const json& c = cs[i]["message"]["tool_calls"][k];
        EXPECT_EQ(c["id"], calls[k]["id"]);
        EXPECT_EQ(c["type"], "function");
        EXPECT_EQ(c["function"]["name"], calls[k]["function"]["name"]);
        EXPECT_EQ(c["function"]["arguments"], calls[k]["function"]["arguments"]);
      }
    }
  }
  // strict tools: the client parsed the streamed arguments itself.
  EXPECT_EQ(got["streamed"]["choices"][0]["message"]["tool_calls"][0]["function"]["parsed_arguments"],
            (json{{"city", "Paris"}}));
}

TEST(OpenAIResponse, StreamChunkShapes) {
  CompletionRequest r = parse(chat({{"stream", true}, {"logprobs", true}, {"return_token_ids", true},
                                    {"stream_options", {{"include_usage", true}}}}));
  StreamChoice c;
  c.index = 1;
  c.first = true;
  c.deltas = {{ChatDelta::Kind::kReasoning, "hm", 0, "", ""},
              {ChatDelta::Kind::kToolCall, "", 0, "call_x", "f"},
              {ChatDelta::Kind::kToolArguments, "{\"a\":1}", 0, "", ""}};
  c.logprobs = {lp(4, "hm", -0.3f)};
  c.token_ids = {4};
  const std::vector<TokenId> prompt = {1, 2};
  json j = stream_chunk(r, "s", 9, std::span<const StreamChoice>(&c, 1), prompt);
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["index"], 1);
  EXPECT_TRUE(ch["finish_reason"].is_null());
  EXPECT_EQ(ch["delta"]["role"], "assistant");
  EXPECT_EQ(ch["delta"]["content"], "");
  EXPECT_EQ(ch["delta"]["reasoning_content"], "hm");
  EXPECT_EQ(ch["delta"]["tool_calls"],
            json::parse(R"([{"index": 0, "id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}])"));
  EXPECT_EQ(ch["logprobs"]["content"][0]["token"], "hm");
  EXPECT_EQ(ch["token_ids"], (json{4}));
  EXPECT_EQ(j["prompt_token_ids"], (json{1, 2}));
  EXPECT_TRUE(j.contains("usage") && j["usage"].is_null());
  // An arguments piece alone, and the last chunk.
  StreamChoice more;
  more.deltas = {{ChatDelta::Kind::kToolArguments, "}", 2, "", ""}};
  more.finish_reason = "tool_calls";
  j = stream_chunk(r, "s", 9, std::span<const StreamChoice>(&more, 1));
  EXPECT_EQ(j["choices"][0]["delta"], json::parse(R"({"tool_calls": [{"index": 2, "function": {"arguments": "}"}}]})"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(j.contains("prompt_token_ids"));
  // Completions: text and legacy logprobs counted from the chunk's offset.
  CompletionRequest rc = parse({{"prompt", "x"}, {"logprobs", 0}, {"stream", true}}, Endpoint::kCompletions);
  StreamChoice t;
  t.text = " upon";
  t.text_offset = 4;
  t.logprobs = {lp(12, " upon", -0.2f)};
  j = stream_chunk(rc, "c", 9, std::span<const StreamChoice>(&t, 1));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], " upon");
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], (json{4}));
  EXPECT_FALSE(j.contains("usage"));
  const json uj = usage_chunk(r, "s", 9, Usage{4, 6, 1});
  EXPECT_TRUE(uj["choices"].empty());
  EXPECT_EQ(uj["usage"]["total_tokens"], 10);
}

TEST(OpenAIResponse, SseReplacesInvalidUtf8) {
  const std::string s = sse(json{{"t", std::string("a\xff")}});
  EXPECT_EQ(s.substr(0, 6), "data: ");
  EXPECT_EQ(s.substr(s.size() - 2), "\n\n");
  json back;
  EXPECT_NO_THROW(back = json::parse(s.substr(6)));
  EXPECT_EQ(back["t"], "a\xef\xbf\xbd");  // U+FFFD for the stray byte
}

}  // namespace

// An agent: the "agent" field or model "ID:agent/NAME" (base too); not with
// an adapter, and the two must agree.
TEST(OpenAIRequest, Agent) {
  EXPECT_EQ(parse(chat({{"agent", "teller"}})).agent, "teller");
  CompletionRequest r = parse(chat({{"model", "m:agent/teller"}}));
  EXPECT_EQ(r.agent, "teller");
  EXPECT_EQ(r.adapter, "");
  EXPECT_EQ(r.model, "m:agent/teller");
  EXPECT_EQ(parse(chat({{"model", "base:agent/teller"}, {"agent", "teller"}})).agent, "teller");
  EXPECT_EQ(parse(chat({{"model", "m:teller"}})).agent, "");  // an adapter named teller
  expect_400(chat({{"model", "m:agent/a"}, {"agent", "b"}}), "agent", "names agent 'a'");
  expect_400(chat({{"agent", "a"}, {"adapter", "x"}}), "adapter", "binds its own adapter");
  expect_400(chat({{"model", "m:agent/"}}), "model");
  expect_400(chat({{"agent", ""}}), "agent");
  expect_400(chat({{"agent", 3}}), "agent");
}
