// JSON in and out of the engine's values.
//
// to_json_text is Python's json.dumps as transformers' tojson filter calls
// it: ensure_ascii=False by default, separators ", " and ": " (or "," and
// ": " with an indent), floats as Python's repr, NaN/Infinity as Python
// writes them, dict keys in insertion order unless sort_keys. Values JSON
// cannot hold (undefined, generators, namespaces, functions) throw Fail
// "Object of type X is not JSON serializable", as json.dumps raises.
//
// from_json converts request data (messages, tools) into values; objects
// keep the order of the json type's iteration, so pass nlohmann::ordered_json
// to keep the order the client sent (nlohmann::json sorts keys).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/jinja/value.h"

namespace ebb::jinja {

struct JsonDumpOptions {
  std::optional<std::string> indent;  // null: one line; else the indent unit (N spaces for indent=N)
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
  size_t max_bytes = size_t(4) << 20;  // Fail past this size
};

std::string to_json_text(const Value& v, const JsonDumpOptions& opts);

// Throws ebb::Error when the data nest deeper than kMaxValueDepth.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace ebb::jinja
