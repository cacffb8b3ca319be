// The Jinja engine's value type, with Python's semantics (chat templates are
// written against Jinja2 running on CPython, so ints and floats differ, dicts
// keep insertion order, str() of a list is its Python repr, and an undefined
// value prints as nothing but fails when used).
//
// Values are cheap to copy: strings, lists, dicts, objects and callables are
// shared pointers. Strings and lists are never changed after they are built
// (the sandbox refuses list.append and the like); the only mutable objects
// are namespace() dicts, through `{% set ns.attr = ... %}`.
//
// Failures inside the engine throw jinja::Fail with a bare message; the
// renderer adds the template line and column and rethrows ebb::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "platform/error.h"

namespace ebb::jinja {

// An error without a position; the renderer names the template line.
class Fail : public ebb::Error {
 public:
  using ebb::Error::Error;
};

class Value;
class Renderer;

// A list, a tuple or a lazy sequence. `iter_type` is null for a list or a
// tuple; otherwise the Python type the value stands for ("generator" for
// map/select/..., "dict_items" for d.items()), which cannot be serialised
// by tojson and, for iterators, has no len().
struct ListObj {
  std::vector<Value> items;
  bool tuple = false;
  const char* iter_type = nullptr;
  uint32_t depth = 1;  // nesting height, bounded by kMaxValueDepth when built
  // A lazy filter's error (map over an int, say): Python raises it only when
  // the generator is consumed, so the value is a generator that fails when
  // iterated but can still be tested, compared or printed.
  std::shared_ptr<const std::string> deferred_error;
};

// Lists and dicts nested deeper than this are refused when built (a hostile
// template could otherwise nest a list a million times in a loop and
// overflow the stack when printing or freeing it).
constexpr uint32_t kMaxValueDepth = 512;
// repr() and str() of a list or dict stop with Fail past this many bytes
// (the renderer's own, smaller limits apply to what it keeps).
constexpr size_t kMaxReprBytes = size_t(64) << 20;

// An insertion-ordered dict. Namespace objects (namespace()) are dicts whose
// attributes may be assigned; they are not mappings to the `mapping` test.
struct DictObj {
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;
  uint32_t depth = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The keyword argument `name`, or the positional one at `index`, or null.
  const Value* get(std::string_view name, size_t index) const;
};

// Something a template can call: a macro, a global function, a bound method.
struct Callable {
  virtual ~Callable() = default;
  virtual Value call(Renderer& r, CallArgs& args) = 0;
  virtual std::string name() const = 0;
};

// A native object with attributes (the loop variable, cycler, joiner).
struct Object {
  virtual ~Object() = default;
  virtual Value getattr(std::string_view name) const = 0;  // Undefined if absent
  virtual std::string type_name() const = 0;
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable, Object };

class Value {
 public:
  struct UndefinedT {
    std::shared_ptr<const std::string> why;  // the message an error on use carries
  };
  struct NoneT {};
  using StrPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<ListObj>;
  using DictPtr = std::shared_ptr<DictObj>;

  Value() : v_(UndefinedT{}) {}
  static Value undefined(std::string why) {
    return Value(UndefinedT{std::make_shared<const std::string>(std::move(why))});
  }
  static Value none() { return Value(NoneT{}); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(StrPtr s) : v_(std::move(s)) {}
  Value(ListPtr l) : v_(std::move(l)) {}
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
  explicit Value(UndefinedT u) : v_(std::move(u)) {}
  explicit Value(NoneT n) : v_(n) {}
  // A string marked safe (markupsafe.Markup, from |safe or |escape):
  // `markup + str` escapes the str, as Python's Markup.__add__ does.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  bool is_markup() const { return markup_ && is_string(); }
  static Value make_list(std::vector<Value> items, bool tuple = false, const char* iter_type = nullptr);
  static Value new_dict();

  Kind kind() const { return Kind(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_callable() const { return kind() == Kind::Callable; }
  bool is_object() const { return kind() == Kind::Object; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // An int, a bool (Python's bool is an int) or a float as a double.
  double as_number() const;
  const std::string& str() const { return *std::get<StrPtr>(v_); }
  const StrPtr& str_ptr() const { return std::get<StrPtr>(v_); }
  ListObj& list() const { return *std::get<ListPtr>(v_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v_); }
  DictObj& dict() const { return *std::get<DictPtr>(v_); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(v_); }
  Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::shared_ptr<Callable>& callable_ptr() const { return std::get<std::shared_ptr<Callable>>(v_); }
  const Object& object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  // Why an undefined value is undefined ("'x' is undefined").
  const std::string& undefined_why() const;
  // Throws the undefined value's error (Jinja2's UndefinedError).
  [[noreturn]] void fail_undefined() const;

  // Nesting height: 0 for scalars, 1 for a flat list or dict.
  uint32_t nest_depth() const;

  // Identity of the shared object (for `is sameas`), null for scalars.
  const void* identity() const;

 private:
  std::variant<UndefinedT, NoneT, bool, int64_t, double, StrPtr, ListPtr, DictPtr, std::shared_ptr<Callable>,
               std::shared_ptr<Object>>
      v_;
  bool markup_ = false;
};

// Python's truthiness (generators are always true, Undefined is false).
bool truthy(const Value& v);
// str(v) as Jinja prints it: strings as they are, None as "None", Undefined
// as "", lists and dicts as their Python repr.
std::string to_str(const Value& v);
void append_str(std::string& out, const Value& v);
// repr(v): strings quoted as Python quotes them.
std::string repr(const Value& v);
void append_repr(std::string& out, const Value& v);
// Python's repr of a float: shortest round-trip digits, "1.0", "1e+16", "inf".
std::string float_repr(double d);
// The Python type name ("str", "int", "dict", "NoneType").
std::string type_name(const Value& v);
// Jinja's object_type_repr for messages: "dict object", "None", "str object".
std::string object_type_repr(const Value& v);

// ==, as Python compares (1 == 1.0 == True; Undefined == Undefined).
bool equals(const Value& a, const Value& b);
// <0, 0, >0 for <, ==, > as Python orders numbers, strings, lists and tuples;
// throws Fail ("'<' not supported between ...") otherwise.
int compare(const Value& a, const Value& b, const char* op = "<");

// Python's iteration: a list's items, a dict's keys, a string's characters;
// Undefined is empty; anything else throws Fail ("'int' object is not iterable").
std::vector<Value> iterate(const Value& v);
// len(v): throws Fail for generators and scalars.
int64_t length(const Value& v);

// UTF-8 helpers (Python strings index by code point).
size_t utf8_length(std::string_view s);
std::vector<std::string_view> utf8_chars(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);

}  // namespace ebb::jinja
