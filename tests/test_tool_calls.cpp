// Chat output parsing (model/chat_parse.h): content, <think> reasoning and
// each family's tool-call syntax, whole and streamed at every split point.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "model/chat_parse.h"

namespace {

using ebb::ChatDelta;
using ebb::ChatOutputFormat;
using ebb::ParsedOutput;
using ebb::ToolCallSyntax;

ebb::CallIdFn counting_ids() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

struct Call {
  std::string name, arguments;
};

struct Case {
  const char* what;
  ToolCallSyntax syntax;
  bool thinking, open_think, tools;
  std::string text;
  std::string content, reasoning;
  std::vector<Call> calls;
};

ChatOutputFormat format_of(const Case& c) {
  ChatOutputFormat f = ebb::chat_output_format(c.syntax, c.thinking);
  f.open_think = c.open_think;
  return f;
}

void expect_parsed(const ParsedOutput& got, const Case& c, const std::string& how) {
  SCOPED_TRACE(std::string(c.what) + " (" + how + ")");
  EXPECT_EQ(got.content, c.content);
  EXPECT_EQ(got.reasoning_content, c.reasoning);
  ASSERT_EQ(got.tool_calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, "call_" + std::to_string(i));
    EXPECT_EQ(got.tool_calls[i].name, c.calls[i].name);
    EXPECT_EQ(got.tool_calls[i].arguments, c.calls[i].arguments);
  }
}

const std::string kWeather = R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 3}})";
const std::string kWeatherArgs = R"({"city":"Paris","days":3})";

