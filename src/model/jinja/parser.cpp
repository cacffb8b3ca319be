#include "model/jinja/parser.h"

#include <initializer_list>

#include "model/jinja/builtins.h"
#include "model/jinja/lexer.h"

namespace ebb::jinja {

namespace {

class Parser {
 public:
  Parser(const std::string& src, std::vector<Token> toks, const JinjaLimits& limits)
      : index_(src), toks_(std::move(toks)), max_depth_(limits.max_depth), max_stack_(limits.max_stack_bytes) {
    stack_base_ = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  }

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::End) fail_here("unexpected tag");
    return body;
  }

 private:
  LineIndex index_;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int max_depth_;
  size_t max_stack_;
  uintptr_t stack_base_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Stmt*> macros_;  // the macros (and call blocks) being parsed, innermost last

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.max_depth_)
        p.fail_here("template nested too deeply (more than " + std::to_string(p.max_depth_) + " levels)");
      uintptr_t here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
      if (p.stack_base_ > here && p.stack_base_ - here > p.max_stack_)
        p.fail_here("template nested too deeply (parser stack over " + std::to_string(p.max_stack_) + " bytes)");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(i_ + n, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  Pos pos_of(const Token& t) const {
    Pos p;
    index_.locate(t.offset, p.line, p.col);
    return p;
  }

  [[noreturn]] void fail_at(const Token& t, const std::string& msg) const {
    Pos p = pos_of(t);
    throw ebb::Error("chat template line " + std::to_string(p.line) + ", column " + std::to_string(p.col) + ": " + msg);
  }
  [[noreturn]] void fail_here(const std::string& msg) const { fail_at(cur(), msg); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::End: return "end of template";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::Text: return "template data";
      case Tok::String: return "string literal";
      case Tok::Int:
      case Tok::Float: return "number '" + t.text + "'";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_here(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail_here("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail_here("expected end of statement block, got " + describe(cur()));
    next();
  }

  ExprPtr node(ExprKind k, const Token& t) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos_of(t);
    return e;
  }
  // Sets e's height from its children; a chain such as a+b+c+... or
  // a|f|f|f... grows the tree without recursion in the parser, so the height
  // is bounded here (it bounds the renderer's recursion and the destructor's).
  ExprPtr finish(ExprPtr e) {
    int d = 0;
    auto see = [&](const ExprPtr& c) {
      if (c && c->depth > d) d = c->depth;
    };
    see(e->a);
    see(e->b);
    see(e->c);
    for (const auto& c : e->items) see(c);
    for (const auto& a : e->args) see(a.value);
    e->depth = d + 1;
    if (e->depth > max_depth_) {
      Pos p = e->pos;
      throw ebb::Error("chat template line " + std::to_string(p.line) + ", column " + std::to_string(p.col) +
                       ": expression nested too deeply (more than " + std::to_string(max_depth_) + " levels)");
    }
    return e;
  }

  StmtPtr stmt(StmtKind k, const Token& t) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->pos = pos_of(t);
    return s;
  }

  // ---- statements ----

  // Parses until "{% NAME" with NAME in `ends` (left at NAME) or the end.
  Body subparse(std::initializer_list<const char*> ends) {
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
  void end_tag(const char* name) {
    if (!skip_name(name)) fail_here(std::string("expected '") + name + "'");
    expect_block_end();
  }

  StmtPtr statement() {
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

  StmtPtr parse_if() {
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

  void parse_targets(Stmt& s) {
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

  StmtPtr parse_for() {
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

  StmtPtr parse_set() {
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

  void parse_params(std::vector<Param>& params) {
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

  StmtPtr parse_macro() {
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

  StmtPtr parse_call_block() {
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

  StmtPtr parse_filter_block() {
    auto s = stmt(StmtKind::FilterBlock, cur());
    next();
    s->expr = parse_filter_chain(nullptr, true);
    expect_block_end();
    s->body = subparse({"endfilter"});
    end_tag("endfilter");
    return s;
  }

  StmtPtr parse_with() {
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

  // ---- expressions ----

  // Comma-separated expressions; more than one (or a trailing comma) is a tuple.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false) {
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

  ExprPtr parse_expression(bool with_condexpr) {
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

  ExprPtr binary(const Token& t, const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = node(ExprKind::Binary, t);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return finish(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& t = cur();
      next();
      e = binary(t, "or", std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& t = cur();
      next();
      e = binary(t, "and", std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
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
  ExprPtr parse_compare() {
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
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = cur();
      std::string op = t.text;
      next();
      e = binary(t, op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& t = cur();
      next();
      e = binary(t, "~", std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = cur();
      std::string op = t.text;
      next();
      e = binary(t, op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = cur();
      next();
      e = binary(t, "**", std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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

  ExprPtr parse_postfix(ExprPtr e) {
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

  ExprPtr parse_filter_expr(ExprPtr e) {
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

  ExprPtr parse_subscript(ExprPtr obj) {
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

  void parse_args(std::vector<Arg>& args) {
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

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur());
    e->a = std::move(callee);
    parse_args(e->args);
    return finish(std::move(e));
  }

  // "| name(args) | name2 ..." applied to `input` (null for filter blocks).
  ExprPtr parse_filter_chain(ExprPtr input, bool start_inline = false) {
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

  ExprPtr parse_test(ExprPtr obj) {
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
};

}  // namespace

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
