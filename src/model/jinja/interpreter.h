// The Jinja renderer: walks a parsed Template with one set of variables and
// produces the text. One Renderer per render call (it holds the call's
// scopes, output and counters), so a parsed Template can be rendered by many
// threads at once.
//
// Scoping follows Jinja2: a for loop's body (afresh at each iteration), a
// macro's body and a with block have their own scope (a `set` inside does
// not leak out; namespace() objects carry values across); if blocks do not.
// Macros see the template's top-level variables at call time and, when
// defined inside a loop or a macro, the variables around their definition.
//
// Limits (limits.h) are checked as the render goes: loop iterations, macro
// depth, native stack, output and intermediate sizes, total work. Any
// failure is an ebb::Error "chat template line L, column C: what".
#pragma once

#include <chrono>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/ast.h"
#include "model/jinja/limits.h"
#include "model/jinja/value.h"

namespace ebb::jinja {

struct MacroFn;

class Renderer {
 public:
  Renderer(const Template& tpl, const JinjaLimits& limits, std::function<std::time_t()> clock);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // A variable of the template's global scope (messages, bos_token, ...).
  void set_global(std::string name, Value v);
  // Renders the template; throws ebb::Error with the line and column.
  std::string render();

  // For the builtins.
  const JinjaLimits& limits() const { return limits_; }
  std::time_t now() const { return clock_ ? clock_() : std::time(nullptr); }
  // Throws Fail when a string of n bytes or a list of n items would cross
  // the limits (called before building it).
  void check_string(size_t n) const;
  void check_list(size_t n) const;
  // Counts work (a node evaluated, bytes built); throws past max_work.
  void charge(int64_t units);
  // namespace() objects are the only mutable values, so the only way to a
  // reference cycle (ns.self = ns); the renderer empties them when it ends.
  void track_namespace(const Value::DictPtr& ns) { namespaces_.push_back(ns); }
  // Calls any callable value (a macro, a global function).
  Value call(const Value& fn, CallArgs& args);
  // Renders a macro's or a call block's body (MacroFn::call).
  Value call_macro(const MacroFn& m, CallArgs& args);

 private:
  enum class Flow { Normal, Break, Continue };
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    bool barrier = false;  // a macro's frame: lookups go from here to the global frame
  };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  void exec_call_block(const Stmt& s);
  std::string render_to_string(const Body& body);
  Value eval(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e, const Value* input);
  Value eval_compare(const Expr& e);
  void eval_args(const std::vector<Arg>& in, CallArgs& out);
  void write(std::string_view s);
  void write_value(const Value& v);

  const Value* lookup(std::string_view name) const;
  void assign(const std::string& name, Value v);
  void assign_targets(const std::vector<std::string>& names, bool unpack, const Value& v);
  // The variables visible here, above the global frame (a macro's closure).
  Value capture() const;
  void check_stack();

  const Template& tpl_;
  const JinjaLimits& limits_;
  std::function<std::time_t()> clock_;
  std::vector<Frame> frames_;
  std::string* out_ = nullptr;
  Pos pos_;
  int64_t iterations_ = 0;
  int64_t work_ = 0;
  int macro_depth_ = 0;
  uintptr_t stack_base_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::vector<std::weak_ptr<DictObj>> namespaces_;
};

// A macro (or a call block's body, passed as `caller`).
struct MacroFn : Callable {
  const Stmt* def = nullptr;  // Macro or CallBlock statement
  Value closure;              // dict of captured variables, or undefined
  std::string name_;
  Value call(Renderer& r, CallArgs& args) override { return r.call_macro(*this, args); }
  std::string name() const override { return name_; }
};

}  // namespace ebb::jinja