std::vector<Case> cases() {
  using S = ToolCallSyntax;
  return {
      // Hermes / Qwen.
      {"plain text", S::kHermes, false, false, true, "  Hello, world.\n", "Hello, world.", "", {}},
      {"one call", S::kHermes, false, false, true, "<tool_call>\n" + kWeather + "\n</tool_call>", "", "",
       {{"get_weather", kWeatherArgs}}},
      {"content around two calls", S::kHermes, false, false, true,
       "Let me check.\n<tool_call>\n" + kWeather + "\n</tool_call>\n<tool_call>\n" +
           R"({"name": "get_time", "arguments": {"tz": "CET"}})" + "\n</tool_call>\nDone.",
       "Let me check.\n\n\nDone.", "", {{"get_weather", kWeatherArgs}, {"get_time", R"({"tz":"CET"})"}}},
      {"keys keep the model's order, no arguments is {}", S::kHermes, false, false, true,
       R"(<tool_call>{"name": "f", "arguments": {"b": 1, "a": [1, 2.5, "x"]}}</tool_call><tool_call>{"name": "g"}</tool_call>)",
       "", "", {{"f", R"({"b":1,"a":[1,2.5,"x"]})"}, {"g", "{}"}}},
      {"arguments given as a JSON string", S::kHermes, false, false, true,
       R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)", "", "", {{"f", R"({"x":1})"}}},
      {"parameters for arguments", S::kHermes, false, false, true,
       R"(<tool_call>{"name": "f", "parameters": {"x": "é"}}</tool_call>)", "", "", {{"f", R"({"x":"é"})"}}},
      {"malformed JSON stays content", S::kHermes, false, false, true,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>", "", {}},
      {"a call with no name stays content", S::kHermes, false, false, true,
       R"(A <tool_call>{"arguments": {}}</tool_call> B)", R"(A <tool_call>{"arguments": {}}</tool_call> B)", "", {}},
      {"non-object arguments stay content", S::kHermes, false, false, true,
       R"(<tool_call>{"name": "f", "arguments": [1]}</tool_call>)",
       R"(<tool_call>{"name": "f", "arguments": [1]}</tool_call>)", "", {}},
      {"a bad call, then a good one", S::kHermes, false, false, true,
       R"(<tool_call>{oops}</tool_call> then <tool_call>{"name": "f", "arguments": {}}</tool_call>)",
       "<tool_call>{oops}</tool_call> then", "", {{"f", "{}"}}},
      {"an unclosed call at the end is read", S::kHermes, false, false, true, "<tool_call>\n" + kWeather + "\n", "", "",
       {{"get_weather", kWeatherArgs}}},
      {"a call cut off is content", S::kHermes, false, false, true,
       R"(Sure <tool_call>{"name": "get_weather", "argu)", R"(Sure <tool_call>{"name": "get_weather", "argu)", "", {}},
      {"no tools: markers are text", S::kHermes, false, false, false, "<tool_call>\n" + kWeather + "\n</tool_call>",
       "<tool_call>\n" + kWeather + "\n</tool_call>", "", {}},
      {"a marker's start that is not one", S::kHermes, false, false, true, "a <tool_x> b <tool_call", "a <tool_x> b <tool_call",
       "", {}},
      // Reasoning.
      {"think then answer", S::kHermes, true, false, true, "<think>\nLet me see.\n</think>\n\nIt is 4.", "It is 4.",
       "Let me see.", {}},
      {"think then call", S::kHermes, true, false, true,
       "<think>\nNeed weather.\n</think>\n\n<tool_call>\n" + kWeather + "\n</tool_call>", "", "Need weather.",
       {{"get_weather", kWeatherArgs}}},
      {"a call inside think is reasoning", S::kHermes, true, false, true,
       "<think>maybe <tool_call>" + kWeather + "</tool_call>?</think>No call.", "No call.",
       "maybe <tool_call>" + kWeather + "</tool_call>?", {}},
      {"the prompt opened think", S::kHermes, true, true, true,
       "I will call it.\n</think>\n<tool_call>" + kWeather + "</tool_call>", "", "I will call it.",
       {{"get_weather", kWeatherArgs}}},
      {"the prompt opened think and the model wrote it again", S::kHermes, true, true, false,
       "\n<think>\nHmm.</think>Yes.", "Yes.", "Hmm.", {}},
      {"an unclosed think is all reasoning", S::kHermes, true, false, true, "<think>going on and on", "",
       "going on and on", {}},
      {"think later in the text is content", S::kHermes, true, false, true, "Hi <think>x</think>", "Hi <think>x</think>",
       "", {}},
      {"empty think", S::kHermes, true, false, false, "<think>\n\n</think>\n\nHello", "Hello", "", {}},
      // Llama 3.
      {"llama3 JSON call", S::kLlama3, false, false, true, R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
       "", "", {{"get_weather", R"({"city":"Paris"})"}}},
      {"llama3 two calls", S::kLlama3, false, false, true,
       R"({"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}})", "", "",
       {{"a", "{}"}, {"b", R"({"x":1})"}}},
      {"llama3 JSON that is not a call", S::kLlama3, false, false, true, R"( {"answer": 42} )", R"({"answer": 42})", "",
       {}},
      {"llama3 bare call needs its arguments", S::kLlama3, false, false, true, R"({"name": "Bob"})", R"({"name": "Bob"})",
       "", {}},
      {"llama3 JSON after text is content", S::kLlama3, false, false, true, R"(Use {"name": "a", "parameters": {}})",
       R"(Use {"name": "a", "parameters": {}})", "", {}},
      {"llama3 call then text", S::kLlama3, false, false, true, R"({"name": "a", "parameters": {}} and more)",
       "and more", "", {{"a", "{}"}}},
      {"llama3 python_tag JSON", S::kLlama3, false, false, true,
       R"(<|python_tag|>{"name": "f", "parameters": {"q": "x"}})", "", "", {{"f", R"({"q":"x"})"}}},
      {"llama3 built-in call", S::kLlama3, false, false, true,
       R"(Searching.<|python_tag|>brave_search.call(query="weather in \"Paris\"", n=3, safe=True))", "Searching.", "",
       {{"brave_search", R"({"query":"weather in \"Paris\"","n":3,"safe":true})"}}},
      {"llama3 python_tag code is content", S::kLlama3, false, false, true, "<|python_tag|>print(1)",
       "<|python_tag|>print(1)", "", {}},
      {"llama3 unterminated JSON", S::kLlama3, false, false, true, R"({"name": "a", "parameters": {)",
       R"({"name": "a", "parameters": {)", "", {}},
      // Mistral.
      {"mistral v3 array", S::kMistral, false, false, true,
       R"([TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}])", "", "",
       {{"a", R"({"x":1})"}, {"b", "{}"}}},
      {"mistral name[ARGS]", S::kMistral, false, false, true,
       R"(Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{})", "Sure.", "",
       {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}},
      {"mistral with call id", S::kMistral, false, false, true, R"([TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{"a": 1})", "",
       "", {{"f", R"({"a":1})"}}},
      {"mistral mismatched brackets", S::kMistral, false, false, true,
       R"([TOOL_CALLS][{"name": "a", "arguments": {"x": 1}] ok)", R"([TOOL_CALLS][{"name": "a", "arguments": {"x": 1}] ok)",
       "", {}},
      {"mistral marker then prose", S::kMistral, false, false, true, "[TOOL_CALLS] no", "[TOOL_CALLS] no", "", {}},
      // Generic.
      {"generic envelope", S::kGeneric, false, false, true,
       R"({"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}], "content": "hi"})", "hi",
       "", {{"a", R"({"x":1})"}, {"b", "{}"}}},
      {"generic single object", S::kGeneric, false, false, true, R"({"name": "a", "arguments": {"x": [true, null]}})", "",
       "", {{"a", R"({"x":[true,null]})"}}},
      {"generic OpenAI-shaped call", S::kGeneric, false, false, true,
       R"({"tool_calls": [{"type": "function", "function": {"name": "a", "arguments": "{\"k\": \"v\"}"}}]})", "", "",
       {{"a", R"({"k":"v"})"}}},
      {"generic response", S::kGeneric, false, false, true, R"({"response": "Hello"})", "Hello", "", {}},
      {"generic prose", S::kGeneric, true, false, true, "<think>hm</think>Just text {not json", "Just text {not json",
       "hm", {}},
      {"generic without tools", S::kGeneric, false, false, false, R"({"name": "a", "arguments": {}})",
       R"({"name": "a", "arguments": {}})", "", {}},
  };
}

