// Python's str operations on UTF-8 text, for the methods and filters
// (methods.cpp, filters.cpp): whitespace is Python's str.isspace set,
// counts and indices are in code points.
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
// Case mapping of code points for Latin-1, Latin Extended-A, Greek,
// Cyrillic and fullwidth Latin (the rest maps to itself).
uint32_t cp_upper(uint32_t cp);
uint32_t cp_lower(uint32_t cp);
bool cp_cased(uint32_t cp);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.title(): a cased character after a cased one is lower-cased, else upper.
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);
// Jinja2's title filter (words split on whitespace and -({[<).
std::string jinja_title(std::string_view s);

}  // namespace ebb::jinja
