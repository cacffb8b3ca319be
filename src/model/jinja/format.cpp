// str.format and the % operator on strings, with the common part of
// Python's format mini-language: [[fill]align][sign][0][width][,][.prec][type].
#include <cmath>
#include <cstdio>

#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"

namespace ebb::jinja {

namespace {

struct Spec {
  std::string fill = " ";
  char align = 0, sign = '-', type = 0;
  bool zero = false, alt = false, comma = false;
  int64_t width = -1, prec = -1;
};

Spec parse_spec(std::string_view s) {
  Spec sp;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    sp.fill = std::string(1, s[0]);
    sp.align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp.sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    sp.alt = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    sp.zero = true;
    ++i;
  }
  auto num = [&](int64_t& out) {
    size_t b = i;
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      v = v * 10 + (s[i++] - '0');
      if (v > 100000000) throw Fail("format width or precision too large");
    }
    if (i > b) out = v;
  };
  num(sp.width);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) {
    sp.comma = true;
    ++i;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    num(sp.prec);
  }
  if (i < s.size()) sp.type = s[i++];
  if (i != s.size()) throw Fail("invalid format specifier '" + std::string(s) + "'");
  return sp;
}

std::string group(const std::string& digits) {
  std::string out;
  int n = 0;
  for (size_t i = digits.size(); i-- > 0;) {
    if (n && n % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), digits[i]);
    ++n;
  }
  return out;
}

std::string fmt_float(double d, char type, int64_t prec) {
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (std::isnan(d)) return "nan";
  char buf[512];
  char t = type == 'F' ? 'f' : type;
  std::string f = "%." + std::to_string(prec < 0 ? 6 : std::min<int64_t>(prec, 300)) + t;
  std::snprintf(buf, sizeof buf, f.c_str(), d);
  return buf;
}

std::string format_value(Renderer& r, const Value& v, std::string_view spec_text) {
  if (spec_text.empty()) return to_str(v);
  Spec sp = parse_spec(spec_text);
  r.check_string(size_t(std::max<int64_t>(sp.width, 0)));
  std::string body, sign;
  bool numeric = v.is_number();
  if (numeric) {
    char t = sp.type;
    bool integral = (v.is_int() || v.is_bool()) && (t == 0 || t == 'd' || t == 'x' || t == 'X' || t == 'o' ||
                                                     t == 'b' || t == 'c' || t == 'n');
    if (integral) {
      int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
      uint64_t ux = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x);
      if (x < 0) sign = "-";
      if (t == 'c') {
        append_utf8(body, uint32_t(ux));
      } else if (t == 'x' || t == 'X' || t == 'o' || t == 'b') {
        int base = t == 'o' ? 8 : t == 'b' ? 2 : 16;
        const char* dig = t == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
        do {
          body.insert(body.begin(), dig[ux % unsigned(base)]);
          ux /= unsigned(base);
        } while (ux);
        if (sp.alt) body = std::string(t == 'o' ? "0o" : t == 'b' ? "0b" : t == 'X' ? "0X" : "0x") + body;
      } else {
        body = std::to_string(ux);
        if (sp.comma) body = group(body);
      }
    } else {
      if (!(t == 0 || t == 'f' || t == 'F' || t == 'e' || t == 'E' || t == 'g' || t == 'G' || t == '%'))
        throw Fail(std::string("unknown format code '") + t + "' for object of type '" + type_name(v) + "'");
      double d = v.as_number();
      if (std::signbit(d) && !std::isnan(d)) {
        sign = "-";
        d = -d;
      }
      if (t == '%') body = fmt_float(d * 100, 'f', sp.prec) + "%";
      else if (t == 0 && sp.prec < 0) body = float_repr(d);
      else body = fmt_float(d, t == 0 ? 'g' : t, sp.prec);
      if (sp.comma) {
        size_t dot = body.find_first_not_of("0123456789");
        body = group(body.substr(0, dot)) + (dot == std::string::npos ? "" : body.substr(dot));
      }
    }
    if (sign.empty() && sp.sign == '+') sign = "+";
    if (sign.empty() && sp.sign == ' ') sign = " ";
  } else {
    if (sp.type && sp.type != 's') {
      if (v.is_undefined()) v.fail_undefined();
      throw Fail(std::string("unknown format code '") + sp.type + "' for object of type '" + type_name(v) + "'");
    }
    body = to_str(v);
    if (sp.prec >= 0) {
      std::vector<std::string_view> cs = utf8_chars(body);
      if (int64_t(cs.size()) > sp.prec) {
        std::string t;
        for (int64_t i = 0; i < sp.prec; ++i) t += cs[size_t(i)];
        body = t;
      }
    }
  }
  char align = sp.align ? sp.align : sp.zero && numeric ? '=' : numeric ? '>' : '<';
  std::string fill = sp.zero && !sp.align ? "0" : sp.fill;
  int64_t len = int64_t(utf8_length(sign) + utf8_length(body));
  int64_t pad = sp.width > len ? sp.width - len : 0;
  std::string out;
  auto put = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) out += fill;
  };
  if (align == '<') {
    out = sign + body;
    put(pad);
  } else if (align == '>') {
    put(pad);
    out += sign + body;
  } else if (align == '^') {
    put(pad / 2);
    out += sign + body;
    put(pad - pad / 2);
  } else {
    out = sign;
    put(pad);
    out += body;
  }
  return out;
}

}  // namespace

