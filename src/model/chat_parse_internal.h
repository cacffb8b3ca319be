// chat_parse's pieces shared by its two files (not a public header):
// chat_parse.cpp (formats, reading a call's text into name + arguments) and
// chat_stream.cpp (the incremental parser).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_parse.h"

namespace ebb::chat_detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Where a JSON object or array that starts at s[pos] ('{' or '[') ends.
// Structural only (brackets and strings); the text is validated afterwards.
struct JsonScan {
  enum class Status { kComplete, kIncomplete, kInvalid } status = Status::kIncomplete;
  size_t end = 0;  // kComplete: one past the closing bracket; kInvalid: the offending byte
};
JsonScan scan_json(std::string_view s, size_t pos);

struct NamedCall {
  std::string name;
  std::string arguments;  // compact JSON object
};

// One call object: {"name", "arguments" | "parameters"} or OpenAI's
// {"type": "function", "function": {"name", "arguments"}}; arguments an
// object or a string holding one. args_optional: absent arguments are {}.
std::optional<NamedCall> call_from_json_text(std::string_view text, bool args_optional);

// The calls in a complete JSON value written as a tool call by `syntax`
// (one object, or an array of them; kGeneric's {"tool_calls": [...]}).
// content receives kGeneric's "content" / "response" string. nullopt when
// the value is not (all) calls.
std::optional<std::vector<NamedCall>> calls_from_json_value(std::string_view text, ToolCallSyntax syntax,
                                                            bool args_optional, std::string* content);

// A Llama 3 built-in call: `name.call(key="value", n=3)`, whole text.
std::optional<NamedCall> builtin_call(std::string_view text);

// The calls after <|python_tag|> (the rest of the output): JSON objects
// separated by ';' or whitespace, or one built-in call.
std::optional<std::vector<NamedCall>> python_tag_calls(std::string_view body);

}  // namespace ebb::chat_detail
