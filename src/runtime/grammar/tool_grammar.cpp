#include "runtime/grammar/tool_grammar.h"

#include <nlohmann/json.hpp>
#include <set>

#include "platform/error.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/schema_regex.h"

namespace ebb::grammar {

using ojson = nlohmann::ordered_json;

std::string tool_call_gbnf(const ojson& tools, const ToolCallGrammarOptions& opts) {
  if (!tools.is_array() || tools.empty()) throw Error("tool grammar: `tools` must be a non-empty array");
  JsonSchemaConverter c;
  const std::string ws = c.primitive("ws");
  std::set<std::string> seen;
  std::string calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tool grammar: tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      throw Error(where + " is not {\"type\": \"function\", \"function\": {...}}");
    const ojson& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      throw Error(where + ".function.name is missing or not a non-empty string");
    const std::string name = f["name"].get<std::string>();
    if (!seen.insert(name).second) throw Error(where + ": the name \"" + name + "\" appears twice");
    std::string args;
    if (f.contains("parameters")) {
      try {
        args = c.add_schema(f["parameters"], "tool-" + std::to_string(i) + "-args");
      } catch (const Error& e) {
        throw Error(where + " (" + name + ") parameters: " + e.what());
      }
    } else {
      args = "\"{\" " + ws + " \"}\"";
    }
    calls += std::string(calls.empty() ? "" : "\n  | ") + gbnf_literal(ojson(name).dump()) + " " + ws + " \",\" " + ws +
             " \"\\\"arguments\\\"\" " + ws + " \":\" " + ws + " " + args + " " + ws;
  }
  c.add_rule("tool-call", "\"{\" " + ws + " \"\\\"name\\\"\" " + ws + " \":\" " + ws + " (\n    " + calls + "\n  ) \"}\"");
  std::string one = "tool-call";
  if (!opts.prefix.empty() || !opts.suffix.empty()) {
    one = "tool-call-wrapped";
    c.add_rule(one, (opts.prefix.empty() ? "" : gbnf_literal(opts.prefix) + " ") + "tool-call" +
                        (opts.suffix.empty() ? "" : " " + gbnf_literal(opts.suffix)));
  }
  c.add_rule("root", opts.parallel ? one + " ( " + ws + " " + one + " )*" : one);
  return c.gbnf();
}

std::string tool_call_gbnf(std::string_view tools_json, const ToolCallGrammarOptions& opts) {
  ojson tools;
  try {
    tools = ojson::parse(tools_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("tool grammar: `tools` is not valid JSON: ") + e.what());
  }
  return tool_call_gbnf(tools, opts);
}

}  // namespace ebb::grammar
