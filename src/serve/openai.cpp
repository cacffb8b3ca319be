// openai.h's small common pieces: errors, typed field reads, finish reasons,
// usage, SSE framing. Requests: openai_request.cpp, openai_messages.cpp;
// responses: openai_response.cpp.
#include "serve/openai.h"

#include <cmath>
#include <limits>

#include "serve/openai_internal.h"

namespace ebb::serve {

using nlohmann::json;

json ApiError::body() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

ApiError invalid_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

namespace detail {

const json* field(const json& obj, const char* name) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

void bad(const std::string& param, const std::string& what) {
  throw ApiException(invalid_request("'" + param + "' " + what, param));
}

double number(const json& obj, const char* name, const std::string& param) {
  const json& v = *field(obj, name);
  if (!v.is_number()) bad(param, "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(param, "must be finite");
  return d;
}

int64_t integer(const json& obj, const char* name, const std::string& param) {
  const json& v = *field(obj, name);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) bad(param, "is too large");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  bad(param, "must be an integer");
}

bool boolean(const json& obj, const char* name, const std::string& param) {
  const json& v = *field(obj, name);
  if (!v.is_boolean()) bad(param, "must be true or false");
  return v.get<bool>();
}

std::string string_field(const json& obj, const char* name, const std::string& param) {
  const json& v = *field(obj, name);
  if (!v.is_string()) bad(param, "must be a string");
  return v.get<std::string>();
}

bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

}  // namespace detail

std::string finish_reason(StopReason r) {
  return r == StopReason::kMaxTokens || r == StopReason::kContextFull ? "length" : "stop";
}

std::string finish_reason(StopReason r, bool made_tool_calls) {
  const std::string f = finish_reason(r);
  return made_tool_calls && f == "stop" ? "tool_calls" : f;
}

json Usage::json() const {
  return nlohmann::json{{"prompt_tokens", prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"total_tokens", prompt_tokens + completion_tokens},
                        {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

Usage total_usage(int64_t prompt_tokens, int64_t cached_tokens, std::span<const Choice> choices) {
  Usage u;
  u.prompt_tokens = prompt_tokens;
  u.cached_tokens = cached_tokens;
  for (const Choice& c : choices) u.completion_tokens += c.completion_tokens;
  return u;
}

std::string sse(const json& j) {
  // Invalid UTF-8 in generated text (a model can emit any bytes) is replaced
  // rather than thrown.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace ebb::serve