TEST(ToolCalls, WholeOutputs) {
  for (const Case& c : cases()) expect_parsed(ebb::parse_chat_output(format_of(c), c.text, c.tools, counting_ids()), c, "whole");
}

ParsedOutput stream(const Case& c, const std::vector<size_t>& cuts) {
  ebb::ChatStreamParser p(format_of(c), c.tools, counting_ids());
  ParsedOutput out;
  size_t at = 0;
  for (size_t cut : cuts) {
    ebb::apply_deltas(out, p.feed(std::string_view(c.text).substr(at, cut - at)));
    at = cut;
  }
  ebb::apply_deltas(out, p.feed(std::string_view(c.text).substr(at)));
  ebb::apply_deltas(out, p.finish());
  return out;
}

TEST(ToolCalls, StreamedAtEverySplitEqualsWhole) {
  for (const Case& c : cases()) {
    for (size_t k = 0; k <= c.text.size(); ++k) expect_parsed(stream(c, {k}), c, "split at " + std::to_string(k));
    for (size_t k = 0; k + 3 <= c.text.size(); k += 3)
      expect_parsed(stream(c, {k, k + 1, k + 3}), c, "three splits at " + std::to_string(k));
    std::vector<size_t> bytes;
    for (size_t k = 1; k < c.text.size(); ++k) bytes.push_back(k);
    expect_parsed(stream(c, bytes), c, "byte by byte");
    if (::testing::Test::HasFailure()) return;  // one case's failures are enough to read
  }
}

// What a grammar writes from a format's call_prefix / call_suffix (one call,
// or parallel calls repeated with whitespace between) is read back as calls.
TEST(ToolCalls, GrammarShapedCallsParse) {
  const std::string j1 = R"({"name": "a", "arguments": {"x": 1}})", j2 = R"({"name": "b", "arguments": {}})";
  for (ToolCallSyntax s : {ToolCallSyntax::kHermes, ToolCallSyntax::kLlama3, ToolCallSyntax::kMistral,
                           ToolCallSyntax::kGeneric}) {
    const ChatOutputFormat f = ebb::chat_output_format(s);
    Case one{"grammar one call", s, false, false, true, f.call_prefix + j1 + f.call_suffix, "", "", {{"a", R"({"x":1})"}}};
    Case two{"grammar parallel calls", s, false, false, true,
             f.call_prefix + j1 + f.call_suffix + "\n" + f.call_prefix + j2 + f.call_suffix, "", "",
             {{"a", R"({"x":1})"}, {"b", "{}"}}};
    for (const Case& c : {one, two}) {
      SCOPED_TRACE(std::string(ebb::tool_call_syntax_name(s)));
      expect_parsed(ebb::parse_chat_output(f, c.text, true, counting_ids()), c, "whole");
      for (size_t k = 0; k <= c.text.size(); ++k) expect_parsed(stream(c, {k}), c, "split at " + std::to_string(k));
    }
  }
}

