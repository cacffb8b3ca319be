// The Jinja parser: source text to a Template (ast.h), following Jinja2
// 3.1's grammar and operator precedence (or < and < not < comparisons <
// + - < ~ < * / // % < ** < unary - + < filters, tests, calls, subscripts).
//
// Statements: if/elif/else, for (with unpacking, a trailing `if` filter and
// else), set (plain, tuple, namespace attribute, block form with filters),
// macro, call, filter, with, break, continue, raw (in the lexer). Tags that
// load other templates (include, import, extends, block) are refused:
// a chat template stands alone.
//
// Hostile input: nesting deeper than limits.max_depth (statements and
// expressions), or parser recursion beyond limits.max_stack_bytes, is an
// error, not a stack overflow. Unknown filters and tests are errors here, as
// Jinja2 finds them when it compiles. Every error is an ebb::Error
// "chat template line L, column C: what".
#pragma once

#include <memory>
#include <string_view>

#include "model/jinja/ast.h"
#include "model/jinja/limits.h"

namespace ebb::jinja {

std::unique_ptr<Template> parse_template(std::string_view source, const JinjaLimits& limits);

}  // namespace ebb::jinja
