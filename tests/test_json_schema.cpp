// JSON Schema -> grammar tests. Every schema of the corpus comes with texts
// that must be accepted and texts that must be refused, run through the
// matcher byte by byte; each accepted text is also checked valid, and each
// refused one invalid, by a small reference validator written here from the
// JSON Schema rules. Random walks over each grammar's allowed bytes then
// produce texts that must all be valid JSON and valid against the schema.
// Also: exact integer ranges, unsupported keywords and regex constructs as
// errors that name them, and the tool-call grammar.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "platform/error.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/grammar_matcher.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/tool_grammar.h"

namespace ebb::grammar {
namespace {

using ojson = nlohmann::ordered_json;

// --- the reference validator ---------------------------------------------------

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::wstring wide(const std::string& s) {
  std::wstring out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : 3;
    uint32_t cp = extra ? c & (0x3F >> extra) : c;
    for (int k = 1; k <= extra && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out += static_cast<wchar_t>(cp);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

bool type_ok(const ojson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

bool valid(const ojson& v, const ojson& s, const ojson& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) return valid(v, root.at(ojson::json_pointer(s["$ref"].get<std::string>().substr(1))), root);
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  if (s.contains("anyOf") && std::none_of(s["anyOf"].begin(), s["anyOf"].end(), [&](const ojson& x) { return valid(v, x, root); }))
    return false;
  if (s.contains("oneOf") &&
      std::count_if(s["oneOf"].begin(), s["oneOf"].end(), [&](const ojson& x) { return valid(v, x, root); }) != 1)
    return false;
  if (s.contains("allOf") && !std::all_of(s["allOf"].begin(), s["allOf"].end(), [&](const ojson& x) { return valid(v, x, root); }))
    return false;
  if (s.contains("type")) {
    const ojson& t = s["type"];
    if (t.is_string() && !type_ok(v, t.get<std::string>())) return false;
    if (t.is_array() && std::none_of(t.begin(), t.end(), [&](const ojson& x) { return type_ok(v, x.get<std::string>()); }))
      return false;
  }
  if (v.is_object()) {
    for (const auto& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return false;
    const ojson props = s.value("properties", ojson::object());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!valid(x, props[k], root)) return false;
      } else if (s.contains("additionalProperties") && !valid(x, s["additionalProperties"], root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    const ojson prefix = s.value("prefixItems", ojson::array());
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < prefix.size()) {
        if (!valid(v[i], prefix[i], root)) return false;
      } else if (s.contains("items") && !valid(v[i], s["items"], root)) {
        return false;
      }
    }
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    if (s.contains("minLength") && code_points(str) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<size_t>()) return false;
    // std::regex matches bytes; wregex on the code points matches characters.
    if (s.contains("pattern") && !std::regex_search(wide(str), std::wregex(wide(s["pattern"].get<std::string>()))))
      return false;
    const std::string f = s.value("format", "");
    const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
    const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))";
    if (f == "date" && !std::regex_match(str, std::regex(date))) return false;
    if (f == "time" && !std::regex_match(str, std::regex(time))) return false;
    if (f == "date-time" && !std::regex_match(str, std::regex(date + "[Tt]" + time))) return false;
    if (f == "uuid" && !std::regex_match(str, std::regex("[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"))) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  return true;
}

// Valid JSON and valid against the schema.
bool reference_ok(const std::string& text, const ojson& schema) {
  ojson v;
  try {
    v = ojson::parse(text);
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return valid(v, schema, schema);
}

bool grammar_ok(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

// A random sentence from the grammar's allowed bytes; "" when the walk ran
// long. Fails the test if a state that is not accepting allows no byte.
// Bytes in `hint` (the schema's text) are preferred, so that walks find
// the literals a pattern needs.
std::string random_sentence(GrammarMatcher& m, std::mt19937& rng, const std::string& hint) {
  GrammarMatcher::StateId st = m.state();
  std::string text;
  while (text.size() < 300) {
    std::vector<uint8_t> allowed, ascii, closing, hinted;
    for (int b = 0; b < 256; ++b) {
      if (m.step(st, static_cast<uint8_t>(b)) == GrammarMatcher::kReject) continue;
      allowed.push_back(static_cast<uint8_t>(b));
      if (b < 0x80) ascii.push_back(static_cast<uint8_t>(b));
      if (b == '"' || b == '}' || b == ']') closing.push_back(static_cast<uint8_t>(b));
      if (hint.find(static_cast<char>(b)) != std::string::npos) hinted.push_back(static_cast<uint8_t>(b));
    }
    if (m.is_accepting(st) && (allowed.empty() || rng() % 3 == 0)) return text;
    EXPECT_FALSE(allowed.empty()) << "dead end after: " << testing::PrintToString(text);
    if (allowed.empty()) return "";
    const std::vector<uint8_t>& pool = !closing.empty() && rng() % 2   ? closing
                                       : !hinted.empty() && rng() % 2  ? hinted
                                       : !ascii.empty() && rng() % 10 ? ascii
                                                                       : allowed;
    const uint8_t b = pool[rng() % pool.size()];
    text += static_cast<char>(b);
    st = m.step(st, b);
  }
  return "";
}

struct Case {
  const char* schema;
  std::vector<const char*> good, bad;
};

const Case kCorpus[] = {
    {"{}", {"1", "{\"a\": [true, null]}", "\"x\""}, {"{", "[1,]", "nul"}},
    {"true", {"-2.5e3", "[]"}, {"[}"}},
    {R"({"type":"string"})", {"\"abc\"", "\"\"", "\"a\\\"b\\u00e9\""}, {"1", "\"a", "null"}},
    {R"({"type":"number"})", {"0", "-1.5", "2e10", "-0.25E-3"}, {"\"1\"", "true", "[1]"}},
    {R"({"type":"integer"})", {"0", "-12", "123456789"}, {"1.5", "\"1\"", "true"}},
    {R"({"type":"boolean"})", {"true", "false"}, {"1", "\"true\""}},
    {R"({"type":"null"})", {"null"}, {"0", "\"null\""}},
    {R"({"type":["string","null"]})", {"\"a\"", "null"}, {"1", "false"}},
    {R"({"enum":["red",1,null,{"a":1}]})", {"\"red\"", "1", "null", "{\"a\":1}"}, {"\"blue\"", "2", "{\"a\":2}"}},
    {R"({"const":"x"})", {"\"x\""}, {"\"y\"", "1"}},
    {R"({"type":"string","enum":["a",1,"b"]})", {"\"a\"", "\"b\""}, {"1", "\"c\""}},
    {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"],"additionalProperties":false})",
     {"{\"a\":1}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\": 1, \"b\": \"x\" }", "{\n  \"a\": 1\n}"},
     {"{}", "{\"b\":\"x\"}", "{\"a\":1,\"c\":2}", "{\"a\":\"1\"}", "[]"}},
    {R"({"properties":{"a":{"type":"integer"}},"additionalProperties":true})",
     {"{\"a\":1,\"z\":[1]}", "{\"z\":{}}", "{}", "{\"ab\":\"s\"}"},
     {"{\"a\":\"x\"}", "{\"a\":1,\"a\":\"x\"}", "{\"z\":1,\"a\":\"s\"}"}},
    {R"({"type":"object","additionalProperties":{"type":"integer"}})", {"{\"x\":1,\"y\":2}", "{}"}, {"{\"x\":\"a\"}", "[]"}},
    {R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]},"minItems":1,"maxItems":2})",
     {"[{\"id\":1}]", "[{\"id\":1}, {\"id\":2}]"},
     {"[]", "[{\"id\":1},{\"id\":2},{\"id\":3}]", "[{}]"}},
    {R"({"type":"array","items":{"type":"integer"},"minItems":2})", {"[1,2]", "[1, 2, 3, 4]"}, {"[1]", "[]", "[1,\"2\"]"}},
    {R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
     {"[\"a\",1]", "[\"a\", 1]"},
     {"[1,\"a\"]", "[\"a\",1,2]"}},
    {R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"5", "\"ab\""}, {"\"abc\"", "true"}},
    {R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"1"}},
    {R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"boolean"}},"required":["b"]}]})",
     {"{\"a\":1,\"b\":true}"},
     {"{\"a\":1}", "{\"b\":true}", "{\"a\":1,\"b\":2}"}},
    {R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"]}},"$ref":"#/$defs/node"})",
     {"{\"value\":1}", "{\"value\":1,\"children\":[{\"value\":2,\"children\":[]},{\"value\":3}]}"},
     {"{\"value\":1,\"children\":[{}]}", "{\"children\":[]}"}},
    {R"({"definitions":{"pos":{"type":"integer","minimum":0}},"type":"object","properties":{"n":{"$ref":"#/definitions/pos"}}})",
     {"{\"n\":0}", "{\"n\":17}", "{}"},
     {"{\"n\":-1}", "{\"n\":1.5}"}},
    {R"({"type":"integer","minimum":1,"maximum":10})", {"1", "7", "10"}, {"0", "11", "-1", "100"}},
    {R"({"type":"string","minLength":2,"maxLength":4})", {"\"ab\"", "\"abcd\"", "\"\\u00e9x\"", "\"日本\""}, {"\"a\"", "\"abcde\"", "\"\""}},
    {R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3,4}$"})", {"\"AB-123\"", "\"XY-9999\""}, {"\"ab-123\"", "\"AB-12\"", "\"AB-12345\""}},
    {R"({"type":"string","pattern":"ab+c"})", {"\"xxabbc\"", "\"abc\"", "\"abcyy\""}, {"\"ac\"", "\"xyz\""}},
    {R"({"type":"string","pattern":"^(foo|ba(r|z))+(?:-x)?$"})", {"\"foo\"", "\"barbaz-x\""}, {"\"fo\"", "\"-x\"", "\"foo-\""}},
    {R"({"type":"string","pattern":"^a.c[^0-9]?$"})", {"\"abc\"", "\"a\\\"c\"", "\"a c!\""}, {"\"ac\"", "\"abc1\""}},
    {R"({"type":"string","format":"date"})", {"\"2024-02-29\""}, {"\"2024-13-01\"", "\"24-01-01\""}},
    {R"({"type":"string","format":"time"})", {"\"12:30:00Z\"", "\"23:59:59.123+02:00\""}, {"\"24:00:00Z\"", "\"12:30\""}},
    {R"({"type":"string","format":"date-time"})", {"\"2024-01-02T03:04:05Z\""}, {"\"2024-01-02 03:04:05Z\""}},
    {R"({"type":"string","format":"uuid"})", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123e4567\""}},
    {R"({"type":"number","minimum":0})", {"0", "1.5", "3e2"}, {"-1", "-0.5"}},
};

