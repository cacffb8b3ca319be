// What a template can do to values, with Jinja2's (sandboxed) semantics:
// operators and subscripts (ops.cpp), methods of str, list and dict
// (methods.cpp), filters (filters.cpp), tests (tests.cpp) and the global
// functions (globals.cpp). Each throws jinja::Fail with Python's or
// Jinja2's message on misuse; the renderer adds the template position.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/jinja/value.h"

namespace ebb::jinja {

class Renderer;

// obj.name, as the sandbox does it: a method of str/list/dict first (the
// ones that mutate are refused with an undefined that fails when called),
// then the dict key, else an undefined value naming what was missing.
Value get_attr(const Value& obj, std::string_view name);
// obj[key]: a dict key, a list or string index (negative from the end),
// else obj.key for string keys, else undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] for lists, tuples and strings (null: omitted).
Value get_slice(Renderer& r, const Value& obj, const Value* start, const Value* stop, const Value* step);
// a op b for + - * / // % ** ~.
Value binary_op(Renderer& r, std::string_view op, const Value& a, const Value& b);
// item in container.
bool contains(const Value& container, const Value& item);
// Python's hash() would accept it (a dict key, the left of `in dict`).
bool is_hashable(const Value& v);
// -a, +a.
Value unary_op(std::string_view op, const Value& a);

// obj.name(args) when name is a method of obj's type; nullopt when it is not
// (the caller then looks the attribute up and calls it).
std::optional<Value> call_method(Renderer& r, const Value& obj, std::string_view name, CallArgs& args);
// A bound method as a value (obj.name without the call).
Value bound_method(const Value& obj, std::string_view name);
bool has_method(const Value& obj, std::string_view name);
// str.format / the format filter / the % operator on strings.
std::string py_format(Renderer& r, const std::string& fmt, const CallArgs& args);
std::string py_percent(Renderer& r, const std::string& fmt, const Value& args);
// Python's str.split / strip family on code points.
bool is_py_space(uint32_t cp);

// markupsafe's escape: & < > " ' as entities.
std::string html_escape(const std::string& s);

Value apply_filter(Renderer& r, std::string_view name, const Value& v, CallArgs& args);
bool has_filter(std::string_view name);
bool apply_test(Renderer& r, std::string_view name, const Value& v, CallArgs& args);
bool has_test(std::string_view name);

// raise_exception, strftime_now, namespace, range, dict, cycler, joiner.
Value make_global(std::string_view name);
const char* const* global_names();  // null-terminated

}  // namespace ebb::jinja
