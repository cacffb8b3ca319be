// The Jinja parser's statements and its entry point (parser.h); the
// expressions are in parser_expr.cpp.
#include "model/jinja/parser.h"

#include "model/jinja/parser_internal.h"

namespace ebb::jinja {

// Parses until "{% NAME" with NAME in `ends` (left at NAME) or the end.
Body Parser::subparse(std::initializer_list<const char*> ends) {
  DepthGuard g(*this);
  Body body;
  for (;;) {
    const Token& t = cur();
    if (t.type == Tok::End) {
      if (ends.size()) fail_here(std::string("unexpected end of template, expected '") + *ends.begin() + "'");
      return body;
    }
    if (t.type == Tok::Text) {
      auto s = stmt(StmtKind::Text, t);
      s->text = t.text;
      body.push_back(std::move(s));
      next();
    } else if (t.type == Tok::VarBegin) {
      auto s = stmt(StmtKind::Output, t);
      next();
      s->expr = parse_tuple(true);
      if (cur().type != Tok::VarEnd) fail_here("expected end of print statement, got " + describe(cur()));
      next();
      body.push_back(std::move(s));
    } else if (t.type == Tok::BlockBegin) {
      next();
      if (cur().type != Tok::Name) fail_here("expected a tag name, got " + describe(cur()));
      for (const char* e : ends)
        if (cur().text == e) return body;
      body.push_back(statement());
    } else {
      fail_here("unexpected " + describe(t));
    }
  }
}

// After subparse stopped at an end tag name: consumes "endX %}".
void Parser::end_tag(const char* name) {
  if (!skip_name(name)) fail_here(std::string("expected '") + name + "'");
  expect_block_end();
}

StmtPtr Parser::statement() {
  const Token& t = cur();
  const std::string& n = t.text;
  if (n == "if") return parse_if();
  if (n == "for") return parse_for();
  if (n == "set") return parse_set();
  if (n == "macro") return parse_macro();
  if (n == "call") return parse_call_block();
  if (n == "filter") return parse_filter_block();
  if (n == "with") return parse_with();
  if (n == "break" || n == "continue") {
    if (loop_depth_ == 0) fail_here("'" + n + "' outside of a loop");
    auto s = stmt(n == "break" ? StmtKind::Break : StmtKind::Continue, t);
    next();
    expect_block_end();
    return s;
  }
  if (n == "include" || n == "import" || n == "extends" || n == "from" || n == "block")
    fail_here("the '" + n + "' tag is not supported: a chat template cannot load other templates");
  if (n.rfind("end", 0) == 0 || n == "else" || n == "elif")
    fail_here("unexpected tag '" + n + "' (no block to close here)");
  fail_here("unknown tag '" + n + "'");
}

StmtPtr Parser::parse_if() {
  auto s = stmt(StmtKind::If, cur());
  next();
  for (;;) {
    ExprPtr cond = parse_tuple(false);
    expect_block_end();
    Body body = subparse({"elif", "else", "endif"});
    s->branches.emplace_back(std::move(cond), std::move(body));
    if (skip_name("elif")) continue;
    if (skip_name("else")) {
      expect_block_end();
      s->else_body = subparse({"endif"});
    }
    end_tag("endif");
    return s;
  }
}

void Parser::parse_targets(Stmt& s) {
  bool paren = skip_op("(");
  s.targets.push_back(expect_name());
  while (skip_op(",")) {
    s.unpack = true;
    if (cur().type != Tok::Name) break;
    s.targets.push_back(expect_name());
  }
  if (paren) {
    s.unpack = true;
    expect_op(")");
  }
}

StmtPtr Parser::parse_for() {
  auto s = stmt(StmtKind::For, cur());
  next();
  parse_targets(*s);
  if (!skip_name("in")) fail_here("expected 'in' in for loop, got " + describe(cur()));
  s->expr = parse_tuple(false);
  if (is_name("recursive")) fail_here("recursive for loops are not supported");
  if (skip_name("if")) s->cond = parse_expression(true);
  expect_block_end();
  ++loop_depth_;
  s->body = subparse({"endfor", "else"});
  --loop_depth_;
  if (skip_name("else")) {
    expect_block_end();
    s->else_body = subparse({"endfor"});
  }
  end_tag("endfor");
  return s;
}

StmtPtr Parser::parse_set() {
  const Token& t = cur();
  next();
  std::string first = expect_name();
  if (skip_op(".")) {
    auto s = stmt(StmtKind::Set, t);
    s->targets.push_back(first);
    s->text = expect_name();
    expect_op("=");
    s->expr = parse_tuple(true);
    expect_block_end();
    return s;
  }
  if (is_op("=") || is_op(",")) {
    auto s = stmt(StmtKind::Set, t);
    s->targets.push_back(first);
    while (skip_op(",")) {
      s->unpack = true;
      s->targets.push_back(expect_name());
    }
    expect_op("=");
    s->expr = parse_tuple(true);
    expect_block_end();
    return s;
  }
  auto s = stmt(StmtKind::SetBlock, t);
  s->targets.push_back(first);
  if (is_op("|")) s->expr = parse_filter_chain(nullptr);
  expect_block_end();
  s->body = subparse({"endset"});
  end_tag("endset");
  return s;
}

void Parser::parse_params(std::vector<Param>& params) {
  expect_op("(");
  while (!is_op(")")) {
    if (!params.empty()) expect_op(",");
    if (is_op(")")) break;
    Param p;
    p.name = expect_name();
    if (skip_op("=")) p.def = parse_expression(true);
    params.push_back(std::move(p));
  }
  expect_op(")");
}

StmtPtr Parser::parse_macro() {
  auto s = stmt(StmtKind::Macro, cur());
  next();
  s->text = expect_name();
  parse_params(s->params);
  expect_block_end();
  int saved = loop_depth_;
  loop_depth_ = 0;
  macros_.push_back(s.get());
  s->body = subparse({"endmacro"});
  macros_.pop_back();
  loop_depth_ = saved;
  skip_name("endmacro");
  if (cur().type == Tok::Name) next();  // {% endmacro name %}
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_call_block() {
  auto s = stmt(StmtKind::CallBlock, cur());
  next();
  if (is_op("(")) parse_params(s->params);
  s->expr = parse_expression(true);
  if (s->expr->kind != ExprKind::Call) fail_at(toks_[i_ - 1], "expected a call in the call tag");
  expect_block_end();
  int saved = loop_depth_;
  loop_depth_ = 0;
  macros_.push_back(s.get());
  s->body = subparse({"endcall"});
  macros_.pop_back();
  loop_depth_ = saved;
  end_tag("endcall");
  return s;
}

StmtPtr Parser::parse_filter_block() {
  auto s = stmt(StmtKind::FilterBlock, cur());
  next();
  s->expr = parse_filter_chain(nullptr, true);
  expect_block_end();
  s->body = subparse({"endfilter"});
  end_tag("endfilter");
  return s;
}

StmtPtr Parser::parse_with() {
  auto s = stmt(StmtKind::With, cur());
  next();
  while (cur().type != Tok::BlockEnd) {
    if (!s->assigns.empty()) expect_op(",");
    std::string n = expect_name();
    expect_op("=");
    s->assigns.emplace_back(n, parse_expression(true));
  }
  expect_block_end();
  s->body = subparse({"endwith"});
  end_tag("endwith");
  return s;
}

std::unique_ptr<Template> parse_template(std::string_view source, const JinjaLimits& limits) {
  auto tpl = std::make_unique<Template>();
  tpl->source = normalize_source(source);
  uint32_t err_off = 0;
  std::vector<Token> toks;
  try {
    toks = lex(tpl->source, err_off);
  } catch (const Fail& f) {
    LineIndex idx(tpl->source);
    int line = 0, col = 0;
    idx.locate(err_off, line, col);
    throw ebb::Error("chat template line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + f.what());
  }
  Parser p(tpl->source, std::move(toks), limits);
  tpl->body = p.parse_all();
  return tpl;
}

}  // namespace ebb::jinja
