#include "model/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace ebb::jinja {

const Value* DictObj::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

const Value* DictObj::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

void DictObj::set(Value key, Value v) {
  uint32_t d = v.nest_depth() + 1;
  if (d > kMaxValueDepth) throw Fail("value nested too deeply (more than " + std::to_string(kMaxValueDepth) + " levels)");
  if (d > depth) depth = d;
  for (auto& [k, old] : items)
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::move(key), std::move(v));
}

const Value* CallArgs::get(std::string_view name, size_t index) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return index < pos.size() ? &pos[index] : nullptr;
}

Value Value::make_list(std::vector<Value> items, bool tuple, const char* iter_type) {
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  l->tuple = tuple;
  l->iter_type = iter_type;
  uint32_t d = 0;
  for (const Value& v : l->items) d = std::max(d, v.nest_depth());
  if (d + 1 > kMaxValueDepth)
    throw Fail("value nested too deeply (more than " + std::to_string(kMaxValueDepth) + " levels)");
  l->depth = d + 1;
  return Value(std::move(l));
}

Value Value::new_dict() { return Value(std::make_shared<DictObj>()); }

double Value::as_number() const {
  switch (kind()) {
    case Kind::Bool: return as_bool() ? 1.0 : 0.0;
    case Kind::Int: return double(as_int());
    case Kind::Float: return as_float();
    default: throw Fail("expected a number, got " + type_name(*this));
  }
}

const std::string& Value::undefined_why() const {
  static const std::string kNone = "value is undefined";
  const auto& u = std::get<UndefinedT>(v_);
  return u.why ? *u.why : kNone;
}

void Value::fail_undefined() const { throw Fail(undefined_why()); }

uint32_t Value::nest_depth() const {
  if (is_list()) return list().depth;
  if (is_dict()) return dict().depth;
  return 0;
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::String: return str_ptr().get();
    case Kind::List: return list_ptr().get();
    case Kind::Dict: return dict_ptr().get();
    case Kind::Callable: return callable_ptr().get();
    case Kind::Object: return &object();
    default: return nullptr;
  }
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.as_bool();
    case Kind::Int: return v.as_int() != 0;
    case Kind::Float: return v.as_float() != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List: {
      const ListObj& l = v.list();
      if (l.iter_type && std::strncmp(l.iter_type, "dict_", 5) != 0) return true;  // an iterator object
      return !l.items.empty();
    }
    case Kind::Dict: return v.dict().is_namespace || !v.dict().items.empty();
    default: return true;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e(+|-)XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= size_t(exp) + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

static void append_str_repr(std::string& out, const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  out += q;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = s[i];
    if (c == '\\') out += "\\\\";
    else if (c == q) { out += '\\'; out += char(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else if (c == 0xc2 && i + 1 < s.size() && (unsigned char)s[i + 1] >= 0x80 &&
               ((unsigned char)s[i + 1] <= 0xa0 || (unsigned char)s[i + 1] == 0xad)) {
      char b[8];  // C1 controls, no-break space and soft hyphen are not printable
      std::snprintf(b, sizeof b, "\\x%02x", (unsigned char)s[i + 1]);
      out += b;
      ++i;
    } else {
      out += char(c);
    }
  }
  out += q;
}

static void repr_rec(std::string& out, const Value& v, uint32_t level);

void append_repr(std::string& out, const Value& v) { repr_rec(out, v, 0); }

static void repr_rec(std::string& out, const Value& v, uint32_t level) {
  // Namespaces can be made to contain themselves; stop before the stack does.
  if (level > kMaxValueDepth + 8) throw Fail("value nested too deeply to print");
  if (out.size() > kMaxReprBytes) throw Fail("value too large to print (over " + std::to_string(kMaxReprBytes) + " bytes)");
  switch (v.kind()) {
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::String:
      if (v.is_markup()) out += "Markup(";
      append_str_repr(out, v.str());
      if (v.is_markup()) out += ')';
      return;
    case Kind::List: {
      const ListObj& l = v.list();
      if (l.iter_type && std::strcmp(l.iter_type, "dict_items") != 0 && std::strcmp(l.iter_type, "dict_keys") != 0 &&
          std::strcmp(l.iter_type, "dict_values") != 0) {
        out += "<";
        out += l.iter_type;
        out += " object>";
        return;
      }
      if (l.iter_type) {
        out += l.iter_type;
        out += "([";
      } else {
        out += l.tuple ? '(' : '[';
      }
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_rec(out, l.items[i], level + 1);
      }
      if (l.iter_type) out += "])";
      else if (l.tuple) out += l.items.size() == 1 ? ",)" : ")";
      else out += ']';
      return;
    }
    case Kind::Dict: {
      const DictObj& d = v.dict();
      out += d.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : d.items) {
        if (!first) out += ", ";
        first = false;
        repr_rec(out, k, level + 1);
        out += ": ";
        repr_rec(out, x, level + 1);
      }
      out += d.is_namespace ? "}>" : "}";
      return;
    }
    default: append_str(out, v);
  }
}