// Random texts built from the markers' pieces, JSON and prose, in every
// format: the stream equals the whole parse however the text is cut.
TEST(ToolCalls, RandomTextsStreamAsTheyParse) {
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_", "</th", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
      "[TOOL", "<|python_tag|>", "<|py", "{", "}", "[", "]", "\"name\"", "\"arguments\"", "\"parameters\"", ":",
      ",", "\"f\"", "{}", "{\"a\": 1}", "\"", "\\", " ", "\n", ";", "text", "x.call(q=\"1\")", "f",
      R"({"name": "g", "arguments": {"k": [1, "}"]}})", "\xc3\xa9",
      R"(<tool_call>{"name": "h", "arguments": {}}</tool_call>)", R"([TOOL_CALLS]h[ARGS]{"x": "]"})",
      R"([TOOL_CALLS][{"name": "h", "arguments": {}}])", R"({"name": "h", "parameters": {"p": null}})"};
  std::mt19937_64 rng(1234);
  int calls_seen = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Case c{"random", static_cast<ToolCallSyntax>(rng() % 4), rng() % 2 == 0, rng() % 4 == 0, rng() % 4 != 0, "", "",
           "", {}};
    const size_t n = 1 + rng() % 14;
    for (size_t i = 0; i < n; ++i) c.text += pieces[rng() % pieces.size()];
    ParsedOutput whole;
    ASSERT_NO_THROW(whole = ebb::parse_chat_output(format_of(c), c.text, c.tools, counting_ids())) << c.text;
    c.content = whole.content;
    c.reasoning = whole.reasoning_content;
    for (const ebb::ToolCall& t : whole.tool_calls) {
      c.calls.push_back({t.name, t.arguments});
      EXPECT_FALSE(t.name.empty());
      EXPECT_EQ(t.arguments.front(), '{') << c.text;
    }
    calls_seen += static_cast<int>(whole.tool_calls.size());
    std::vector<size_t> cuts;
    for (size_t k = 1; k < c.text.size(); ++k)
      if (rng() % 3 == 0) cuts.push_back(k);
    expect_parsed(stream(c, cuts), c, "random cuts of [" + c.text + "]");
    std::vector<size_t> bytes;
    for (size_t k = 1; k < c.text.size(); ++k) bytes.push_back(k);
    expect_parsed(stream(c, bytes), c, "bytes of [" + c.text + "]");
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(calls_seen, 50);  // the texts do exercise the calls
}

TEST(ToolCalls, StreamHoldsBackAPossibleMarker) {
  ebb::ChatStreamParser p(ebb::chat_output_format(ToolCallSyntax::kHermes), true, counting_ids());
  std::vector<ChatDelta> d = p.feed("Hello <tool_c");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, ChatDelta::Kind::kContent);
  EXPECT_EQ(d[0].text, "Hello");  // the space waits too: it may end the content
  d = p.feed("all>\n{\"name\": \"f\", \"arguments\": {\"a\"");
  EXPECT_TRUE(d.empty());  // a call is held until it is complete
  d = p.feed(": 1}}\n</tool_call>");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, ChatDelta::Kind::kToolCall);
  EXPECT_EQ(d[0].index, 0);
  EXPECT_EQ(d[0].id, "call_0");
  EXPECT_EQ(d[0].name, "f");
  EXPECT_EQ(d[1].kind, ChatDelta::Kind::kToolArguments);
  EXPECT_EQ(d[1].index, 0);
  EXPECT_EQ(d[1].text, R"({"a":1})");
  d = p.feed(" after");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "  after");  // the spaces around the call, once text follows
  EXPECT_TRUE(p.finish().empty());
  EXPECT_THROW(p.feed("x"), std::logic_error);
}

TEST(ToolCalls, StreamGivesContentAndReasoningAsTheyCome) {
  ebb::ChatStreamParser p(ebb::chat_output_format(ToolCallSyntax::kHermes, true), false, counting_ids());
  std::vector<ChatDelta> d = p.feed("<think>\nStep one");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, ChatDelta::Kind::kReasoning);
  EXPECT_EQ(d[0].text, "Step one");
  d = p.feed(". </th");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, ".");
  d = p.feed("ink>\n\nThe answer");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, ChatDelta::Kind::kContent);
  EXPECT_EQ(d[0].text, "The answer");
}

