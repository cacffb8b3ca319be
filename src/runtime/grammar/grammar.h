// A compiled context-free grammar: GBNF text (llama.cpp's grammar format,
// grammars/README.md there) turned into flat rules that the matcher walks.
//
// Shape: every rule is a list of alternatives; every alternative is a run of
// elements in `elems` ended by an End element. An element is either a
// character set (matching one Unicode code point) or a reference to a rule.
// Repetitions (`*` `+` `?` `{m,n}`) and groups are expanded at compile time
// into helper rules named `<rule>-<n>`, all right-recursive, so the matcher
// needs only sequence, choice and reference.
//
// Syntax (llama.cpp's): `name ::= alternatives`, one rule per line unless
// inside parentheses or after `::=` or `|`; names of letters, digits, `-`
// (and `_`); "literals" and [classes] with escapes \n \t \r \" \\ \xNN
// \uNNNN \UNNNNNNNN (and \[ \] \- \/ \^ \' \.); [^negated] classes; `.` any
// character; ( groups ); postfix * + ? {m} {m,} {m,n} {,n}; # comments.
// Beyond llama.cpp: an alternative may begin a following line with `|`.
//
// Contract, checked by Grammar::parse (ebb::Error naming line and column):
//  - a rule `root` exists; every referenced rule is defined;
//  - no rule is left-recursive, directly or through rules that can match the
//    empty string (the matcher would loop);
//  - the limits in GrammarLimits hold (rules, elements, nesting, repetition
//    counts), so no text can make compilation blow up: `x{0,100000}` is an
//    error naming the limit, not 100,000 rules.
// A Grammar is immutable after parse and shared (shared_ptr<const Grammar>)
// by every matcher that constrains a sequence with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ebb::grammar {

struct GrammarLimits {
  size_t max_text_bytes = 4u << 20;  // GBNF source size
  size_t max_rules = 200000;         // after expansion of repetitions and groups
  size_t max_elements = 4000000;     // after expansion
  int max_nesting = 128;             // parentheses depth
  int max_repetition = 10000;        // m and n in {m,n}
};

// One set of code points, as sorted, disjoint, closed ranges; the ASCII part
// is also a bitmap for the common case.
struct CharSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // [lo, hi], sorted, merged
  uint64_t ascii[2] = {0, 0};                         // bit c set: c in the set (c < 128)

  bool contains(uint32_t cp) const;
  // True when some code point in [lo, hi] is in the set.
  bool intersects(uint32_t lo, uint32_t hi) const;
  // True when every code point in [lo, hi] is in the set.
  bool contains_range(uint32_t lo, uint32_t hi) const;
};

enum class ElemType : uint8_t { End, Char, Ref };

struct Elem {
  ElemType type;
  uint32_t arg;  // Char: index into charsets; Ref: rule index; End: 0
};

struct Grammar {
  std::vector<Elem> elems;          // alternatives, each ended by an End element
  std::vector<uint32_t> alt_start;  // [n_alternatives] index of each alternative's first element
  std::vector<std::pair<uint32_t, uint32_t>> rule_alts;  // [n_rules] [begin, end) into alt_start
  std::vector<CharSet> charsets;
  std::vector<std::string> rule_names;  // [n_rules]
  uint32_t root = 0;

  // Compiles GBNF text. Throws ebb::Error "grammar line L column C: ..." on
  // bad syntax, an undefined rule, left recursion or a limit.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, const GrammarLimits& limits = {});

  size_t n_rules() const { return rule_alts.size(); }
  // The index of a rule by name, or -1.
  int32_t find_rule(std::string_view name) const;
};

}  // namespace ebb::grammar
