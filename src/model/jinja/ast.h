// The Jinja syntax tree the parser builds and the renderer walks. Nodes are
// immutable after parsing (a parsed template is shared by concurrent
// renders); each carries its 1-based line and column for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace ebb::jinja {

struct Pos {
  int line = 0, col = 0;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind : uint8_t {
  Literal,    // value
  Name,       // name
  List,       // items
  Tuple,      // items
  Dict,       // items (key, value, key, value...)
  GetAttr,    // a.name
  GetItem,    // a[b]
  Slice,      // a[b:c:d] (items: start, stop, step, each may be null)
  Call,       // a(args)
  Filter,     // a | name(args)   (a null for a filter block's input)
  Test,       // a is [not] name(args)
  Unary,      // op a   ("not", "-", "+")
  Binary,     // a op b (+ - * / // % ** ~ and or in, "not in")
  Compare,    // a op b op c ... (ops, items: operands)
  Cond,       // b if a else c
};

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  Pos pos;
  std::string name;              // Name, GetAttr, Filter, Test, Unary/Binary op
  Value value;                   // Literal
  ExprPtr a, b, c;               // operands
  std::vector<ExprPtr> items;    // List, Tuple, Dict, Slice, Compare operands
  std::vector<std::string> ops;  // Compare operators
  std::vector<Arg> args;         // Call, Filter, Test
  bool negated = false;          // Test: "is not"
  int depth = 1;                 // height of this subtree (bounded by the parser)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind : uint8_t {
  Text,      // text
  Output,    // {{ expr }}
  If,        // branches: (cond, body)..., else_body
  For,       // targets in expr [if cond]: body [else else_body]
  Set,       // targets = expr  |  ns.attr = expr (attr set)
  SetBlock,  // {% set name | filters %}body{% endset %}
  Macro,     // name(params) body
  CallBlock, // {% call(params) expr %}body
  FilterBlock,  // {% filter chain %}body
  With,      // {% with a = x, ... %}body
  Break,
  Continue,
};

struct Param {
  std::string name;
  ExprPtr def;  // null: no default
};

struct Stmt {
  StmtKind kind;
  Pos pos;
  std::string text;                  // Text; Macro name; Set attr (ns.attr)
  ExprPtr expr;                      // Output, For iterable, Set value, CallBlock call, FilterBlock chain
  ExprPtr cond;                      // For filter
  std::vector<std::string> targets;  // For, Set, SetBlock: names (unpacking when more than one)
  bool unpack = false;               // For/Set: targets were written as a tuple
  std::vector<std::pair<ExprPtr, Body>> branches;  // If
  Body body, else_body;
  std::vector<Param> params;         // Macro, CallBlock
  std::vector<std::pair<std::string, ExprPtr>> assigns;  // With
  // Macro, CallBlock: the body refers to `caller`, `varargs`, `kwargs`
  // (Jinja2 refuses extra arguments to a macro that does not).
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

struct Template {
  std::string source;  // normalised
  Body body;
};

}  // namespace ebb::jinja