TEST(ToolCalls, CallIds) {
  std::mt19937_64 a(7), b(7);
  const std::string x = ebb::make_call_id(a), y = ebb::make_call_id(a);
  EXPECT_EQ(x.substr(0, 5), "call_");
  EXPECT_EQ(x.size(), 29u);
  for (char c : x.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << x;
  EXPECT_NE(x, y);
  EXPECT_EQ(ebb::make_call_id(b), x);  // the generator decides: tests can be deterministic
  // The parser takes its ids from the function it is given.
  const ParsedOutput o = ebb::parse_chat_output(ebb::chat_output_format(ToolCallSyntax::kHermes),
                                                "<tool_call>" + kWeather + "</tool_call>", true,
                                                [&] { return ebb::make_call_id(b); });
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].id, y);
}

TEST(ToolCalls, DetectsTheFormatFromTheTemplate) {
  using S = ToolCallSyntax;
  const auto det = [](std::string_view t, std::string_view arch = "llama") {
    return ebb::detect_chat_output_format(t, arch);
  };
  EXPECT_EQ(det("{% for tool in tools %}<tool_call>{{ tool }}</tool_call>{% endfor %}<|im_start|>").syntax, S::kHermes);
  EXPECT_FALSE(det("<tool_call><|im_start|>").thinking);
  EXPECT_TRUE(det("<|im_start|>{% if reasoning %}<think>{% endif %}<tool_call>").thinking);
  EXPECT_EQ(det("[INST]{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]").syntax, S::kMistral);
  EXPECT_EQ(det("<|start_header_id|>ipython<|end_header_id|><|python_tag|>").syntax, S::kLlama3);
  EXPECT_EQ(det("<|start_header_id|>user<|end_header_id|>").syntax, S::kLlama3);
  EXPECT_EQ(det("<|im_start|>user").syntax, S::kGeneric);
  EXPECT_EQ(det("", "qwen2").syntax, S::kHermes);
  EXPECT_TRUE(det("", "qwen3").thinking);
  EXPECT_EQ(det("", "llama").syntax, S::kGeneric);
  const ChatOutputFormat h = ebb::chat_output_format(S::kHermes, true);
  EXPECT_EQ(h.triggers, std::vector<std::string>{"<tool_call>"});
  const std::set<std::string> kept(h.preserved_tokens.begin(), h.preserved_tokens.end());
  EXPECT_TRUE(kept.count("<tool_call>") && kept.count("</tool_call>") && kept.count("<think>") && kept.count("</think>"));
  const ChatOutputFormat l = ebb::chat_output_format(S::kLlama3);
  EXPECT_EQ(l.arguments_key, "parameters");
  EXPECT_EQ(l.start_triggers, std::vector<std::string>{"{"});
  EXPECT_EQ(ebb::tool_call_syntax_name(S::kMistral), "mistral");
}

TEST(ToolCalls, PromptOpensThink) {
  const ChatOutputFormat f = ebb::chat_output_format(ToolCallSyntax::kHermes, true);
  EXPECT_TRUE(ebb::prompt_opens_think("<|im_start|>assistant\n<think>\n", f));
  EXPECT_FALSE(ebb::prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n", f));
  EXPECT_FALSE(ebb::prompt_opens_think("<|im_start|>assistant\n", f));
}

TEST(ToolCalls, NeverThrowsOnOddText) {
  // Deep nesting, stray brackets and invalid UTF-8 inside calls.
  const std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(2000, '[') + "}</tool_call>";
  const std::vector<std::string> odd = {deep, "<tool_call>}}}]]]</tool_call>",
                                        "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\xff\xfe\"}}</tool_call>",
                                        "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS]f[CALL_ID]", "<|python_tag|>x.call(",
                                        "{\"tool_calls\": 5}", std::string("\0<tool_call>\0", 13)};
  for (ToolCallSyntax s : {ToolCallSyntax::kHermes, ToolCallSyntax::kLlama3, ToolCallSyntax::kMistral,
                           ToolCallSyntax::kGeneric}) {
    for (const std::string& t : odd) {
      ParsedOutput o;
      EXPECT_NO_THROW(o = ebb::parse_chat_output(ebb::chat_output_format(s, true), t, true, counting_ids())) << t;
      for (const ebb::ToolCall& c : o.tool_calls) EXPECT_FALSE(c.name.empty());
    }
  }
}

}  // namespace
