// Helpers shared by openai_request.cpp and openai_messages.cpp (not a public
// header): typed reads of a request's fields, each throwing ApiException
// (400) that names the field. `name` is the field's key in `obj`; `param` is
// its path in the request for the message ("messages[2].tool_calls[0].id").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "serve/openai.h"

namespace ebb::serve::detail {

// The field, or nullptr when absent or null.
const nlohmann::json* field(const nlohmann::json& obj, const char* name);

[[noreturn]] void bad(const std::string& param, const std::string& what);

double number(const nlohmann::json& obj, const char* name, const std::string& param);
int64_t integer(const nlohmann::json& obj, const char* name, const std::string& param);
bool boolean(const nlohmann::json& obj, const char* name, const std::string& param);
std::string string_field(const nlohmann::json& obj, const char* name, const std::string& param);

// For top-level fields, param is the name.
inline double number(const nlohmann::json& b, const char* n) { return number(b, n, n); }
inline int64_t integer(const nlohmann::json& b, const char* n) { return integer(b, n, n); }
inline bool boolean(const nlohmann::json& b, const char* n) { return boolean(b, n, n); }
inline std::string string_field(const nlohmann::json& b, const char* n) { return string_field(b, n, n); }

// ^[a-zA-Z0-9_-]{1,64}$ (OpenAI's rule for function and schema names).
bool valid_function_name(const std::string& s);

// openai_messages.cpp: messages, tools, tool_choice, response_format.
void read_messages(const nlohmann::json& body, CompletionRequest& r);
void read_tools(const nlohmann::json& body, CompletionRequest& r);
void read_response_format(const nlohmann::json& body, CompletionRequest& r);

}  // namespace ebb::serve::detail
