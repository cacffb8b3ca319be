// The Jinja parser's expressions, with Jinja2 3.1's precedence (parser.h).
#include "model/jinja/builtins.h"
#include "model/jinja/parser_internal.h"

namespace ebb::jinja {

// Comma-separated expressions; more than one (or a trailing comma) is a tuple.
ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_parens) {
  const Token& t = cur();
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  for (;;) {
    if (!items.empty()) {
      if (!skip_op(",")) break;
      is_tuple = true;
    }
    if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_op(")") ||
        (!items.empty() && is_name("if")) || (!items.empty() && is_name("recursive")))
      break;
    items.push_back(parse_expression(with_condexpr));
  }
  if (!is_tuple && items.size() == 1) return std::move(items[0]);
  if (items.empty() && !explicit_parens) fail_here("expected an expression, got " + describe(cur()));
  auto e = node(ExprKind::Tuple, t);
  e->items = std::move(items);
  return finish(std::move(e));
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard g(*this);
  if (!with_condexpr) return parse_or();
  ExprPtr e = parse_or();
  while (is_name("if")) {
    const Token& t = cur();
    next();
    auto c = node(ExprKind::Cond, t);
    c->a = parse_or();
    c->b = std::move(e);
    if (skip_name("else")) c->c = parse_expression(true);
    e = finish(std::move(c));
  }
  return e;
}

