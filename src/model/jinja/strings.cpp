#include "model/jinja/strings.h"

#include <algorithm>

#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"

namespace ebb::jinja {

uint32_t decode_cp(std::string_view s, size_t i, size_t& n) {
  unsigned char c = s[i];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + size_t(len) > s.size()) {
    n = 1;
    return c;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char d = s[i + size_t(k)];
    if ((d & 0xC0) != 0x80) {
      n = 1;
      return c;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  n = size_t(len);
  return cp;
}

bool is_py_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

namespace {

struct Cp {
  uint32_t cp;
  size_t at, n;
};

std::vector<Cp> cps(std::string_view s) {
  std::vector<Cp> v;
  for (size_t i = 0; i < s.size();) {
    size_t n;
    uint32_t c = decode_cp(s, i, n);
    v.push_back({c, i, n});
    i += n;
  }
  return v;
}

}  // namespace

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars)
    for (const Cp& c : cps(*chars)) set.push_back(c.cp);
  auto strip_it = [&](uint32_t cp) {
    if (!chars) return is_py_space(cp);
    for (uint32_t x : set)
      if (x == cp) return true;
    return false;
  };
  std::vector<Cp> v = cps(s);
  size_t b = 0, e = v.size();
  if (left)
    while (b < e && strip_it(v[b].cp)) ++b;
  if (right)
    while (e > b && strip_it(v[e - 1].cp)) --e;
  if (b == e) return "";
  return std::string(s.substr(v[b].at, v[e - 1].at + v[e - 1].n - v[b].at));
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (!from_right) {
      size_t p = 0;
      for (;;) {
        size_t q = (maxsplit < 0 || int64_t(out.size()) < maxsplit) ? s.find(*sep, p) : std::string_view::npos;
        if (q == std::string_view::npos) {
          out.emplace_back(s.substr(p));
          return out;
        }
        out.emplace_back(s.substr(p, q - p));
        p = q + sep->size();
      }
    }
    size_t end = s.size();
    for (;;) {
      size_t q = (maxsplit < 0 || int64_t(out.size()) < maxsplit) && end >= sep->size()
                     ? s.rfind(*sep, end - sep->size())
                     : std::string_view::npos;
      if (q == std::string_view::npos) {
        out.emplace_back(s.substr(0, end));
        break;
      }
      out.emplace_back(s.substr(q + sep->size(), end - q - sep->size()));
      end = q;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<Cp> v = cps(s);
  std::vector<std::pair<size_t, size_t>> words;  // [begin, end) indices into v
  for (size_t i = 0; i < v.size();) {
    while (i < v.size() && is_py_space(v[i].cp)) ++i;
    if (i >= v.size()) break;
    size_t j = i;
    while (j < v.size() && !is_py_space(v[j].cp)) ++j;
    words.emplace_back(i, j);
    i = j;
  }
  auto text = [&](size_t b, size_t e) { return std::string(s.substr(v[b].at, v[e - 1].at + v[e - 1].n - v[b].at)); };
  if (maxsplit < 0 || int64_t(words.size()) <= maxsplit + 1) {
    for (auto [b, e] : words) out.push_back(text(b, e));
    return out;
  }
  if (!from_right) {
    for (int64_t k = 0; k < maxsplit; ++k) out.push_back(text(words[size_t(k)].first, words[size_t(k)].second));
    out.push_back(text(words[size_t(maxsplit)].first, v.size()));  // the rest keeps its trailing space
    return out;
  }
  size_t first_kept = words.size() - size_t(maxsplit);
  out.push_back(text(0, words[first_kept - 1].second));  // the rest keeps its leading space
  for (size_t k = first_kept; k < words.size(); ++k) out.push_back(text(words[k].first, words[k].second));
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::vector<Cp> v = cps(s);
  size_t start = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t c = v[i].cp;
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end_line = v[i].at, after = v[i].at + v[i].n;
    if (c == '\r' && i + 1 < v.size() && v[i + 1].cp == '\n') {
      after += 1;
      ++i;
    }
    out.emplace_back(s.substr(start, (keepends ? after : end_line) - start));
    start = after;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(Renderer& r, const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) {
    std::vector<Cp> v = cps(s);
    size_t n = v.size() + 1;
    if (count >= 0 && size_t(count) < n) n = size_t(count);
    r.check_string(s.size() + n * to.size());
    std::string out;
    size_t k = 0;
    for (size_t i = 0; i <= v.size(); ++i) {
      if (k < n) {
        out += to;
        ++k;
      }
      if (i < v.size()) out.append(s, v[i].at, v[i].n);
    }
    return out;
  }
  size_t occurrences = 0;
  for (size_t p = s.find(from); p != std::string::npos && (count < 0 || int64_t(occurrences) < count);
       p = s.find(from, p + from.size()))
    ++occurrences;
  if (to.size() > from.size()) r.check_string(s.size() + occurrences * (to.size() - from.size()));
  std::string out;
  size_t p = 0, done = 0;
  while (done < occurrences) {
    size_t q = s.find(from, p);
    out.append(s, p, q - p);
    out += to;
    p = q + from.size();
    ++done;
  }
  out.append(s, p);
  return out;
}

uint32_t cp_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (c == 0x130 || c == 0x138 || c == 0x149 || c == 0x17F) return c;
    if (odd_upper) return (c % 2 == 0) ? c - 1 : c;
    return (c % 2 == 1) ? c - 1 : c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 0x20;  // fullwidth a-z
  return c;
}

uint32_t cp_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130 || c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17F) return c;
    bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper) return (c % 2 == 1) ? c + 1 : c;
    return (c % 2 == 0) ? c + 1 : c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 0x20;
  return c;
}

bool cp_cased(uint32_t c) {
  return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF || c == 0x138 || c == 0x149 || c == 0x17F || c == 0x3C2;
}

namespace {

template <class F>
std::string map_cps(std::string_view s, F f) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n;
    uint32_t c = decode_cp(s, i, n);
    if (n == 1 && (unsigned char)s[i] >= 0x80) o += s[i];  // an invalid byte stays as it is
    else append_utf8(o, f(c, i));
    i += n;
  }
  return o;
}

}  // namespace

std::string py_upper(std::string_view s) {
  return map_cps(s, [](uint32_t c, size_t) { return cp_upper(c); });
}

std::string py_lower(std::string_view s) {
  return map_cps(s, [](uint32_t c, size_t) { return cp_lower(c); });
}

std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_cps(s, [&](uint32_t c, size_t) {
    bool cased = cp_cased(c);
    uint32_t r = cased ? (prev_cased ? cp_lower(c) : cp_upper(c)) : c;
    prev_cased = cased;
    return r;
  });
}

std::string py_capitalize(std::string_view s) {
  return map_cps(s, [](uint32_t c, size_t i) { return i == 0 ? cp_upper(c) : cp_lower(c); });
}

std::string jinja_title(std::string_view s) {
  // Jinja2's title filter: a word starts after whitespace, '-', '(', '{',
  // '[' or '<'; its first character is upper-cased and the rest lower-cased.
  bool start = true;
  return map_cps(s, [&](uint32_t c, size_t) {
    bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    uint32_t r = sep ? c : start ? cp_upper(c) : cp_lower(c);
    start = sep;
    return r;
  });
}

}  // namespace ebb::jinja
