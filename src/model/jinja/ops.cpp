// Operators, attributes and subscripts (builtins.h).
#include <cmath>
#include <cstring>

#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"

namespace ebb::jinja {

namespace {

Value missing_attr(const Value& obj, std::string_view name) {
  std::string why = "'";
  why += object_type_repr(obj);
  why += "' has no attribute '";
  why += name;
  why += "'";
  return Value::undefined(std::move(why));
}

Value missing_item(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attr(obj, key.str());
  std::string why = "'";
  why += object_type_repr(obj);
  why += "' has no element ";
  why += repr(key);
  return Value::undefined(std::move(why));
}

bool is_dunder(std::string_view n) { return n.size() > 4 && n.substr(0, 2) == "__" && n.substr(n.size() - 2) == "__"; }

int64_t int_of(const Value& v) { return v.is_bool() ? int64_t(v.as_bool()) : v.as_int(); }
bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

// Byte offsets of each code point of s, plus s.size() at the end.
std::vector<size_t> cp_offsets(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if (((unsigned char)s[i] & 0xC0) != 0x80) off.push_back(i);
  off.push_back(s.size());
  return off;
}

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  throw Fail("unsupported operand type(s) for " + std::string(op) + ": '" + type_name(a) + "' and '" + type_name(b) +
             "'");
}

Value int_result(__int128 r) {
  if (r > INT64_MAX || r < INT64_MIN) throw Fail("integer result out of range (ebb's templates use 64-bit integers)");
  return Value(int64_t(r));
}

Value repeat(Renderer& r, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty()) r.check_string(size_t(n) > r.limits().max_string_bytes ? size_t(n) : s.size() * size_t(n));
    std::string out;
    out.reserve(s.size() * size_t(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const ListObj& l = seq.list();
  if (!l.items.empty()) r.check_list(size_t(n) > r.limits().max_list_items ? size_t(n) : l.items.size() * size_t(n));
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return Value::make_list(std::move(out), l.tuple);
}

}  // namespace

bool is_hashable(const Value& v) {
  if (v.is_dict()) return false;
  if (!v.is_list()) return true;
  const ListObj& l = v.list();
  if (l.tuple) return true;
  // Iterators and dict_values hash (by identity); lists, dict_keys and dict_items do not.
  return l.iter_type && (std::strncmp(l.iter_type, "dict_", 5) != 0 || std::strcmp(l.iter_type, "dict_values") == 0);
}

Value get_attr(const Value& obj, std::string_view name) {
  if (is_dunder(name))
    return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(obj) +
                            "' object is unsafe.");
  switch (obj.kind()) {
    case Kind::Undefined: obj.fail_undefined();
    case Kind::Dict:
      if (!obj.dict().is_namespace && has_method(obj, name)) return bound_method(obj, name);
      if (const Value* v = obj.dict().find(name)) return *v;
      return missing_attr(obj, name);
    case Kind::String:
    case Kind::List:
      if (has_method(obj, name)) return bound_method(obj, name);
      return missing_attr(obj, name);
    case Kind::Object: return obj.object().getattr(name);
    default: return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::Undefined: obj.fail_undefined();
    case Kind::Dict:
      if (obj.dict().is_namespace) break;
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    case Kind::List: {
      const ListObj& l = obj.list();
      if (is_intlike(key) && !l.iter_type) {
        int64_t i = int_of(key), n = int64_t(l.items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return l.items[size_t(i)];
      }
      break;
    }
    case Kind::String:
      if (is_intlike(key)) {
        const std::string& s = obj.str();
        std::vector<size_t> off = cp_offsets(s);
        int64_t i = int_of(key), n = int64_t(off.size() - 1);
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value(s.substr(off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]));
      }
      break;
    default: break;
  }
  if (key.is_string()) {
    if (obj.is_dict() && !obj.dict().is_namespace) {
      if (has_method(obj, key.str()) && !is_dunder(key.str())) return bound_method(obj, key.str());
      return missing_attr(obj, key.str());
    }
    return get_attr(obj, key.str());
  }
  return missing_item(obj, key);
}

Value get_slice(Renderer& r, const Value& obj, const Value* start, const Value* stop, const Value* step) {
  auto idx = [](const Value* v, bool& given) -> int64_t {
    given = v && !v->is_none();
    if (!given) return 0;
    if (!is_intlike(*v)) throw Fail("slice indices must be integers or None");
    return int_of(*v);
  };
  bool has_start, has_stop, has_step;
  int64_t a = idx(start, has_start), b = idx(stop, has_stop), st = idx(step, has_step);
  if (!has_step) st = 1;
  if (st == 0) throw Fail("slice step cannot be zero");
  size_t n;
  std::vector<size_t> off;
  if (obj.is_string()) {
    off = cp_offsets(obj.str());
    n = off.size() - 1;
  } else if (obj.is_list() && !obj.list().iter_type) {
    n = obj.list().items.size();
  } else {
    throw Fail("'" + type_name(obj) + "' object is not subscriptable");
  }
  int64_t len = int64_t(n);
  auto clamp = [&](int64_t v, bool given, int64_t def) {
    if (!given) return def;
    if (v < 0) v += len;
    if (st > 0) return v < 0 ? 0 : v > len ? len : v;
    return v < -1 ? -1 : v > len - 1 ? len - 1 : v;
  };
  int64_t lo = clamp(a, has_start, st > 0 ? 0 : len - 1);
  int64_t hi = clamp(b, has_stop, st > 0 ? len : -1);
  std::vector<int64_t> picks;  // 128-bit steps: a step near INT64_MAX must not wrap
  if (st > 0)
    for (__int128 i = lo; i < hi; i += st) picks.push_back(int64_t(i));
  else
    for (__int128 i = lo; i > hi; i += st) picks.push_back(int64_t(i));
  r.charge(int64_t(picks.size()));
  if (obj.is_string()) {
    const std::string& s = obj.str();
    std::string out;
    for (int64_t i : picks) out.append(s, off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]);
    return Value(std::move(out));
  }
  std::vector<Value> out;
  out.reserve(picks.size());
  for (int64_t i : picks) out.push_back(obj.list().items[size_t(i)]);
  return Value::make_list(std::move(out), obj.list().tuple);
}

