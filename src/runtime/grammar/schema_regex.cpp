#include "runtime/grammar/schema_regex.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "platform/error.h"

namespace ebb::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMax = 0x10FFFF;

std::string cp_escape(uint32_t cp) {
  char buf[16];
  if (cp < 0x80 && cp >= 0x20 && cp != '"' && cp != '\\' && cp != ']' && cp != '[' && cp != '-' && cp != '^') {
    return std::string(1, static_cast<char>(cp));
  }
  if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

Ranges complement(const Ranges& in) {
  Ranges n = normalize(in), out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : n) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMax) out.push_back({next, kMax});
  return out;
}

bool has(const Ranges& r, uint32_t cp) {
  for (const auto& [lo, hi] : r)
    if (lo <= cp && cp <= hi) return true;
  return false;
}

// The JSON text of a set of string characters: plain characters as one
// class, `"`, `\` and control characters by their escapes.
std::string emit_set(const Ranges& in) {
  const Ranges r = normalize(in);
  Ranges plain;
  for (auto [lo, hi] : r) {
    // Cut out 0x00-0x1F, '"' (0x22) and '\' (0x5C).
    auto add = [&](uint32_t a, uint32_t b) {
      if (a <= b) plain.push_back({a, b});
    };
    lo = std::max<uint32_t>(lo, 0x20);
    if (lo > hi) continue;
    uint32_t a = lo;
    for (const uint32_t cut : {0x22u, 0x5Cu}) {
      if (cut >= a && cut <= hi) {
        add(a, cut - 1);
        a = cut + 1;
      }
    }
    add(a, hi);
  }
  std::vector<std::string> alts;
  if (!plain.empty()) {
    std::string cls = "[";
    for (const auto& [lo, hi] : plain) {
      cls += cp_escape(lo);
      if (hi != lo) cls += "-" + cp_escape(hi);
    }
    alts.push_back(cls + "]");
  }
  if (has(r, '"')) alts.push_back("\"\\\\\\\"\"");  // \"
  if (has(r, '\\')) alts.push_back("\"\\\\\\\\\"");  // \\ (two backslashes)
  const std::pair<uint32_t, const char*> controls[] = {{'\n', "n"}, {'\t', "t"}, {'\r', "r"}, {'\b', "b"}, {'\f', "f"}};
  for (const auto& [c, e] : controls)
    if (has(r, c)) alts.push_back(std::string("\"\\\\") + e + "\"");
  if (alts.empty()) throw Error("JSON schema pattern: a character class that matches no character a JSON string can hold");
  if (alts.size() == 1) return alts[0];
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

class RegexParser {
 public:
  RegexParser(std::string_view p) : p_(p) {}

  std::string run(const std::string& any) {
    bool start = false, end = false;
    if (!p_.empty() && p_[0] == '^') {
      start = true;
      pos_ = 1;
    }
    size_t stop = p_.size();
    if (stop > pos_ && p_[stop - 1] == '$' && !(stop >= 2 && p_[stop - 2] == '\\')) {
      end = true;
      --stop;
    }
    p_ = p_.substr(0, stop);
    std::string body = alternation();
    if (pos_ != p_.size()) fail("unbalanced ')'");
    std::string out;
    if (!start) out += any + "* ";
    out += "(" + body + ")";
    if (!end) out += " " + any + "*";
    return out;
  }

 private:
  std::string_view p_;
  size_t pos_ = 0;
  int depth_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("JSON schema pattern \"" + std::string(p_) + "\": " + what + " at offset " + std::to_string(pos_) +
                " is not supported");
  }
  bool eof() const { return pos_ >= p_.size(); }
  char peek() const { return eof() ? '\0' : p_[pos_]; }

  std::string alternation() {
    std::string s = sequence();
    while (peek() == '|') {
      ++pos_;
      s += " | " + sequence();
    }
    return s;
  }

  std::string sequence() {
    std::string s;
    while (!eof() && peek() != '|' && peek() != ')') {
      std::string atom = parse_atom();
      atom = quantify("(" + atom + ")");
      s += (s.empty() ? "" : " ") + atom;
    }
    return s.empty() ? "\"\"" : s;
  }

  int number() {
    size_t start = pos_;
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 10000) fail("a repetition count over 10000");
      ++pos_;
    }
    return pos_ == start ? -1 : static_cast<int>(v);
  }

  std::string quantify(std::string atom) {
    const char c = peek();
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      ++pos_;
      int m = number();
      if (m < 0) m = 0;
      int n = m;
      if (peek() == ',') {
        ++pos_;
        n = number();
      }
      if (peek() != '}') fail("a malformed {m,n}");
      ++pos_;
      if (n >= 0 && n < m) fail("{m,n} with n < m");
      q = "{" + std::to_string(m) + (n == m ? "" : "," + (n < 0 ? std::string() : std::to_string(n))) + "}";
    } else {
      return atom;
    }
    if (peek() == '?') ++pos_;  // lazy: the same language
    else if (peek() == '+') fail("a possessive quantifier");
    return atom + q;
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const char c = peek();
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) fail("a malformed hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  uint32_t utf8() {
    const auto c = static_cast<unsigned char>(p_[pos_]);
    const int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (extra < 0 || pos_ + static_cast<size_t>(extra) >= p_.size() + (extra ? 0 : 1)) fail("invalid UTF-8");
    uint32_t cp = extra ? c & (0x3F >> extra) : c;
    ++pos_;
    for (int i = 0; i < extra; ++i) cp = (cp << 6) | (static_cast<unsigned char>(p_[pos_++]) & 0x3F);
    return cp;
  }

  // An escape after the backslash: either a set (\d) or one character.
  Ranges escape(bool in_class) {
    const char e = peek();
    ++pos_;
    const Ranges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                 space = {{' ', ' '}, {'\t', '\r'}};
    switch (e) {
      case 'd': return digit;
      case 'w': return word;
      case 's': return space;
      case 'D': return complement(digit);
      case 'W': return complement(word);
      case 'S': return complement(space);
      case 't': return {{'\t', '\t'}};
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'x': { const uint32_t v = hex(2); return {{v, v}}; }
      case 'u': { const uint32_t v = hex(4); return {{v, v}}; }
      default: break;
    }
    if (e == 'b' && in_class) return {{'\b', '\b'}};
    if (std::string_view(".\\/-^$*+?()[]{}|\"'").find(e) != std::string_view::npos && e != '\0')
      return {{static_cast<uint32_t>(e), static_cast<uint32_t>(e)}};
    --pos_;
    fail(std::string("the escape \\") + e);
  }

  std::string parse_atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
          while (!eof() && peek() != '>') ++pos_;
          ++pos_;
        } else if (peek() == 'P' && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
          while (!eof() && peek() != '>') ++pos_;
          ++pos_;
        } else {
          fail("a lookaround or inline flag group '(?'");
        }
      }
      if (++depth_ > 64) fail("groups nested deeper than 64");
      std::string inner = alternation();
      if (peek() != ')') fail("an unclosed '('");
      ++pos_;
      --depth_;
      return inner;
    }
    if (c == '[') return emit_set(parse_class());
    if (c == '.') {
      ++pos_;
      return emit_set(complement({{'\n', '\n'}, {'\r', '\r'}}));
    }
    if (c == '\\') {
      ++pos_;
      if (peek() >= '1' && peek() <= '9') fail("a backreference");
      if (peek() == 'b' || peek() == 'B') fail("a word boundary");
      if (peek() == 'p' || peek() == 'P') fail("a Unicode property class");
      return emit_set(escape(false));
    }
    if (c == '^' || c == '$') fail(std::string("the anchor '") + c + "' inside the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') fail(std::string("'") + c + "' with nothing to repeat");
    const uint32_t cp = utf8();
    return emit_set({{cp, cp}});
  }

  Ranges parse_class() {
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (first || peek() != ']') {
      if (eof()) fail("an unclosed '['");
      first = false;
      Ranges item;
      bool single = true;
      if (peek() == '\\') {
        ++pos_;
        item = escape(true);
        single = item.size() == 1 && item[0].first == item[0].second;
      } else if (peek() == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
        fail("a POSIX class '[:'");
      } else {
        const uint32_t cp = utf8();
        item = {{cp, cp}};
      }
      if (single && peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        if (peek() == '\\') {
          ++pos_;
          Ranges e = escape(true);
          if (e.size() != 1 || e[0].first != e[0].second) fail("a range ending in a class escape");
          hi = e[0].first;
        } else {
          hi = utf8();
        }
        if (hi < item[0].first) fail("a character range with its end before its start");
        item = {{item[0].first, hi}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    ++pos_;
    return negated ? complement(r) : normalize(r);
  }
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern, const std::string& any_char_rule) {
  return RegexParser(pattern).run(any_char_rule);
}

std::string gbnf_literal(std::string_view text) {
  std::string s = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') s += "\\\"";
    else if (c == '\\') s += "\\\\";
    else if (c == '\n') s += "\\n";
    else if (c == '\t') s += "\\t";
    else if (c == '\r') s += "\\r";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      s += buf;
    } else {
      s += ch;  // UTF-8 passes through: the grammar parser decodes it
    }
  }
  return s + "\"";
}

}  // namespace ebb::grammar