std::string py_format(Renderer& r, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else throw Fail("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conv;
    size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    size_t end = field.find_first_of(".[");
    std::string head = field.substr(0, end);
    Value v;
    if (head.empty()) {
      if (auto_idx >= args.pos.size()) throw Fail("Replacement index " + std::to_string(auto_idx) + " out of range");
      v = args.pos[auto_idx++];
    } else if (head.find_first_not_of("0123456789") == std::string::npos) {
      size_t k = std::stoul(head.substr(0, 9));
      if (k >= args.pos.size()) throw Fail("Replacement index " + head + " out of range");
      v = args.pos[k];
    } else {
      const Value* kv = nullptr;
      for (const auto& [n, x] : args.kw)
        if (n == head) kv = &x;
      if (!kv) throw Fail("format: missing keyword argument '" + head + "'");
      v = *kv;
    }
    while (end != std::string::npos && end < field.size()) {
      if (field[end] == '.') {
        size_t nx = field.find_first_of(".[", end + 1);
        v = get_attr(v, field.substr(end + 1, nx == std::string::npos ? std::string::npos : nx - end - 1));
        end = nx;
      } else {
        size_t rb = field.find(']', end);
        if (rb == std::string::npos) throw Fail("Missing ']' in format string");
        std::string key = field.substr(end + 1, rb - end - 1);
        Value kv = key.find_first_not_of("0123456789") == std::string::npos && !key.empty()
                       ? Value(int64_t(std::stoll(key.substr(0, 18))))
                       : Value(key);
        v = get_item(v, kv);
        end = rb + 1;
      }
    }
    if (conv == "r") v = Value(repr(v));
    else if (conv == "s") v = Value(to_str(v));
    else if (!conv.empty()) throw Fail("Unknown conversion specifier " + conv);
    out += format_value(r, v, spec);
    r.check_string(out.size());
  }
  return out;
}

std::string py_percent(Renderer& r, const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  const DictObj* map = nullptr;
  if (args.is_list() && args.list().tuple) pos = args.list().items;
  else if (args.is_dict()) map = &args.dict();
  else pos.push_back(args);
  if (map) pos.clear();
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw Fail("incomplete format");
    Value v;
    bool have = false;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || !map) throw Fail("format requires a mapping");
      const Value* x = map->find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!x) throw Fail("KeyError: " + fmt.substr(i + 1, close - i - 1));
      v = *x;
      have = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags += fmt[i++];
    std::string width, prec;
    while (i < fmt.size() && std::isdigit((unsigned char)fmt[i])) width += fmt[i++];
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = "0";
      while (i < fmt.size() && std::isdigit((unsigned char)fmt[i])) prec += fmt[i++];
    }
    if (i >= fmt.size()) throw Fail("incomplete format");
    char t = fmt[i];
    if (t == '%') {
      out += '%';
      continue;
    }
    if (!have) {
      if (map) v = args;
      else if (next < pos.size()) v = pos[next++];
      else throw Fail("not enough arguments for format string");
    }
    if (width.size() > 9 || prec.size() > 9) throw Fail("format width or precision too large");
    // printf-style: right-aligned unless '-', zero-padded numbers with '0'.
    bool left = flags.find('-') != std::string::npos;
    bool zero = !left && flags.find('0') != std::string::npos && t != 's' && t != 'r';
    std::string full;
    if (!width.empty() && !zero) full += left ? '<' : '>';
    if (flags.find('+') != std::string::npos) full += '+';
    if (zero) full += '0';
    full += width;
    if (!prec.empty()) {
      full += '.';
      full += std::to_string(std::stoll(prec));
    }
    if (t == 's' || t == 'r') {
      Value s = Value(t == 'r' ? repr(v) : to_str(v));
      out += format_value(r, s, full.empty() ? "" : full + "s");
    } else if (t == 'd' || t == 'i' || t == 'u') {
      if (!v.is_number()) throw Fail("%" + std::string(1, t) + " format: a real number is required, not " + type_name(v));
      Value n = v.is_float() ? Value(int64_t(v.as_float())) : v;
      out += format_value(r, n, full + "d");
    } else if (std::string_view("fFeEgGxXoc").find(t) != std::string_view::npos) {
      out += format_value(r, v, full + t);
    } else {
      throw Fail(std::string("unsupported format character '") + t + "'");
    }
    r.check_string(out.size());
  }
  // Python treats any non-tuple argument with __getitem__ (a list) as a
  // mapping here, so only a tuple or a scalar can have arguments left over.
  bool lenient = map || args.is_undefined() || (args.is_list() && !args.list().tuple && !args.list().iter_type);
  if (!lenient && next < pos.size()) throw Fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace ebb::jinja