TEST(JsonSchema, CorpusAcceptsValidRefusesInvalid) {
  for (const Case& c : kCorpus) {
    SCOPED_TRACE(c.schema);
    const ojson schema = ojson::parse(c.schema);
    const std::string gbnf = json_schema_to_gbnf(std::string_view(c.schema));
    const auto g = Grammar::parse(gbnf);
    for (const char* s : c.good) {
      EXPECT_TRUE(grammar_ok(g, s)) << "grammar refuses " << s << "\n" << gbnf;
      EXPECT_TRUE(reference_ok(s, schema)) << "the corpus lists an invalid text as good: " << s;
    }
    for (const char* s : c.bad) {
      EXPECT_FALSE(grammar_ok(g, s)) << "grammar accepts " << s << "\n" << gbnf;
      EXPECT_FALSE(reference_ok(s, schema)) << "the corpus lists a valid text as bad: " << s;
    }
  }
}

TEST(JsonSchema, RandomSentencesAreValid) {
  std::mt19937 rng(1234);
  int total = 0;
  for (const Case& c : kCorpus) {
    SCOPED_TRACE(c.schema);
    const ojson schema = ojson::parse(c.schema);
    GrammarMatcher m(Grammar::parse(json_schema_to_gbnf(std::string_view(c.schema))));
    int finished = 0;
    for (int walk = 0; walk < 60; ++walk) {
      const std::string text = random_sentence(m, rng, c.schema);
      if (text.empty()) continue;
      ++finished;
      EXPECT_TRUE(reference_ok(text, schema)) << testing::PrintToString(text);
    }
    EXPECT_GE(finished, 1);  // (an unanchored pattern rarely comes up by chance)
    total += finished;
  }
  EXPECT_GE(total, 60 * static_cast<int>(std::size(kCorpus)) / 2);
}

