// Python's str operations on UTF-8 text, for the methods and filters
// (methods.cpp, filters.cpp): whitespace is Python's str.isspace set,
// counts and indices are in code points, case mapping is ASCII only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ebb::jinja {

class Renderer;

// Decodes the code point at s[i] (invalid bytes decode as themselves) and
// sets n to its length in bytes.
uint32_t decode_cp(std::string_view s, size_t i, size_t& n);

// str.strip(chars) / lstrip / rstrip; chars null: whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit) / rsplit; sep null: runs of whitespace.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
// str.replace(old, new, count), checking the result's size before building it.
std::string py_replace(Renderer& r, const std::string& s, const std::string& from, const std::string& to, int64_t count);
std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);

}  // namespace ebb::jinja
