#include "model/jinja/interpreter.h"

#include <chrono>

#include "model/jinja/builtins.h"

namespace ebb::jinja {

namespace {

// The `loop` variable of a for loop.
struct LoopObj : Object, std::enable_shared_from_this<LoopObj> {
  std::shared_ptr<const std::vector<Value>> items;
  int64_t index0 = 0;
  mutable Value last_changed;  // loop.changed(): the arguments of its last call
  mutable bool changed_called = false;

  int64_t length() const { return int64_t(items->size()); }
  Value getattr(std::string_view n) const override;
  std::string type_name() const override { return "LoopContext"; }
};

struct CycleFn : Callable {
  std::shared_ptr<const LoopObj> loop;
  bool changed = false;  // loop.changed rather than loop.cycle
  Value call(Renderer&, CallArgs& args) override {
    if (changed) {
      Value now = Value::make_list(args.pos, true);
      if (loop->changed_called && equals(now, loop->last_changed)) return Value(false);
      loop->changed_called = true;
      loop->last_changed = now;
      return Value(true);
    }
    if (args.pos.empty()) throw Fail("no items for cycling given");
    return args.pos[size_t(loop->index0) % args.pos.size()];
  }
  std::string name() const override { return changed ? "changed" : "cycle"; }
};

Value LoopObj::getattr(std::string_view n) const {
  int64_t len = length();
  if (n == "index") return Value(index0 + 1);
  if (n == "index0") return Value(index0);
  if (n == "revindex") return Value(len - index0);
  if (n == "revindex0") return Value(len - index0 - 1);
  if (n == "first") return Value(index0 == 0);
  if (n == "last") return Value(index0 == len - 1);
  if (n == "length") return Value(len);
  if (n == "depth") return Value(int64_t(1));
  if (n == "depth0") return Value(int64_t(0));
  if (n == "previtem") return index0 > 0 ? (*items)[size_t(index0 - 1)] : Value::undefined("there is no previous item");
  if (n == "nextitem") return index0 + 1 < len ? (*items)[size_t(index0 + 1)] : Value::undefined("there is no next item");
  if (n == "cycle" || n == "changed") {
    auto c = std::make_shared<CycleFn>();
    c->loop = shared_from_this();
    c->changed = n == "changed";
    return Value(std::shared_ptr<Callable>(std::move(c)));
  }
  return Value::undefined("'LoopContext object' has no attribute '" + std::string(n) + "'");
}

}  // namespace

Renderer::Renderer(const Template& tpl, const JinjaLimits& limits, std::function<std::time_t()> clock)
    : tpl_(tpl), limits_(limits), clock_(std::move(clock)) {
  frames_.emplace_back();
  for (const char* const* n = global_names(); *n; ++n) frames_[0].vars.emplace_back(*n, make_global(*n));
}

Renderer::~Renderer() {
  for (auto& w : namespaces_)
    if (auto ns = w.lock()) {
      auto items = std::move(ns->items);  // freed after the namespace no longer holds them
      ns->items.clear();
    }
}

void Renderer::set_global(std::string name, Value v) {
  for (auto& [k, old] : frames_[0].vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  frames_[0].vars.emplace_back(std::move(name), std::move(v));
}

std::string Renderer::render() {
  start_ = std::chrono::steady_clock::now();
  std::string out;
  out_ = &out;
  stack_base_ = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  try {
    exec_body(tpl_.body);
  } catch (const Fail& f) {
    throw ebb::Error("chat template line " + std::to_string(pos_.line) + ", column " + std::to_string(pos_.col) + ": " +
                     f.what());
  } catch (const ebb::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ebb::Error("chat template line " + std::to_string(pos_.line) + ", column " + std::to_string(pos_.col) + ": " +
                     e.what());
  }
  out_ = nullptr;
  return out;
}

void Renderer::check_string(size_t n) const {
  if (n > limits_.max_string_bytes)
    throw Fail("string of " + std::to_string(n) + " bytes exceeds the limit of " +
               std::to_string(limits_.max_string_bytes) + " bytes");
}

void Renderer::check_list(size_t n) const {
  if (n > limits_.max_list_items)
    throw Fail("list of " + std::to_string(n) + " items exceeds the limit of " + std::to_string(limits_.max_list_items) +
               " items");
}

void Renderer::charge(int64_t units) {
  int64_t before = work_;
  work_ += units;
  if (work_ > limits_.max_work)
    throw Fail("template does too much work (more than " + std::to_string(limits_.max_work) + " steps)");
  // The clock, every 4096 steps: a catch-all for work the counts miss
  // (comparing deeply nested values, say).
  if (limits_.max_render_ms > 0 && (before >> 12) != (work_ >> 12)) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_).count();
    if (ms > limits_.max_render_ms)
      throw Fail("template takes too long to render (more than " + std::to_string(limits_.max_render_ms) + " ms)");
  }
}

