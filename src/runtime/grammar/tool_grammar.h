// A grammar for tool calls, from the OpenAI `tools` array:
//   {"name": <one of the tools' names>, "arguments": <that tool's parameters>}
// with the arguments constrained by the tool's `parameters` JSON Schema
// (json_schema.h; a tool without parameters takes the empty object {}).
// The key order is fixed: "name" first, then "arguments".
//
// Optionally wrapped: prefix + call + suffix (e.g. "<tool_call>\n" and
// "\n</tool_call>", Qwen/Hermes style), and optionally repeated for parallel
// calls, separated by optional whitespace (at most one newline or space
// run, as between JSON tokens). With a prefix, the grammar begins with it,
// so it suits a lazy constraint triggered by the prefix (constraint.h).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace ebb::grammar {

struct ToolCallGrammarOptions {
  std::string prefix;     // text before each call ("": none)
  std::string suffix;     // text after each call
  bool parallel = false;  // one or more calls instead of exactly one
};

// Throws ebb::Error naming the tool (by index) whose entry is malformed, or
// the schema error of its parameters; or when `tools` is empty.
std::string tool_call_gbnf(const nlohmann::ordered_json& tools, const ToolCallGrammarOptions& opts = {});
std::string tool_call_gbnf(std::string_view tools_json, const ToolCallGrammarOptions& opts = {});

}  // namespace ebb::grammar
