// The regular expressions of JSON Schema's `pattern`, translated to a GBNF
// expression for the inside of a JSON string (between the quotes).
//
// Supported: literals and escapes (\d \w \s \D \W \S \t \n \r \xNN \uNNNN
// and escaped metacharacters), `.`, character classes (ranges, negation,
// the class escapes), groups `( )` `(?: )` `(?<name> )`, alternation,
// quantifiers `* + ? {m} {m,} {m,n}` (a lazy `?` after them is accepted: it
// does not change the language), `^` at the start and `$` at the end.
// A pattern without `^` (or `$`) may match anywhere in the string, as JSON
// Schema says, so any characters are allowed before (or after) it.
// Anything else (backreferences, lookaround, \b, anchors elsewhere, Unicode
// property classes) throws ebb::Error naming the construct and where.
//
// The translation speaks of the string's characters, while the grammar
// produces its JSON text: `"` and `\` become the escapes \" and \\, control
// characters their short escapes (\n, \t, ...), so what the grammar accepts
// decodes to strings the pattern matches.
#pragma once

#include <string>
#include <string_view>

namespace ebb::grammar {

// `any_char_rule` names a GBNF rule matching one JSON string character
// (plain or escaped), used for the unanchored ends.
std::string regex_to_gbnf(std::string_view pattern, const std::string& any_char_rule);

// A GBNF string literal ("...") for `text`, with escapes for what GBNF needs.
std::string gbnf_literal(std::string_view text);

}  // namespace ebb::grammar
