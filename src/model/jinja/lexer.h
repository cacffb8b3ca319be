// The Jinja lexer: template text to tokens, with the whitespace rules of
// Jinja2 3.1 as transformers configures it (trim_blocks: the first newline
// after a block or comment tag is dropped; lstrip_blocks: spaces and tabs
// before a block or comment tag at the start of a line are dropped; "{%-",
// "-%}", "{{-", "-}}" strip all whitespace on that side; "{%+" / "+%}"
// turn lstrip / trim off for one tag). Comments are dropped, raw blocks
// become text, and the source's newlines are normalised to "\n" with one
// trailing newline removed (keep_trailing_newline=False).
//
// Expression tokens carry their decoded value: string literals have their
// Python escapes resolved, numbers are parsed. Every token has its byte
// offset in the normalised source; LineIndex turns it into line and column.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ebb::jinja {

enum class Tok : uint8_t { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;  // Text: the text; Name/Op: the spelling; String: the decoded value
  uint32_t offset = 0;
  int64_t ival = 0;
  double fval = 0;
};

// 1-based line and column of a byte offset.
class LineIndex {
 public:
  explicit LineIndex(std::string_view source);
  void locate(uint32_t offset, int& line, int& col) const;

 private:
  std::vector<uint32_t> starts_;
};

// "\r\n" and "\r" to "\n", one trailing newline removed.
std::string normalize_source(std::string_view source);

// Tokenizes a normalised source. Throws jinja::Fail carrying the offset in
// `error_offset` (a lexer error: unterminated tag, string or comment, an
// unexpected character, unbalanced brackets).
std::vector<Token> lex(const std::string& source, uint32_t& error_offset);

}  // namespace ebb::jinja