TEST(JsonSchema, IntegerRangesAreExact) {
  struct R {
    const char* schema;
    long lo, hi;  // the valid range, tested over [lo - 300, hi + 300] (clamped to +-5000)
  };
  const R ranges[] = {
      {R"({"type":"integer","minimum":-123,"maximum":456})", -123, 456},
      {R"({"type":"integer","minimum":7,"maximum":1234})", 7, 1234},
      {R"({"type":"integer","minimum":0})", 0, 1000000},
      {R"({"type":"integer","exclusiveMinimum":0})", 1, 1000000},
      {R"({"type":"integer","exclusiveMaximum":100})", -1000000, 99},
      {R"({"type":"integer","maximum":-10})", -1000000, -10},
      {R"({"type":"integer","minimum":-99,"maximum":-5})", -99, -5},
      {R"({"type":"integer","minimum":1.5,"maximum":20.5})", 2, 20},
      {R"({"type":"integer","minimum":90,"maximum":1100})", 90, 1100},
  };
  for (const R& r : ranges) {
    SCOPED_TRACE(r.schema);
    const auto g = Grammar::parse(json_schema_to_gbnf(std::string_view(r.schema)));
    GrammarMatcher m(g);
    for (long v = std::max(r.lo - 300, -5000L); v <= std::min(r.hi + 300, 5000L); ++v) {
      m.reset();
      const bool ok = m.accept_bytes(std::to_string(v)) && m.is_accepting();
      ASSERT_EQ(ok, v >= r.lo && v <= r.hi) << v;
    }
    m.reset();
    EXPECT_FALSE(m.accept_bytes("007") && m.is_accepting());  // no leading zeros
  }
}

