// The template's global functions (builtins.h): transformers' two
// (raise_exception, strftime_now) and Jinja2's (namespace, range, dict,
// cycler, joiner).
#include <ctime>
#include <functional>

#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"

namespace ebb::jinja {

namespace {

const char* const kGlobals[] = {"raise_exception", "strftime_now", "namespace", "range", "dict", "cycler", "joiner",
                                nullptr};

// The sandbox's limit on range() (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

struct Fn : Callable {
  std::string fname;
  std::function<Value(Renderer&, CallArgs&)> fn;
  Value call(Renderer& r, CallArgs& a) override { return fn(r, a); }
  std::string name() const override { return fname; }
};

Value make_fn(std::string name, std::function<Value(Renderer&, CallArgs&)> fn) {
  auto f = std::make_shared<Fn>();
  f->fname = std::move(name);
  f->fn = std::move(fn);
  return Value(std::shared_ptr<Callable>(std::move(f)));
}

Value strftime_now(Renderer& r, CallArgs& a) {
  if (a.pos.empty() || !a.pos[0].is_string()) throw Fail("strftime_now() needs a format string");
  const std::string& fmt = a.pos[0].str();
  if (fmt.empty()) return Value("");
  r.check_string(fmt.size() * 16);
  std::time_t t = r.now();
  std::tm tm{};
  localtime_r(&t, &tm);
  std::string buf(fmt.size() * 16 + 64, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  if (n == 0) throw Fail("strftime_now(): the formatted date is too long or empty");
  buf.resize(n);
  return Value(std::move(buf));
}

Value range_fn(Renderer& r, CallArgs& a) {
  if (a.pos.empty() || a.pos.size() > 3) throw Fail("range expected 1 to 3 arguments");
  for (const auto& v : a.pos)
    if (!v.is_int() && !v.is_bool()) throw Fail("'" + type_name(v) + "' object cannot be interpreted as an integer");
  auto iv = [&](size_t i) { return a.pos[i].is_bool() ? int64_t(a.pos[i].as_bool()) : a.pos[i].as_int(); };
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = iv(0);
  } else {
    start = iv(0);
    stop = iv(1);
    if (a.pos.size() == 3) step = iv(2);
  }
  if (step == 0) throw Fail("range() arg 3 must not be zero");
  __int128 n = step > 0 ? (__int128(stop) - start + step - 1) / step : (__int128(start) - stop - step - 1) / -step;
  if (n < 0) n = 0;
  if (n > kMaxRange)
    throw Fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(kMaxRange) + ").");
  r.check_list(size_t(n));
  std::vector<Value> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < int64_t(n); ++i) out.emplace_back(int64_t(start + i * step));
  return Value::make_list(std::move(out), false, nullptr);
}

struct CyclerObj : Object, std::enable_shared_from_this<CyclerObj> {
  std::vector<Value> items;
  mutable size_t pos = 0;
  Value getattr(std::string_view n) const override {
    if (n == "current") return items.empty() ? Value::none() : items[pos % items.size()];
    auto self = std::const_pointer_cast<CyclerObj>(shared_from_this());
    if (n == "next")
      return make_fn("next", [self](Renderer&, CallArgs&) {
        if (self->items.empty()) throw Fail("cycler has no items");
        Value v = self->items[self->pos % self->items.size()];
        self->pos = (self->pos + 1) % self->items.size();
        return v;
      });
    if (n == "reset")
      return make_fn("reset", [self](Renderer&, CallArgs&) {
        self->pos = 0;
        return Value::none();
      });
    return Value::undefined("'Cycler object' has no attribute '" + std::string(n) + "'");
  }
  std::string type_name() const override { return "Cycler"; }
};

}  // namespace

const char* const* global_names() { return kGlobals; }

Value make_global(std::string_view name) {
  if (name == "raise_exception")
    return make_fn("raise_exception", [](Renderer&, CallArgs& a) -> Value {
      throw Fail("the template raised an error: " + (a.pos.empty() ? std::string() : to_str(a.pos[0])));
    });
  if (name == "strftime_now") return make_fn("strftime_now", strftime_now);
  if (name == "range") return make_fn("range", range_fn);
  if (name == "namespace" || name == "dict")
    return make_fn(std::string(name), [ns = name == "namespace"](Renderer& r, CallArgs& a) {
      Value d = Value::new_dict();
      d.dict().is_namespace = ns;
      if (ns) r.track_namespace(d.dict_ptr());
      if (!a.pos.empty()) {
        if (a.pos.size() > 1 || !a.pos[0].is_dict()) throw Fail("expected at most one mapping argument");
        for (const auto& [k, v] : a.pos[0].dict().items) d.dict().set(k, v);
      }
      for (const auto& [k, v] : a.kw) d.dict().set(Value(k), v);
      return d;
    });
  if (name == "cycler")
    return make_fn("cycler", [](Renderer&, CallArgs& a) {
      auto c = std::make_shared<CyclerObj>();
      c->items = a.pos;
      return Value(std::shared_ptr<Object>(std::move(c)));
    });
  if (name == "joiner")
    return make_fn("joiner", [](Renderer&, CallArgs& a) {
      std::string sep = a.pos.empty() ? ", " : to_str(a.pos[0]);
      auto used = std::make_shared<bool>(false);
      return make_fn("joiner", [sep, used](Renderer&, CallArgs&) {
        if (!*used) {
          *used = true;
          return Value("");
        }
        return Value(sep);
      });
    });
  return Value::undefined(std::string("'").append(name).append("' is undefined"));
}

}  // namespace ebb::jinja
