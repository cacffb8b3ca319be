// Methods of str, list and dict as the immutable sandbox exposes them
// (builtins.h). Counts and indices are in code points, as in Python.
#include <algorithm>
#include <cstring>

#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"
#include "model/jinja/strings.h"

namespace ebb::jinja {

namespace {

const char* const kStrMethods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                   "replace", "upper", "lower", "title", "capitalize", "format", "join", "find",
                                   "rfind", "index", "count", "splitlines", "isdigit", "isalpha", "isalnum",
                                   "isspace", "islower", "isupper", "swapcase", "casefold", "center", "ljust",
                                   "rjust", "zfill", "removeprefix", "removesuffix", "partition", "rpartition",
                                   "isnumeric", "isdecimal", "istitle", nullptr};
const char* const kListMethods[] = {"index", "count", "copy", nullptr};
const char* const kListUnsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", nullptr};
const char* const kDictMethods[] = {"items", "keys", "values", "get", "copy", nullptr};
const char* const kDictUnsafe[] = {"pop", "popitem", "setdefault", "update", "clear", nullptr};

bool in_list(const char* const* names, std::string_view n) {
  for (; *names; ++names)
    if (n == *names) return true;
  return false;
}

bool is_unsafe(const Value& obj, std::string_view n) {
  return (obj.is_list() && !obj.list().iter_type && in_list(kListUnsafe, n)) ||
         (obj.is_dict() && !obj.dict().is_namespace && in_list(kDictUnsafe, n));
}

std::string unsafe_message(const Value& obj, std::string_view n) {
  return "access to attribute '" + std::string(n) + "' of '" + type_name(obj) + "' object is unsafe.";
}

struct BoundMethod : Callable {
  Value self;
  std::string method;
  Value call(Renderer& r, CallArgs& args) override {
    std::optional<Value> v = call_method(r, self, method, args);
    if (!v) throw Fail("'" + type_name(self) + "' object has no method '" + method + "'");
    return std::move(*v);
  }
  std::string name() const override { return type_name(self) + "." + method; }
};

const std::string& str_arg(const CallArgs& a, size_t i, const char* method) {
  if (i >= a.pos.size()) throw Fail(std::string(method) + "() missing a required argument");
  if (!a.pos[i].is_string())
    throw Fail(std::string(method) + "() argument must be str, not " + type_name(a.pos[i]));
  return a.pos[i].str();
}

bool opt_none(const CallArgs& a, size_t i) { return i >= a.pos.size() || a.pos[i].is_none(); }

int64_t int_arg(const CallArgs& a, size_t i, int64_t def) {
  if (i >= a.pos.size() || a.pos[i].is_none()) return def;
  if (a.pos[i].is_bool()) return a.pos[i].as_bool();
  if (!a.pos[i].is_int()) throw Fail("an integer is required, not " + type_name(a.pos[i]));
  return a.pos[i].as_int();
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::make_list(std::move(out));
}

std::optional<Value> string_method(Renderer& r, const std::string& s, std::string_view m, CallArgs& a) {
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    std::optional<std::string> chars;
    if (!opt_none(a, 0)) chars = str_arg(a, 0, "strip");
    return Value(py_strip(s, chars ? &*chars : nullptr, m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    int64_t maxsplit = int_arg(a, 1, -1);
    if (const Value* k = a.get("maxsplit", 99)) maxsplit = k->is_int() ? k->as_int() : -1;
    std::optional<std::string> sep;
    const Value* sv = a.get("sep", 0);
    if (sv && !sv->is_none()) {
      if (!sv->is_string()) throw Fail("must be str or None, not " + type_name(*sv));
      sep = sv->str();
      if (sep->empty()) throw Fail("empty separator");
    }
    std::vector<std::string> parts = py_split(s, sep ? &*sep : nullptr, maxsplit, m == "rsplit");
    r.check_list(parts.size());
    return str_list(std::move(parts));
  }
  if (m == "startswith" || m == "endswith") {
    if (a.pos.empty()) throw Fail(std::string(m) + "() takes at least 1 argument");
    std::vector<Value> cands = a.pos[0].is_list() ? a.pos[0].list().items : std::vector<Value>{a.pos[0]};
    for (const auto& c : cands) {
      if (!c.is_string()) throw Fail(std::string(m) + " first arg must be str or a tuple of str, not " + type_name(c));
      const std::string& p = c.str();
      if (p.size() > s.size()) continue;
      if (m == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0)
        return Value(true);
    }
    return Value(false);
  }
  if (m == "replace") {
    const std::string& from = str_arg(a, 0, "replace");
    const std::string& to = str_arg(a, 1, "replace");
    return Value(py_replace(r, s, from, to, int_arg(a, 2, -1)));
  }
  if (m == "upper") return Value(py_upper(s));
  if (m == "lower" || m == "casefold") return Value(py_lower(s));
  if (m == "swapcase") {
    std::string o;
    for (size_t i = 0; i < s.size();) {
      size_t n;
      uint32_t c = decode_cp(s, i, n);
      append_utf8(o, cp_upper(c) != c ? cp_upper(c) : cp_lower(c));
      i += n;
    }
    return Value(std::move(o));
  }
  if (m == "title") return Value(py_title(s));
  if (m == "capitalize") return Value(py_capitalize(s));
  if (m == "format") return Value(py_format(r, s, a));
  if (m == "join") {
    if (a.pos.empty()) throw Fail("join() takes exactly one argument");
    std::string out;
    size_t i = 0;
    for (const Value& v : iterate(a.pos[0])) {
      if (!v.is_string())
        throw Fail("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(v) + " found");
      if (i++) out += s;
      out += v.str();
      r.check_string(out.size());
    }
    return Value(std::move(out));
  }
  if (m == "find" || m == "rfind" || m == "index") {
    const std::string& sub = str_arg(a, 0, "find");
    size_t p = m == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (m == "index") throw Fail("substring not found");
      return Value(int64_t(-1));
    }
    return Value(int64_t(utf8_length(std::string_view(s).substr(0, p))));
  }
  if (m == "count") {
    const std::string& sub = str_arg(a, 0, "count");
    if (sub.empty()) return Value(int64_t(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (m == "splitlines") {
    bool keep = a.pos.size() > 0 && truthy(a.pos[0]);
    if (const Value* k = a.get("keepends", 99)) keep = truthy(*k);
    return str_list(py_splitlines(s, keep));
  }
  if (m == "isdigit" || m == "isnumeric" || m == "isdecimal" || m == "isalpha" || m == "isalnum" || m == "isspace") {
    if (s.empty()) return Value(false);
    for (unsigned char c : s) {
      bool ok = m == "isalpha"   ? std::isalpha(c)
                : m == "isalnum" ? std::isalnum(c)
                : m == "isspace" ? (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f))
                                 : std::isdigit(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  if (m == "islower" || m == "isupper") {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
      size_t n;
      uint32_t c = decode_cp(s, i, n);
      i += n;
      if (!cp_cased(c)) continue;
      cased = true;
      if (m == "islower" ? cp_lower(c) != c : cp_upper(c) != c) return Value(false);
    }
    return Value(cased);
  }
  if (m == "istitle") return Value(!s.empty() && py_title(s) == s && s != py_lower(s));
  if (m == "center" || m == "ljust" || m == "rjust" || m == "zfill") {
    int64_t width = int_arg(a, 0, 0);
    if (width > 0) r.check_string(size_t(width));
    std::string fill = m == "zfill" ? "0" : a.pos.size() > 1 ? str_arg(a, 1, "center") : " ";
    int64_t len = int64_t(utf8_length(s));
    if (width <= len) return Value(s);
    r.check_string(size_t(width - len) * fill.size() + s.size());
    int64_t pad = width - len, left = m == "ljust" ? 0 : m == "center" ? pad / 2 + (pad & width & 1) : pad;
    std::string out;
    if (m == "zfill" && !s.empty() && (s[0] == '-' || s[0] == '+')) {
      out += s[0];
      for (int64_t i = 0; i < pad; ++i) out += '0';
      out.append(s, 1);
      return Value(std::move(out));
    }
    for (int64_t i = 0; i < left; ++i) out += fill;
    out += s;
    for (int64_t i = left; i < pad; ++i) out += fill;
    return Value(std::move(out));
  }
  if (m == "removeprefix" || m == "removesuffix") {
    const std::string& x = str_arg(a, 0, "removeprefix");
    if (m == "removeprefix" && s.compare(0, x.size(), x) == 0 && x.size() <= s.size()) return Value(s.substr(x.size()));
    if (m == "removesuffix" && x.size() <= s.size() && !x.empty() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (m == "partition" || m == "rpartition") {
    const std::string& sep = str_arg(a, 0, "partition");
    if (sep.empty()) throw Fail("empty separator");
    size_t p = m == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos)
      return m == "partition" ? Value::make_list({Value(s), Value(""), Value("")}, true)
                              : Value::make_list({Value(""), Value(""), Value(s)}, true);
    return Value::make_list({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))}, true);
  }
  return std::nullopt;
}

}  // namespace

bool has_method(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::String: return in_list(kStrMethods, name);
    case Kind::List:
      return !obj.list().iter_type && (in_list(kListMethods, name) || in_list(kListUnsafe, name));
    case Kind::Dict:
      return !obj.dict().is_namespace && (in_list(kDictMethods, name) || in_list(kDictUnsafe, name));
    default: return false;
  }
}

Value bound_method(const Value& obj, std::string_view name) {
  if (is_unsafe(obj, name)) return Value::undefined(unsafe_message(obj, name));
  auto m = std::make_shared<BoundMethod>();
  m->self = obj;
  m->method = std::string(name);
  return Value(std::shared_ptr<Callable>(std::move(m)));
}

std::optional<Value> call_method(Renderer& r, const Value& obj, std::string_view m, CallArgs& a) {
  if (!has_method(obj, m)) return std::nullopt;
  if (is_unsafe(obj, m)) throw Fail(unsafe_message(obj, m));
  if (obj.is_string()) return string_method(r, obj.str(), m, a);
  if (obj.is_list()) {
    const auto& items = obj.list().items;
    if (m == "copy") return Value::make_list(items, obj.list().tuple);
    if (a.pos.empty()) throw Fail(std::string(m) + "() takes exactly one argument (0 given)");
    if (m == "count") return Value(int64_t(std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, a.pos[0]); })));
    for (size_t i = 0; i < items.size(); ++i)
      if (equals(items[i], a.pos[0])) return Value(int64_t(i));
    throw Fail(repr(a.pos[0]) + " is not in list");
  }
  const DictObj& d = obj.dict();
  if (m == "get") {
    if (a.pos.empty()) throw Fail("get expected at least 1 argument, got 0");
    const Value* v = d.find(a.pos[0]);
    if (v) return *v;
    return a.pos.size() > 1 ? a.pos[1] : Value::none();
  }
  if (m == "copy") {
    Value c = Value::new_dict();
    c.dict().items = d.items;
    return c;
  }
  std::vector<Value> out;
  out.reserve(d.items.size());
  for (const auto& [k, v] : d.items) {
    if (m == "items") out.push_back(Value::make_list({k, v}, true));
    else out.push_back(m == "keys" ? k : v);
  }
  return Value::make_list(std::move(out), false, m == "items" ? "dict_items" : m == "keys" ? "dict_keys" : "dict_values");
}

}  // namespace ebb::jinja