std::string schema_error(const std::string& schema) {
  try {
    json_schema_to_gbnf(std::string_view(schema));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"not":{"type":"string"}})", "'not'"},
      {R"({"type":"object","properties":{"a":{"if":{},"then":{}}}})", "'if'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"integer","multipleOf":3})", "'multipleOf'"},
      {R"({"type":"object","patternProperties":{"^a":{}}})", "'patternProperties'"},
      {R"({"type":"object","minProperties":1})", "'minProperties'"},
      {R"({"type":"number","maximum":1.5})", "bounds on a number"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreference"},
      {R"({"type":"string","pattern":"(?=a)b"})", "lookaround"},
      {R"({"type":"string","pattern":"\\bword"})", "word boundary"},
      {R"({"type":"string","pattern":"a^b"})", "anchor '^'"},
      {R"({"type":"string","pattern":"^a$","maxLength":3})", "'pattern' together with"},
      {R"({"$ref":"#/$defs/missing"})", "points to nothing"},
      {R"({"$ref":"http://example.com/s.json"})", "not local"},
      {R"({"type":"object","properties":{"a":false}})", "false accepts nothing"},
      {R"({"type":"strin"})", "unknown type"},
      {R"({"type":"array","minItems":3,"maxItems":2})", "maxItems < minItems"},
      {R"({"type":"integer","enum":["a","b"]})", "no value of 'enum'"},
      {"{\"type\":", "not valid JSON"},
  };
  for (const auto& [schema, want] : cases) {
    const std::string e = schema_error(schema);
    EXPECT_NE(e.find(want), std::string::npos) << schema << " -> " << e;
  }
  // Nesting is bounded (the compiler recurses).
  std::string deep = "{\"type\":\"string\"}";
  for (int i = 0; i < 1000; ++i) deep = "{\"type\":\"array\",\"items\":" + deep + "}";
  EXPECT_NE(schema_error(deep).find("nested more than"), std::string::npos);
  // Where: a JSON pointer to the offending schema.
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"a":{"not":{}}}})").find("#/properties/a"), std::string::npos);
  // uniqueItems false and minProperties 0 change nothing and pass.
  EXPECT_EQ(schema_error(R"({"type":"array","uniqueItems":false,"items":{"type":"integer"}})"), "");
}

