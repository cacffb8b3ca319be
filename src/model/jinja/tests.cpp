// Jinja2's tests (`x is defined`, `x is divisibleby 3`, ...), builtins.h.
#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"

namespace ebb::jinja {

namespace {

const char* const kTests[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                              "iterable", "sequence", "boolean", "true", "false", "odd", "even", "divisibleby",
                              "equalto", "eq", "==", "ne", "!=", "lt", "<", "lessthan", "gt", ">", "greaterthan",
                              "le", "<=", "ge", ">=", "in", "callable", "sameas", "lower", "upper", "escaped",
                              "filter", "test", nullptr};

const Value& need(const CallArgs& a, std::string_view test) {
  if (a.pos.empty()) throw Fail("test '" + std::string(test) + "' needs an argument");
  return a.pos[0];
}

}  // namespace

bool has_test(std::string_view name) {
  for (const char* const* t = kTests; *t; ++t)
    if (name == *t) return true;
  return false;
}

bool apply_test(Renderer& r, std::string_view t, const Value& v, CallArgs& a) {
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_int();
  if (t == "float") return v.is_float();
  if (t == "boolean") return v.is_bool();
  if (t == "true") return v.is_bool() && v.as_bool();
  if (t == "false") return v.is_bool() && !v.as_bool();
  if (t == "mapping") return v.is_dict() && !v.dict().is_namespace;
  if (t == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict().is_namespace);
  if (t == "sequence")
    return v.is_undefined() || v.is_string() || (v.is_list() && (!v.list().iter_type || std::string_view(v.list().iter_type).substr(0, 5) == "dict_")) ||
           (v.is_dict() && !v.dict().is_namespace);
  if (t == "callable") return v.is_callable() || v.is_undefined();  // Undefined defines __call__
  if (t == "odd" || t == "even") {
    Value m = binary_op(r, "%", v, Value(int64_t(2)));
    return equals(m, Value(int64_t(t == "odd" ? 1 : 0)));
  }
  if (t == "divisibleby") return equals(binary_op(r, "%", v, need(a, t)), Value(int64_t(0)));
  if (t == "equalto" || t == "eq" || t == "==") return equals(v, need(a, t));
  if (t == "ne" || t == "!=") return !equals(v, need(a, t));
  if (t == "lt" || t == "<" || t == "lessthan") return compare(v, need(a, t), "<") < 0;
  if (t == "gt" || t == ">" || t == "greaterthan") return compare(v, need(a, t), ">") > 0;
  if (t == "le" || t == "<=") return compare(v, need(a, t), "<=") <= 0;
  if (t == "ge" || t == ">=") return compare(v, need(a, t), ">=") >= 0;
  if (t == "in") return contains(need(a, t), v);
  if (t == "sameas") {
    const Value& o = need(a, t);
    if (v.identity() || o.identity()) return v.identity() == o.identity();
    return v.kind() == o.kind() && equals(v, o);
  }
  if (t == "lower" || t == "upper") {
    CallArgs none;
    std::optional<Value> res = call_method(r, Value(to_str(v)), t == "lower" ? "islower" : "isupper", none);
    return res && truthy(*res);
  }
  if (t == "escaped") return false;
  if (t == "filter") return v.is_string() && has_filter(v.str());
  if (t == "test") return v.is_string() && has_test(v.str());
  throw Fail("unknown test '" + std::string(t) + "'");
}

}  // namespace ebb::jinja