// What touching a value costs in work units: strings by bytes, containers
// by items (a 4 MiB string searched a million times must count).
static int64_t cost(const Value& v) {
  switch (v.kind()) {
    case Kind::String: return int64_t(v.str().size() / 16);
    case Kind::List: return int64_t(v.list().items.size());
    case Kind::Dict: return int64_t(v.dict().items.size());
    default: return 0;
  }
}

void Renderer::check_stack() {
  uintptr_t here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (stack_base_ > here && stack_base_ - here > limits_.max_stack_bytes)
    throw Fail("template recursion too deep (stack over " + std::to_string(limits_.max_stack_bytes) + " bytes)");
}

void Renderer::write(std::string_view s) {
  if (out_->size() + s.size() > limits_.max_output_bytes)
    throw Fail("output exceeds the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
  out_->append(s);
}

void Renderer::write_value(const Value& v) {
  if (v.is_string()) {
    write(v.str());
  } else if (!v.is_undefined()) {
    std::string s;
    append_str(s, v);
    write(s);
  }
}

// ---- scopes ----

const Value* Renderer::lookup(std::string_view name) const {
  for (size_t i = frames_.size(); i-- > 0;) {
    for (const auto& [k, v] : frames_[i].vars)
      if (k == name) return &v;
    if (frames_[i].barrier && i > 0) i = 1;  // next: the global frame
  }
  return nullptr;
}

void Renderer::assign(const std::string& name, Value v) {
  auto& vars = frames_.back().vars;
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

void Renderer::assign_targets(const std::vector<std::string>& names, bool unpack, const Value& v) {
  if (!unpack) {
    assign(names[0], v);
    return;
  }
  std::vector<Value> items = iterate(v);
  if (items.size() < names.size())
    throw Fail("not enough values to unpack (expected " + std::to_string(names.size()) + ", got " +
               std::to_string(items.size()) + ")");
  if (items.size() > names.size())
    throw Fail("too many values to unpack (expected " + std::to_string(names.size()) + ")");
  for (size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
}

Value Renderer::capture() const {
  if (frames_.size() <= 1) return Value();
  Value d = Value::new_dict();
  for (size_t i = frames_.size(); i-- > 1;) {
    for (const auto& [k, v] : frames_[i].vars)
      if (!d.dict().find(std::string_view(k))) d.dict().items.emplace_back(Value(k), v);
    if (frames_[i].barrier) break;
  }
  return d;
}

// ---- statements ----

Renderer::Flow Renderer::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Renderer::render_to_string(const Body& body) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_body(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Renderer::Flow Renderer::exec(const Stmt& s) {
  charge(1);
  check_stack();
  switch (s.kind) {
    case StmtKind::Text: write(s.text); return Flow::Normal;
    case StmtKind::Output: {
      Value v = eval(*s.expr);
      pos_ = s.pos;
      write_value(v);
      return Flow::Normal;
    }
    case StmtKind::If:
      for (const auto& [cond, body] : s.branches) {
        pos_ = s.pos;
        if (truthy(eval(*cond))) return exec_body(body);
      }
      return exec_body(s.else_body);
    case StmtKind::For: return exec_for(s);
    case StmtKind::Set:
    case StmtKind::SetBlock: exec_set(s); return Flow::Normal;
    case StmtKind::Macro: {
      auto m = std::make_shared<MacroFn>();
      m->def = &s;
      m->name_ = s.text;
      m->closure = capture();
      assign(s.text, Value(std::shared_ptr<Callable>(std::move(m))));
      return Flow::Normal;
    }
    case StmtKind::CallBlock: exec_call_block(s); return Flow::Normal;
    case StmtKind::FilterBlock: {
      Value body(render_to_string(s.body));
      pos_ = s.pos;
      write_value(eval_filter(*s.expr, &body));
      return Flow::Normal;
    }
    case StmtKind::With: {
      std::vector<Value> vals;
      for (const auto& [n, e] : s.assigns) vals.push_back(eval(*e));
      frames_.emplace_back();
      for (size_t i = 0; i < vals.size(); ++i) assign(s.assigns[i].first, std::move(vals[i]));
      Flow f;
      try {
        f = exec_body(s.body);
      } catch (...) {
        frames_.pop_back();
        throw;
      }
      frames_.pop_back();
      return f;
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

void Renderer::exec_set(const Stmt& s) {
  if (s.kind == StmtKind::SetBlock) {
    Value v(render_to_string(s.body));
    if (s.expr) v = eval_filter(*s.expr, &v);
    assign(s.targets[0], std::move(v));
    return;
  }
  Value v = eval(*s.expr);
  pos_ = s.pos;
  if (!s.text.empty()) {  // ns.attr = v
    const Value* ns = lookup(s.targets[0]);
    if (!ns || !ns->is_dict() || !ns->dict().is_namespace)
      throw Fail("cannot assign attribute '" + s.text + "' on '" + s.targets[0] + "': not a namespace object");
    ns->dict().set(Value(s.text), std::move(v));
    return;
  }
  assign_targets(s.targets, s.unpack, v);
}

Renderer::Flow Renderer::exec_for(const Stmt& s) {
  Value seq = eval(*s.expr);
  pos_ = s.pos;
  auto items = std::make_shared<std::vector<Value>>(iterate(seq));
  frames_.emplace_back();
  struct Pop {
    std::vector<Frame>& f;
    ~Pop() { f.pop_back(); }
  } pop{frames_};
  if (s.cond) {
    std::vector<Value> kept;
    for (auto& it : *items) {
      charge(1);
      assign_targets(s.targets, s.unpack, it);
      if (truthy(eval(*s.cond))) kept.push_back(std::move(it));
    }
    *items = std::move(kept);
  }
  if (items->empty()) return exec_body(s.else_body);  // a break there belongs to an outer loop
  auto loop = std::make_shared<LoopObj>();
  loop->items = items;
  Value loop_value{std::shared_ptr<Object>(loop)};
  for (size_t i = 0; i < items->size(); ++i) {
    if (++iterations_ > limits_.max_loop_iterations) {
      pos_ = s.pos;
      throw Fail("too many loop iterations (more than " + std::to_string(limits_.max_loop_iterations) + ")");
    }
    loop->index0 = int64_t(i);
    // Each iteration starts afresh: a `set` in the body lasts to the end of
    // that iteration only (Jinja2 scopes it to the loop body).
    frames_.back().vars.clear();
    assign("loop", loop_value);
    assign_targets(s.targets, s.unpack, (*items)[i]);
    if (exec_body(s.body) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Renderer::exec_call_block(const Stmt& s) {
  auto caller = std::make_shared<MacroFn>();
  caller->def = &s;
  caller->name_ = "caller";
  caller->closure = capture();
  const Expr& call = *s.expr;
  Value fn = eval(*call.a);
  CallArgs args;
  eval_args(call.args, args);
  args.kw.emplace_back("caller", Value(std::shared_ptr<Callable>(std::move(caller))));
  pos_ = s.pos;
  write_value(this->call(fn, args));
}

Value Renderer::call(const Value& fn, CallArgs& args) {
  if (fn.is_callable()) return fn.callable().call(*this, args);
  if (fn.is_undefined()) fn.fail_undefined();
  throw Fail("'" + type_name(fn) + "' object is not callable");
}

Value Renderer::call_macro(const MacroFn& m, CallArgs& args) {
  if (macro_depth_ >= limits_.max_depth)
    throw Fail("macro calls nested too deeply (more than " + std::to_string(limits_.max_depth) + ")");
  check_stack();
  const Stmt& def = *m.def;
  Frame f;
  f.barrier = true;
  if (m.closure.is_dict())
    for (const auto& [k, v] : m.closure.dict().items) f.vars.emplace_back(k.str(), v);
  frames_.push_back(std::move(f));
  ++macro_depth_;
  struct Pop {
    Renderer& r;
    ~Pop() {
      r.frames_.pop_back();
      --r.macro_depth_;
    }
  } pop{*this};
  std::vector<bool> used_kw(args.kw.size(), false);
  for (size_t i = 0; i < def.params.size(); ++i) {
    const Param& p = def.params[i];
    const Value* v = nullptr;
    for (size_t k = 0; k < args.kw.size(); ++k)
      if (args.kw[k].first == p.name) {
        v = &args.kw[k].second;
        used_kw[k] = true;
      }
    if (!v && i < args.pos.size()) v = &args.pos[i];
    if (v) assign(p.name, *v);
    else if (p.def) assign(p.name, eval(*p.def));
    else assign(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
  }
  if (args.pos.size() > def.params.size() && !def.uses_varargs)
    throw Fail("macro '" + m.name_ + "' takes not more than " + std::to_string(def.params.size()) + " argument(s)");
  std::vector<Value> extra;
  for (size_t i = def.params.size(); i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
  assign("varargs", Value::make_list(std::move(extra), true));
  Value kwargs = Value::new_dict();
  for (size_t k = 0; k < args.kw.size(); ++k) {
    if (used_kw[k]) continue;
    const std::string& name = args.kw[k].first;
    if (name == "caller" && def.kind == StmtKind::Macro && def.uses_caller) {
      assign("caller", args.kw[k].second);
      continue;
    }
    if (!def.uses_kwargs) throw Fail("macro '" + m.name_ + "' takes no keyword argument '" + name + "'");
    kwargs.dict().items.emplace_back(Value(name), args.kw[k].second);
  }
  assign("kwargs", kwargs);
  return Value(render_to_string(def.body));
}

// ---- expressions ----

void Renderer::eval_args(const std::vector<Arg>& in, CallArgs& out) {
  for (const auto& a : in) {
    Value v = eval(*a.value);
    charge(cost(v));
    if (a.name.empty()) out.pos.push_back(std::move(v));
    else out.kw.emplace_back(a.name, std::move(v));
  }
}

Value Renderer::eval(const Expr& e) {
  charge(1);
  switch (e.kind) {
    case ExprKind::Literal: return e.value;
    case ExprKind::Name: {
      const Value* v = lookup(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& x : e.items) items.push_back(eval(*x));
      return Value::make_list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      Value d = Value::new_dict();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i]);
        if (!is_hashable(k)) throw Fail("unhashable type: '" + type_name(k) + "'");
        d.dict().set(std::move(k), eval(*e.items[i + 1]));
      }
      return d;
    }
    case ExprKind::GetAttr: {
      Value obj = eval(*e.a);
      pos_ = e.pos;
      if (obj.is_undefined()) obj.fail_undefined();
      return get_attr(obj, e.name);
    }
    case ExprKind::GetItem: {
      Value obj = eval(*e.a);
      Value key = eval(*e.b);
      pos_ = e.pos;
      if (obj.is_string()) charge(cost(obj));  // indexing by code point scans the string
      if (obj.is_undefined()) obj.fail_undefined();
      return get_item(obj, key);
    }
    case ExprKind::Slice: {
      Value obj = eval(*e.a);
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        if (e.items[size_t(i)]) parts[i] = eval(*e.items[size_t(i)]);
      pos_ = e.pos;
      charge(cost(obj));
      if (obj.is_undefined()) obj.fail_undefined();
      return get_slice(*this, obj, e.items[0] ? &parts[0] : nullptr, e.items[1] ? &parts[1] : nullptr,
                       e.items[2] ? &parts[2] : nullptr);
    }
    case ExprKind::Call: return eval_call(e);
    case ExprKind::Filter: return eval_filter(e, nullptr);
    case ExprKind::Test: {
      Value v = eval(*e.a);
      CallArgs args;
      eval_args(e.args, args);
      pos_ = e.pos;
      charge(cost(v));
      bool r = apply_test(*this, e.name, v, args);
      return Value(e.negated ? !r : r);
    }
    case ExprKind::Unary: {
      Value v = eval(*e.a);
      pos_ = e.pos;
      if (e.name == "not") return Value(!truthy(v));
      return unary_op(e.name, v);
    }
    case ExprKind::Binary: {
      if (e.name == "and") {
        Value a = eval(*e.a);
        return truthy(a) ? eval(*e.b) : a;
      }
      if (e.name == "or") {
        Value a = eval(*e.a);
        return truthy(a) ? a : eval(*e.b);
      }
      Value a = eval(*e.a);
      Value b = eval(*e.b);
      pos_ = e.pos;
      charge(cost(a) + cost(b));
      Value r = binary_op(*this, e.name, a, b);
      if (r.is_string()) charge(int64_t(r.str().size() / 16));
      return r;
    }
    case ExprKind::Compare: return eval_compare(e);
    case ExprKind::Cond:
      if (truthy(eval(*e.a))) return eval(*e.b);
      if (e.c) return eval(*e.c);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value();
}

Value Renderer::eval_compare(const Expr& e) {
  Value left = eval(*e.items[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i + 1]);
    pos_ = e.pos;
    charge(cost(left) + cost(right));
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==") ok = equals(left, right);
    else if (op == "!=") ok = !equals(left, right);
    else if (op == "in") ok = contains(right, left);
    else if (op == "not in") ok = !contains(right, left);
    else {
      int c = compare(left, right, op.c_str());
      ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Renderer::eval_call(const Expr& e) {
  check_stack();
  CallArgs args;
  Value r;
  if (e.a->kind == ExprKind::GetAttr) {
    Value obj = eval(*e.a->a);
    eval_args(e.args, args);
    pos_ = e.pos;
    if (obj.is_undefined()) obj.fail_undefined();
    charge(cost(obj));
    std::optional<Value> m = call_method(*this, obj, e.a->name, args);
    r = m ? std::move(*m) : call(get_attr(obj, e.a->name), args);
  } else {
    Value fn = eval(*e.a);
    eval_args(e.args, args);
    pos_ = e.pos;
    r = call(fn, args);
  }
  if (r.is_string()) {
    check_string(r.str().size());
    charge(int64_t(r.str().size() / 16));
  }
  return r;
}

Value Renderer::eval_filter(const Expr& e, const Value* input) {
  // A filter block's chain has no input expression: the innermost filter
  // takes the block's text.
  Value v = input ? (e.a ? eval_filter(*e.a, input) : *input) : eval(*e.a);
  CallArgs args;
  eval_args(e.args, args);
  pos_ = e.pos;
  charge(cost(v));
  Value r = apply_filter(*this, e.name, v, args);
  if (r.is_string()) {
    check_string(r.str().size());
    charge(int64_t(r.str().size() / 16));
  } else if (r.is_list()) {
    charge(int64_t(r.list().items.size()));
  }
  return r;
}

}  // namespace ebb::jinja
