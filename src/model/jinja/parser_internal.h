// The Jinja parser's internals, shared by parser.cpp (statements) and
// parser_expr.cpp (expressions). Not part of the engine's interface:
// parser.h is.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "model/jinja/ast.h"
#include "model/jinja/lexer.h"
#include "model/jinja/limits.h"

namespace ebb::jinja {

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
  Body subparse(std::initializer_list<const char*> ends);
  void end_tag(const char* name);
  StmtPtr statement();
  StmtPtr parse_if();
  void parse_targets(Stmt& s);
  StmtPtr parse_for();
  StmtPtr parse_set();
  void parse_params(std::vector<Param>& params);
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  StmtPtr parse_with();

  // ---- expressions ----
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr binary(const Token& t, const std::string& op, ExprPtr a, ExprPtr b);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filter_expr(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr obj);
  void parse_args(std::vector<Arg>& args);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_filter_chain(ExprPtr input, bool start_inline = false);
  ExprPtr parse_test(ExprPtr obj);
};

}  // namespace ebb::jinja
