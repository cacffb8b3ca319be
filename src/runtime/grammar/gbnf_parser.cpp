// GBNF text -> Grammar (grammar.h). A recursive-descent parser that builds
// rules as it reads, expanding repetitions into right-recursive helper rules,
// then checks references, left recursion and the limits.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "platform/error.h"
#include "runtime/grammar/grammar.h"

namespace ebb::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

using Seq = std::vector<Elem>;  // one alternative, no End element

struct RuleDraft {
  std::string name;
  std::vector<Seq> alts;
  bool defined = false;
  size_t def_pos = 0;  // where it was defined (or, for a helper, where its owner was)
  size_t ref_pos = 0;  // first reference, for "undefined rule" errors
};

class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits) : text_(text), limits_(limits) {}

  std::shared_ptr<const Grammar> run() {
    if (text_.size() > limits_.max_text_bytes)
      throw Error("grammar: the text is " + std::to_string(text_.size()) + " bytes, over the limit of " +
                  std::to_string(limits_.max_text_bytes));
    skip_space(true);
    while (pos_ < text_.size()) {
      parse_rule();
      skip_space(true);
    }
    return finish();
  }

 private:
  std::string_view text_;
  const GrammarLimits& limits_;
  size_t pos_ = 0;
  std::vector<RuleDraft> rules_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> charset_ids_;
  std::vector<CharSet> charsets_;
  size_t n_elems_ = 0;
  int depth_ = 0;

  // The message is capped (a rule name can be megabytes long in hostile text).
  [[noreturn]] void fail_at(size_t pos, const std::string& what_in) const {
    constexpr size_t kMaxMessage = 300;
    const std::string what =
        what_in.size() <= kMaxMessage ? what_in : what_in.substr(0, kMaxMessage) + "... (" +
                                                      std::to_string(what_in.size() - kMaxMessage) + " more bytes)";
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error("grammar line " + std::to_string(line) + " column " + std::to_string(col) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }

  bool eof() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  void skip_space(bool newlines) {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else if (c == '\n' && newlines) {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t ref_pos) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    if (rules_.size() >= limits_.max_rules)
      fail_at(ref_pos, "more than " + std::to_string(limits_.max_rules) + " rules (after expanding repetitions)");
    const auto id = static_cast<uint32_t>(rules_.size());
    rules_.push_back({name, {}, false, 0, ref_pos});
    by_name_.emplace(name, id);
    return id;
  }

  uint32_t new_helper(const std::string& owner) {
    for (size_t n = rules_.size();; ++n) {
      std::string name = owner + "-" + std::to_string(n);
      if (by_name_.count(name)) continue;
      const uint32_t id = rule_id(name, pos_);
      rules_[id].defined = true;
      rules_[id].def_pos = pos_;
      return id;
    }
  }

  void count_elems(size_t n) {
    n_elems_ += n;
    if (n_elems_ > limits_.max_elements)
      fail("more than " + std::to_string(limits_.max_elements) + " grammar elements (after expanding repetitions)");
  }

  void add_alt(uint32_t rule, Seq seq) {
    count_elems(seq.size() + 1);
    rules_[rule].alts.push_back(std::move(seq));
  }

  uint32_t charset_id(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    auto it = charset_ids_.find(merged);
    if (it != charset_ids_.end()) return it->second;
    CharSet cs;
    cs.ranges = merged;
    for (const auto& [lo, hi] : merged)
      for (uint32_t c = lo; c <= hi && c < 128; ++c) cs.ascii[c >> 6] |= uint64_t{1} << (c & 63);
    const auto id = static_cast<uint32_t>(charsets_.size());
    charsets_.push_back(std::move(cs));
    charset_ids_.emplace(std::move(merged), id);
    return id;
  }

  uint32_t hex_digits(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else fail("expected " + std::to_string(n) + " hex digits in an escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One code point of a literal or class: an escape or a UTF-8 character.
  uint32_t parse_char() {
    if (eof()) fail("unexpected end of text");
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '"': case '\\': case '[': case ']': case '-': case '/': case '^': case '\'': case '.':
          return static_cast<unsigned char>(e);
        case 'x': return hex_digits(2);
        case 'u': return check_cp(hex_digits(4));
        case 'U': return check_cp(hex_digits(8));
        default: --pos_; fail(std::string("unknown escape \\") + e);
      }
    }
    if (c == '\n') fail("newline inside a literal or character class");
    // UTF-8 decode.
    int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (extra < 0) fail("invalid UTF-8 in the grammar text");
    uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
    ++pos_;
    for (int i = 0; i < extra; ++i) {
      const auto b = static_cast<unsigned char>(peek());
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8 in the grammar text");
      cp = (cp << 6) | (b & 0x3F);
      ++pos_;
    }
    return cp;
  }

  uint32_t check_cp(uint32_t cp) {
    if (cp > kMaxCodePoint) fail("code point beyond U+10FFFF in an escape");
    return cp;
  }

  Seq parse_literal() {
    ++pos_;  // "
    Seq seq;
    while (peek() != '"') {
      if (eof()) fail("unterminated string literal");
      const uint32_t cp = parse_char();
      seq.push_back({ElemType::Char, charset_id({{cp, cp}})});
    }
    ++pos_;
    return seq;
  }

  Seq parse_class() {
    const size_t start = pos_;
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (peek() != ']') {
      if (eof()) fail_at(start, "unterminated character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail("character range with its end before its start");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (negated) {
      std::sort(ranges.begin(), ranges.end());
      std::vector<std::pair<uint32_t, uint32_t>> comp;
      uint32_t next = 0;
      for (const auto& [lo, hi] : ranges) {
        if (lo > next) comp.push_back({next, lo - 1});
        next = std::max(next, hi + 1);
      }
      if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
      ranges = std::move(comp);
    }
    if (ranges.empty()) fail_at(start, "character class that matches nothing");
    return {{ElemType::Char, charset_id(std::move(ranges))}};
  }

  int parse_count() {
    const size_t start = pos_;
    long long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > limits_.max_repetition)
        fail_at(start, "repetition count over the limit of " + std::to_string(limits_.max_repetition));
      ++pos_;
    }
    if (pos_ == start) fail("expected a number in {m,n}");
    return static_cast<int>(v);
  }

  // Replaces `item` by its repetition {min, max} (max -1: unbounded).
  void repeat(Seq& item, const std::string& owner, int min, int max) {
    Elem x = item[0];
    if (item.size() != 1) {
      const uint32_t sub = new_helper(owner);
      add_alt(sub, item);
      x = {ElemType::Ref, sub};
    }
    Seq out(static_cast<size_t>(min), x);
    count_elems(out.size());
    if (max < 0) {
      const uint32_t r = new_helper(owner);  // r ::= x r | ""
      add_alt(r, {x, {ElemType::Ref, r}});
      add_alt(r, {});
      out.push_back({ElemType::Ref, r});
    } else if (max > min) {
      uint32_t prev = new_helper(owner);  // o1 ::= x | ""
      add_alt(prev, {x});
      add_alt(prev, {});
      for (int k = 2; k <= max - min; ++k) {  // ok ::= x o(k-1) | ""
        const uint32_t o = new_helper(owner);
        add_alt(o, {x, {ElemType::Ref, prev}});
        add_alt(o, {});
        prev = o;
      }
      out.push_back({ElemType::Ref, prev});
    }
    item = std::move(out);
  }

  Seq parse_sequence(const std::string& owner, bool nested) {
    Seq seq;
    Seq last;  // the item a postfix operator applies to
    bool have_last = false;
    auto flush = [&] {
      if (have_last) seq.insert(seq.end(), last.begin(), last.end());
      last.clear();
      have_last = false;
    };
    for (;;) {
      const char c = peek();
      if (c == '"') {
        flush();
        last = parse_literal();
        have_last = true;
      } else if (c == '[') {
        flush();
        last = parse_class();
        have_last = true;
      } else if (c == '.') {
        flush();
        ++pos_;
        last = {{ElemType::Char, charset_id({{0, kMaxCodePoint}})}};
        have_last = true;
      } else if (is_name_char(c)) {
        flush();
        const size_t at = pos_;
        const std::string name = parse_name();
        last = {{ElemType::Ref, rule_id(name, at)}};
        have_last = true;
      } else if (c == '(') {
        flush();
        if (++depth_ > limits_.max_nesting)
          fail("parentheses nested deeper than " + std::to_string(limits_.max_nesting));
        ++pos_;
        skip_space(true);
        const uint32_t sub = new_helper(owner);
        parse_alternatives(sub, owner, true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        --depth_;
        last = {{ElemType::Ref, sub}};
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) fail(std::string("'") + c + "' with nothing before it to repeat");
        ++pos_;
        int min = 0, max = -1;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          skip_space(false);
          min = peek() == ',' ? 0 : parse_count();  // {,n}: {0,n}
          skip_space(false);
          max = min;
          if (peek() == ',') {
            ++pos_;
            skip_space(false);
            max = peek() == '}' ? -1 : parse_count();
            skip_space(false);
          }
          if (peek() != '}') fail("expected '}' after a repetition count");
          ++pos_;
          if (max >= 0 && max < min) fail("repetition {m,n} with n < m");
        }
        repeat(last, owner, min, max);
        flush();
      } else {
        break;
      }
      skip_space(nested);
    }
    flush();
    return seq;
  }

  void parse_alternatives(uint32_t rule, const std::string& owner, bool nested) {
    add_alt(rule, parse_sequence(owner, nested));
    for (;;) {
      if (peek() == '|') {
        ++pos_;
        skip_space(true);
        add_alt(rule, parse_sequence(owner, nested));
        continue;
      }
      if (!nested) {
        // An alternative may also start a following line: "a ::= x\n  | y".
        const size_t save = pos_;
        skip_space(true);
        if (peek() == '|') continue;
        pos_ = save;
      }
      break;
    }
  }

  void parse_rule() {
    const size_t at = pos_;
    const std::string name = parse_name();
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") fail("expected '::=' after the rule name '" + name + "'");
    pos_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, at);
    if (rules_[id].defined) fail_at(at, "rule '" + name + "' is defined twice");
    rules_[id].defined = true;
    rules_[id].def_pos = at;
    parse_alternatives(id, name, false);
    skip_space(false);
    if (!eof() && peek() != '\n') fail(std::string("unexpected '") + peek() + "'");
  }

  std::shared_ptr<const Grammar> finish() {
    for (const RuleDraft& r : rules_)
      if (!r.defined) fail_at(r.ref_pos, "undefined rule '" + r.name + "'");
    auto root = by_name_.find("root");
    if (root == by_name_.end()) fail_at(0, "no 'root' rule");

    auto g = std::make_shared<Grammar>();
    g->root = root->second;
    g->charsets = std::move(charsets_);
    for (const RuleDraft& r : rules_) {
      const auto begin = static_cast<uint32_t>(g->alt_start.size());
      for (const Seq& alt : r.alts) {
        g->alt_start.push_back(static_cast<uint32_t>(g->elems.size()));
        g->elems.insert(g->elems.end(), alt.begin(), alt.end());
        g->elems.push_back({ElemType::End, 0});
      }
      g->rule_alts.push_back({begin, static_cast<uint32_t>(g->alt_start.size())});
      g->rule_names.push_back(r.name);
    }
    check_left_recursion(*g);
    return g;
  }

  void check_left_recursion(const Grammar& g) {
    const size_t n = g.n_rules();
    // Nullable rules, by fixpoint.
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t a = g.rule_alts[r].first; a < g.rule_alts[r].second && !nullable[r]; ++a) {
          bool all = true;
          for (uint32_t e = g.alt_start[a]; g.elems[e].type != ElemType::End; ++e) {
            if (g.elems[e].type == ElemType::Char || !nullable[g.elems[e].arg]) {
              all = false;
              break;
            }
          }
          if (all) nullable[r] = changed = true;
        }
      }
    }
    // Left-corner edges, then a depth-first search for a cycle.
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t a = g.rule_alts[r].first; a < g.rule_alts[r].second; ++a)
        for (uint32_t e = g.alt_start[a]; g.elems[e].type == ElemType::Ref; ++e) {
          left[r].push_back(g.elems[e].arg);
          if (!nullable[g.elems[e].arg]) break;
        }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> stack;  // iterative: (rule, next edge)
    for (uint32_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      stack.push_back({start, 0});
      color[start] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i < left[r].size()) {
          const uint32_t s = left[r][i++];
          if (color[s] == 1) {
            // Report the user's rule, not a helper: the outermost rule of the cycle.
            std::string path;
            bool on = false;
            for (const auto& fr : stack) {
              on |= fr.first == s;
              if (on) path += g.rule_names[fr.first] + " -> ";
            }
            fail_at(rules_[s].def_pos, "rule '" + rules_[s].name + "' is left-recursive (" + path +
                                           g.rule_names[s] + "); rewrite it with repetition");
          }
          if (color[s] == 0) {
            color[s] = 1;
            stack.push_back({s, 0});
          }
        } else {
          color[r] = 2;
          stack.pop_back();
        }
      }
    }
  }
};

}  // namespace

bool CharSet::contains(uint32_t cp) const {
  if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->second;
}

bool CharSet::intersects(uint32_t lo, uint32_t hi) const {
  for (const auto& r : ranges)
    if (r.first <= hi && lo <= r.second) return true;
  return false;
}

bool CharSet::contains_range(uint32_t lo, uint32_t hi) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), lo,
                             [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  return it != ranges.begin() && hi <= std::prev(it)->second;  // merged ranges: one must cover it all
}

int32_t Grammar::find_rule(std::string_view name) const {
  for (size_t i = 0; i < rule_names.size(); ++i)
    if (rule_names[i] == name) return static_cast<int32_t>(i);
  return -1;
}

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, const GrammarLimits& limits) {
  return Parser(gbnf, limits).run();
}

}  // namespace ebb::grammar