std::string repr(const Value& v) {
  std::string s;
  append_repr(s, v);
  return s;
}

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.as_bool() ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: out += float_repr(v.as_float()); return;
    case Kind::String: out += v.str(); return;
    case Kind::List:
    case Kind::Dict: append_repr(out, v); return;
    case Kind::Callable: out += "<function " + v.callable().name() + ">"; return;
    case Kind::Object:
      out += '<';
      out += v.object().type_name();
      out += " object>";
      return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string s;
  append_str(s, v);
  return s;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.list().iter_type ? v.list().iter_type : v.list().tuple ? "tuple" : "list";
    case Kind::Dict: return v.dict().is_namespace ? "Namespace" : "dict";
    case Kind::Callable: return "function";
    case Kind::Object: return v.object().type_name();
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

bool equals(const Value& a, const Value& b) {
  Kind ka = a.kind(), kb = b.kind();
  bool na = ka == Kind::Int || ka == Kind::Float || ka == Kind::Bool;
  bool nb = kb == Kind::Int || kb == Kind::Float || kb == Kind::Bool;
  if (na && nb) {
    if (ka != Kind::Float && kb != Kind::Float) {
      int64_t x = ka == Kind::Bool ? a.as_bool() : a.as_int();
      int64_t y = kb == Kind::Bool ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.as_number() == b.as_number();
  }
  if (ka != kb) return false;
  switch (ka) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List: {
      const ListObj &x = a.list(), &y = b.list();
      if (&x == &y) return true;
      if (x.iter_type || y.iter_type || x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const DictObj &x = a.dict(), &y = b.dict();
      if (&x == &y) return true;
      if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int(), y = b.is_bool() ? b.as_bool() : b.as_int();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && !a.list().iter_type && !b.list().iter_type &&
      a.list().tuple == b.list().tuple) {
    const auto &x = a.list().items, &y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw Fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
             type_name(b) + "'");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List:
      if (v.list().deferred_error) throw Fail(*v.list().deferred_error);
      return v.list().items;
    case Kind::Dict: {
      if (v.dict().is_namespace) break;
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> out;
      for (std::string_view c : utf8_chars(v.str())) out.emplace_back(std::string(c));
      return out;
    }
    default: break;
  }
  throw Fail("'" + type_name(v) + "' object is not iterable");
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return 0;
    case Kind::String: return int64_t(utf8_length(v.str()));
    case Kind::List: {
      const ListObj& l = v.list();
      if (l.iter_type && std::strncmp(l.iter_type, "dict_", 5) != 0)
        throw Fail(std::string("object of type '") + l.iter_type + "' has no len()");
      return int64_t(l.items.size());
    }
    case Kind::Dict:
      if (v.dict().is_namespace) break;
      return int64_t(v.dict().items.size());
    default: break;
  }
  throw Fail("object of type '" + type_name(v) + "' has no len()");
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i + 1;
    while (j < s.size() && ((unsigned char)s[j] & 0xC0) == 0x80) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace ebb::jinja
