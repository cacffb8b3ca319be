// Request bodies as JSON, parsed with bounds: nlohmann's DOM parser builds
// a value for every "[" it sees, so 4 MiB of "[" became 4 million nested
// arrays (322 MB). This parser builds the same DOM through nlohmann's SAX
// interface and stops at a nesting depth or a value count, and names the
// field of a number that does not fit a double ("max_tokens": 1e400).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace ebb::serve {

struct JsonLimits {
  size_t max_depth = 64;          // nested arrays and objects
  size_t max_values = 1u << 20;   // values of any kind in the document
};

struct JsonError {
  std::string message;  // what and where ("byte 12: ...")
  std::string field;    // the field a bad number was in ("max_tokens", "messages[0].content"), or ""
};

// The document, or false with `err` set (no exception for bad input).
bool parse_json_bounded(std::string_view text, const JsonLimits& lim, nlohmann::json& out, JsonError& err);

}  // namespace ebb::serve
