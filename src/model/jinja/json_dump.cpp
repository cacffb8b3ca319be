#include "model/jinja/json_dump.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/jinja/strings.h"

namespace ebb::jinja {

namespace {

void escape_json(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    char buf[16];
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\b') out += "\\b";
    else if (c == '\f') out += "\\f";
    else if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c >= 0x80 && ensure_ascii) {
      size_t n;
      uint32_t cp = decode_cp(s, i, n);
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
      i += n;
      continue;
    } else {
      out += char(c);
    }
    ++i;
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

struct Dumper {
  const JsonDumpOptions& o;
  std::string out;

  void newline(uint32_t level) {
    if (out.size() + 1 + size_t(level) * o.indent->size() > o.max_bytes)
      throw Fail("tojson output exceeds " + std::to_string(o.max_bytes) + " bytes");
    out += '\n';
    for (uint32_t i = 0; i < level; ++i) out += *o.indent;
  }

  [[noreturn]] static void not_serializable(const Value& v) {
    if (v.is_undefined()) throw Fail("Object of type Undefined is not JSON serializable");
    throw Fail("Object of type " + type_name(v) + " is not JSON serializable");
  }

  std::string key_text(const Value& k) {
    switch (k.kind()) {
      case Kind::String: return k.str();
      case Kind::Int: return std::to_string(k.as_int());
      case Kind::Float: return float_json(k.as_float());
      case Kind::Bool: return k.as_bool() ? "true" : "false";
      case Kind::None: return "null";
      default: throw Fail("keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }

  void dump(const Value& v, uint32_t level) {
    if (level > kMaxValueDepth + 8) throw Fail("value nested too deeply for tojson");
    if (out.size() > o.max_bytes) throw Fail("tojson output exceeds " + std::to_string(o.max_bytes) + " bytes");
    switch (v.kind()) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Kind::Int: out += std::to_string(v.as_int()); return;
      case Kind::Float: out += float_json(v.as_float()); return;
      case Kind::String: escape_json(out, v.str(), o.ensure_ascii); return;
      case Kind::List: {
        const ListObj& l = v.list();
        if (l.iter_type) not_serializable(v);
        if (l.items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < l.items.size(); ++i) {
          if (i) out += o.item_sep;
          if (o.indent) newline(level + 1);
          dump(l.items[i], level + 1);
        }
        if (o.indent) newline(level);
        out += ']';
        return;
      }
      case Kind::Dict: {
        const DictObj& d = v.dict();
        if (d.is_namespace) not_serializable(v);
        if (d.items.empty()) {
          out += "{}";
          return;
        }
        std::vector<std::pair<std::string, const Value*>> items;
        items.reserve(d.items.size());
        for (const auto& [k, x] : d.items) items.emplace_back(key_text(k), &x);
        if (o.sort_keys)
          std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += o.item_sep;
          if (o.indent) newline(level + 1);
          escape_json(out, items[i].first, o.ensure_ascii);
          out += o.key_sep;
          dump(*items[i].second, level + 1);
        }
        if (o.indent) newline(level);
        out += '}';
        return;
      }
      default: not_serializable(v);
    }
  }
};

template <class J>
Value convert(const J& j, uint32_t level) {
  if (level > kMaxValueDepth) throw ebb::Error("chat template input nested too deeply (more than " +
                                               std::to_string(kMaxValueDepth) + " levels)");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(convert(x, level + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::new_dict();
      auto& obj = d.dict();
      obj.items.reserve(j.size());
      uint32_t depth = 0;
      for (auto it = j.begin(); it != j.end(); ++it) {
        Value x = convert(it.value(), level + 1);
        depth = std::max(depth, x.nest_depth());
        obj.items.emplace_back(Value(it.key()), std::move(x));
      }
      obj.depth = depth + 1;
      return d;
    }
    case nlohmann::json::value_t::binary: throw ebb::Error("chat template input: binary JSON values are not supported");
  }
  return Value::none();
}

}  // namespace

std::string to_json_text(const Value& v, const JsonDumpOptions& opts) {
  Dumper d{opts, {}};
  d.dump(v, 0);
  if (d.out.size() > opts.max_bytes) throw Fail("tojson output exceeds " + std::to_string(opts.max_bytes) + " bytes");
  return std::move(d.out);
}

Value from_json(const nlohmann::json& j) { return convert(j, 0); }
Value from_json(const nlohmann::ordered_json& j) { return convert(j, 0); }

}  // namespace ebb::jinja