ExprPtr Parser::binary(const Token& t, const std::string& op, ExprPtr a, ExprPtr b) {
  auto e = node(ExprKind::Binary, t);
  e->name = op;
  e->a = std::move(a);
  e->b = std::move(b);
  return finish(std::move(e));
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (is_name("or")) {
    const Token& t = cur();
    next();
    e = binary(t, "or", std::move(e), parse_and());
  }
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (is_name("and")) {
    const Token& t = cur();
    next();
    e = binary(t, "and", std::move(e), parse_not());
  }
  return e;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard g(*this);
    auto e = node(ExprKind::Unary, cur());
    next();
    e->name = "not";
    e->a = parse_not();
    return finish(std::move(e));
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const Token& t = cur();
  ExprPtr first = parse_math1();
  ExprPtr cmp;
  for (;;) {
    std::string op;
    if (cur().type == Tok::Op &&
        (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" || cur().text == "<=" ||
         cur().text == ">=")) {
      op = cur().text;
      next();
    } else if (is_name("in")) {
      op = "in";
      next();
    } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
      op = "not in";
      next();
      next();
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(ExprKind::Compare, t);
      cmp->items.push_back(std::move(first));
    }
    cmp->ops.push_back(op);
    cmp->items.push_back(parse_math1());
  }
  return cmp ? finish(std::move(cmp)) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& t = cur();
    std::string op = t.text;
    next();
    e = binary(t, op, std::move(e), parse_concat());
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  ExprPtr e = parse_math2();
  while (is_op("~")) {
    const Token& t = cur();
    next();
    e = binary(t, "~", std::move(e), parse_math2());
  }
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& t = cur();
    std::string op = t.text;
    next();
    e = binary(t, op, std::move(e), parse_pow());
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (is_op("**")) {
    const Token& t = cur();
    next();
    e = binary(t, "**", std::move(e), parse_unary(true));
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard g(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    e = node(ExprKind::Unary, cur());
    e->name = cur().text;
    next();
    e->a = parse_unary(false);
    e = finish(std::move(e));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  switch (t.type) {
    case Tok::Name: {
      auto lit = [&](Value v) {
        auto e = node(ExprKind::Literal, t);
        e->value = std::move(v);
        next();
        return e;
      };
      if (t.text == "true" || t.text == "True") return lit(Value(true));
      if (t.text == "false" || t.text == "False") return lit(Value(false));
      if (t.text == "none" || t.text == "None") return lit(Value::none());
      auto e = node(ExprKind::Name, t);
      e->name = t.text;
      if (!macros_.empty()) {
        Stmt& m = *macros_.back();
        m.uses_caller |= e->name == "caller";
        m.uses_varargs |= e->name == "varargs";
        m.uses_kwargs |= e->name == "kwargs";
      }
      next();
      return e;
    }
    case Tok::String: {
      auto e = node(ExprKind::Literal, t);
      std::string s = t.text;
      next();
      while (cur().type == Tok::String) {
        s += cur().text;
        next();
      }
      e->value = Value(std::move(s));
      return e;
    }
    case Tok::Int:
    case Tok::Float: {
      auto e = node(ExprKind::Literal, t);
      e->value = t.type == Tok::Int ? Value(t.ival) : Value(t.fval);
      next();
      return e;
    }
    case Tok::Op:
      if (t.text == "(") {
        next();
        ExprPtr e = parse_tuple(true, true);
        expect_op(")");
        return e;
      }
      if (t.text == "[") {
        auto e = node(ExprKind::List, t);
        next();
        while (!is_op("]")) {
          if (!e->items.empty()) expect_op(",");
          if (is_op("]")) break;
          e->items.push_back(parse_expression(true));
        }
        expect_op("]");
        return finish(std::move(e));
      }
      if (t.text == "{") {
        auto e = node(ExprKind::Dict, t);
        next();
        while (!is_op("}")) {
          if (!e->items.empty()) expect_op(",");
          if (is_op("}")) break;
          e->items.push_back(parse_expression(true));
          expect_op(":");
          e->items.push_back(parse_expression(true));
        }
        expect_op("}");
        return finish(std::move(e));
      }
      break;
    default: break;
  }
  fail_here("unexpected " + describe(t));
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  for (;;) {
    if (is_op(".") || is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  for (;;) {
    if (is_op("|")) {
      e = parse_filter_chain(std::move(e));
    } else if (is_name("is")) {
      e = parse_test(std::move(e));
    } else if (is_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr obj) {
  const Token& t = cur();
  if (skip_op(".")) {
    if (cur().type == Tok::Name) {
      auto e = node(ExprKind::GetAttr, t);
      e->name = cur().text;
      e->a = std::move(obj);
      next();
      return finish(std::move(e));
    }
    if (cur().type == Tok::Int) {
      auto e = node(ExprKind::GetItem, t);
      e->a = std::move(obj);
      e->b = node(ExprKind::Literal, cur());
      e->b->value = Value(cur().ival);
      next();
      return finish(std::move(e));
    }
    fail_here("expected a name or a number after '.', got " + describe(cur()));
  }
  expect_op("[");
  ExprPtr parts[3];
  bool slice = false;
  int idx = 0;
  for (;;) {
    if (is_op("]")) break;
    if (skip_op(":")) {
      slice = true;
      if (++idx > 2) fail_here("too many ':' in subscript");
      continue;
    }
    if (parts[idx]) fail_here("expected ']' or ':', got " + describe(cur()));
    parts[idx] = parse_tuple(true);
  }
  expect_op("]");
  if (!slice) {
    if (!parts[0]) fail_at(t, "empty subscript");
    auto e = node(ExprKind::GetItem, t);
    e->a = std::move(obj);
    e->b = std::move(parts[0]);
    return finish(std::move(e));
  }
  auto e = node(ExprKind::Slice, t);
  e->a = std::move(obj);
  for (auto& p : parts) e->items.push_back(std::move(p));
  return finish(std::move(e));
}

void Parser::parse_args(std::vector<Arg>& args) {
  expect_op("(");
  bool seen_kw = false;
  while (!is_op(")")) {
    if (!args.empty()) expect_op(",");
    if (is_op(")")) break;
    if (is_op("*") || is_op("**")) fail_here("*args and **kwargs in calls are not supported");
    Arg a;
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
      a.name = cur().text;
      next();
      next();
      seen_kw = true;
    } else if (seen_kw) {
      fail_here("positional argument after a keyword argument");
    }
    a.value = parse_expression(true);
    args.push_back(std::move(a));
  }
  expect_op(")");
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto e = node(ExprKind::Call, cur());
  e->a = std::move(callee);
  parse_args(e->args);
  return finish(std::move(e));
}

// "| name(args) | name2 ..." applied to `input` (null for filter blocks).
ExprPtr Parser::parse_filter_chain(ExprPtr input, bool start_inline) {
  ExprPtr e = std::move(input);
  bool first = true;
  while (is_op("|") || (start_inline && first)) {
    if (!(start_inline && first)) next();
    first = false;
    const Token& t = cur();
    auto f = node(ExprKind::Filter, t);
    f->name = expect_name();
    while (is_op(".")) {  // dotted filter names
      next();
      f->name += '.';
      f->name += expect_name();
    }
    if (!has_filter(f->name)) fail_at(t, "unknown filter '" + f->name + "'");
    if (is_op("(")) parse_args(f->args);
    f->a = std::move(e);
    e = finish(std::move(f));
  }
  return e;
}

ExprPtr Parser::parse_test(ExprPtr obj) {
  const Token& t = cur();
  next();  // is
  auto e = node(ExprKind::Test, t);
  e->negated = skip_name("not");
  const Token& name_tok = cur();
  e->name = expect_name();
  if (!has_test(e->name)) fail_at(name_tok, "unknown test '" + e->name + "'");
  e->a = std::move(obj);
  if (is_op("(")) {
    parse_args(e->args);
  } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
              cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail_here("tests cannot be chained with 'is'");
    Arg a;
    a.value = parse_postfix(parse_primary());
    e->args.push_back(std::move(a));
  }
  return finish(std::move(e));
}

}  // namespace ebb::jinja