Value unary_op(std::string_view op, const Value& a) {
  if (a.is_undefined()) a.fail_undefined();
  if (is_intlike(a)) {
    int64_t v = int_of(a);
    if (op == "+") return Value(v);
    return int_result(-__int128(v));
  }
  if (a.is_float()) return Value(op == "-" ? -a.as_float() : a.as_float());
  throw Fail("bad operand type for unary " + std::string(op) + ": '" + type_name(a) + "'");
}

bool contains(const Value& c, const Value& item) {
  switch (c.kind()) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (item.is_undefined()) item.fail_undefined();
      if (!item.is_string()) throw Fail("'in <string>' requires string as left operand, not " + type_name(item));
      return c.str().find(item.str()) != std::string::npos;
    case Kind::List:
      if (c.list().deferred_error) throw Fail(*c.list().deferred_error);
      for (const auto& x : c.list().items)
        if (equals(x, item)) return true;
      return false;
    case Kind::Dict:
      if (c.dict().is_namespace) break;
      if (!is_hashable(item)) throw Fail("unhashable type: '" + type_name(item) + "'");
      return c.dict().find(item) != nullptr;
    default: break;
  }
  throw Fail("argument of type '" + type_name(c) + "' is not iterable");
}

Value binary_op(Renderer& r, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a);
    if (b.is_string()) {
      r.check_string(s.size() + b.str().size());
      s += b.str();
    } else {
      std::string t = to_str(b);
      r.check_string(s.size() + t.size());
      s += t;
    }
    return Value(std::move(s));
  }
  if (op == "%" && a.is_string()) return Value(py_percent(r, a.str(), b));
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  bool ints = is_intlike(a) && is_intlike(b);
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return int_result(__int128(int_of(a)) + int_of(b));
    if (nums) return Value(a.as_number() + b.as_number());
    if (a.is_string() && b.is_string()) {
      r.check_string(a.str().size() + b.str().size());
      if (a.is_markup() && !b.is_markup()) return Value::markup(a.str() + html_escape(b.str()));
      if (b.is_markup() && !a.is_markup()) return Value::markup(html_escape(a.str()) + b.str());
      if (a.is_markup()) return Value::markup(a.str() + b.str());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && !a.list().iter_type && !b.list().iter_type && a.list().tuple == b.list().tuple) {
      r.check_list(a.list().items.size() + b.list().items.size());
      std::vector<Value> out = a.list().items;
      out.insert(out.end(), b.list().items.begin(), b.list().items.end());
      return Value::make_list(std::move(out), a.list().tuple);
    }
    if (a.is_string() || (a.is_list() && !a.list().iter_type))
      throw Fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) return int_result(__int128(int_of(a)) - int_of(b));
    if (nums) return Value(a.as_number() - b.as_number());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) return int_result(__int128(int_of(a)) * int_of(b));
    if (nums) return Value(a.as_number() * b.as_number());
    if ((a.is_string() || (a.is_list() && !a.list().iter_type)) && is_intlike(b)) return repeat(r, a, int_of(b));
    if ((b.is_string() || (b.is_list() && !b.list().iter_type)) && is_intlike(a)) return repeat(r, b, int_of(a));
    throw Fail("can't multiply sequence by non-int of type '" + type_name(b) + "'");
  }
  if (op == "/") {
    if (!nums) unsupported(op, a, b);
    if (b.as_number() == 0) throw Fail("division by zero");
    return Value(a.as_number() / b.as_number());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value(py_percent(r, a.str(), b));
    if (!nums) unsupported(op, a, b);
    if (ints) {
      int64_t x = int_of(a), y = int_of(b);
      if (y == 0) throw Fail(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return op == "%" ? Value(int64_t(0)) : int_result(-__int128(x));
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "%" ? m : q);
    }
    double x = a.as_number(), y = b.as_number();
    if (y == 0) throw Fail("float modulo by zero");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    if (m == 0) m = std::copysign(0.0, y);  // Python: a zero remainder takes the divisor's sign
    if (op == "%") return Value(m);
    return Value(std::floor(x / y));
  }
  if (op == "**") {
    if (ints && int_of(b) >= 0) {
      __int128 base = int_of(a), res = 1;
      int64_t e = int_of(b);
      while (e > 0) {
        if (e & 1) res = int_result(res * base).as_int();
        e >>= 1;
        if (e) base = int_result(base * base).as_int();
      }
      return Value(int64_t(res));
    }
    if (nums) {
      if (a.as_number() == 0 && b.as_number() < 0) throw Fail("0.0 cannot be raised to a negative power");
      if (a.as_number() < 0 && b.as_number() != std::floor(b.as_number()))
        throw Fail("a negative number to a fractional power is complex (not supported)");
      return Value(std::pow(a.as_number(), b.as_number()));
    }
    unsupported("** or pow()", a, b);
  }
  throw Fail("unknown operator '" + std::string(op) + "'");
}

}  // namespace ebb::jinja