TEST(JsonSchema, JsonObjectAndWhitespaceBound) {
  const auto g = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(grammar_ok(g, "{}"));
  EXPECT_TRUE(grammar_ok(g, "{\"a\": {\"b\": [1, \"x\"]}}"));
  EXPECT_FALSE(grammar_ok(g, "[]"));
  EXPECT_FALSE(grammar_ok(g, "1"));
  // Whitespace is bounded: one newline and up to 32 spaces, not more.
  EXPECT_TRUE(grammar_ok(g, "{\n" + std::string(32, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(grammar_ok(g, "{\n" + std::string(33, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(grammar_ok(g, "{\n\n\"a\": 1}"));
  EXPECT_FALSE(grammar_ok(g, "{  \"a\": 1}"));
}

TEST(ToolGrammar, NamesAndArguments) {
  const char* tools = R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"unit":{"enum":["C","F"]}},"required":["city"]}}},
    {"type":"function","function":{"name":"noop"}}])";
  const auto g = Grammar::parse(tool_call_gbnf(std::string_view(tools)));
  EXPECT_TRUE(grammar_ok(g, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"));
  EXPECT_TRUE(grammar_ok(g, R"({"name":"get_weather","arguments":{"city":"Oslo","unit":"C"}})"));
  EXPECT_TRUE(grammar_ok(g, R"({"name": "noop", "arguments": {}})"));
  EXPECT_FALSE(grammar_ok(g, R"({"name": "get_weather", "arguments": {}})"));       // city is required
  EXPECT_FALSE(grammar_ok(g, R"({"name": "noop", "arguments": {"city": "x"}})"));   // another tool's arguments
  EXPECT_FALSE(grammar_ok(g, R"({"name": "other", "arguments": {}})"));
  EXPECT_FALSE(grammar_ok(g, R"({"arguments": {}, "name": "noop"})"));

  ToolCallGrammarOptions wrap;
  wrap.prefix = "<tool_call>\n";
  wrap.suffix = "\n</tool_call>";
  wrap.parallel = true;
  const auto gw = Grammar::parse(tool_call_gbnf(std::string_view(tools), wrap));
  const std::string one = "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(grammar_ok(gw, one));
  EXPECT_TRUE(grammar_ok(gw, one + "\n" + one));
  EXPECT_FALSE(grammar_ok(gw, "{\"name\": \"noop\", \"arguments\": {}}"));
  wrap.parallel = false;
  EXPECT_FALSE(grammar_ok(Grammar::parse(tool_call_gbnf(std::string_view(tools), wrap)), one + "\n" + one));

  auto err = [](const char* t) {
    try {
      tool_call_gbnf(std::string_view(t));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("[]").find("non-empty"), std::string::npos);
  EXPECT_NE(err(R"([{"type":"function","function":{"name":"a"}},{"type":"x"}])").find("tools[1]"), std::string::npos);
  EXPECT_NE(err(R"([{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}])").find("twice"),
            std::string::npos);
  EXPECT_NE(err(R"([{"type":"function","function":{"name":"a","parameters":{"not":{}}}}])").find("'not'"), std::string::npos);
}

}  // namespace
}  // namespace ebb::grammar
