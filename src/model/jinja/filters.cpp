// Jinja2's built-in filters (builtins.h), plus transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"
#include "model/jinja/json_dump.h"
#include "model/jinja/strings.h"

namespace ebb::jinja {

namespace {

const char* const kFilters[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "groupby", "indent", "int", "items", "join", "last", "length", "list", "lower",
    "map", "max", "min", "pprint", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson", "trim", "truncate", "unique",
    "upper", "wordcount", nullptr};

const Value* arg(const CallArgs& a, const char* name, size_t index) { return a.get(name, index); }

bool flag(const CallArgs& a, const char* name, size_t index, bool def) {
  const Value* v = arg(a, name, index);
  return v ? truthy(*v) : def;
}

int64_t int_opt(const CallArgs& a, const char* name, size_t index, int64_t def) {
  const Value* v = arg(a, name, index);
  if (!v || v->is_none()) return def;
  if (v->is_bool()) return v->as_bool();
  if (!v->is_int()) throw Fail(std::string("filter argument '") + name + "' must be an integer, not " + type_name(*v));
  return v->as_int();
}

// Jinja's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value lookup_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t p = 0;
  for (;;) {
    size_t dot = path.find('.', p);
    std::string part = path.substr(p, dot == std::string::npos ? std::string::npos : dot - p);
    if (cur.is_undefined()) cur.fail_undefined();
    bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    cur = get_item(cur, digits ? Value(int64_t(std::stoll(part.substr(0, 18)))) : Value(part));
    if (dot == std::string::npos) return cur;
    p = dot + 1;
  }
}

Value attr_or_self(const Value& v, const Value* attribute) {
  if (!attribute || attribute->is_none()) return v;
  if (attribute->is_int()) return get_item(v, *attribute);
  return lookup_path(v, to_str(*attribute));
}

// The sort key: lower-cased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.str()));
  return v;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&#34;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

namespace {

Value generator(std::vector<Value> items) { return Value::make_list(std::move(items), false, "generator"); }

// Runs a filter that Jinja2 writes as a Python generator: its errors surface
// only when the result is consumed (see ListObj::deferred_error).
template <class F>
Value lazily(F f) {
  try {
    return f();
  } catch (const Fail& e) {
    Value g = generator({});
    g.list().deferred_error = std::make_shared<const std::string>(e.what());
    return g;
  }
}

// select / reject / selectattr / rejectattr.
Value select_like(Renderer& r, const Value& seq, CallArgs& a, bool by_attr, bool keep_if) {
  if (!truthy(seq)) return generator({});  // Jinja2: `if value:` before iterating
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) throw Fail("selectattr/rejectattr need an attribute name");
    attr = to_str(a.pos[0]);
    i = 1;
  }
  std::string test;
  CallArgs targs;
  if (i < a.pos.size()) {
    test = to_str(a.pos[i]);
    if (!has_test(test)) throw Fail("no test named '" + test + "'");
    targs.pos.assign(a.pos.begin() + long(i) + 1, a.pos.end());
    targs.kw = a.kw;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(seq)) {
    r.charge(1);
    Value x = by_attr ? lookup_path(item, attr) : item;
    bool ok = test.empty() ? truthy(x) : apply_test(r, test, x, targs);
    if (ok == keep_if) out.push_back(item);
  }
  return generator(std::move(out));
}

Value do_map(Renderer& r, const Value& seq, CallArgs& a) {
  if (!truthy(seq)) return generator({});
  std::vector<Value> out;
  const Value* attribute = arg(a, "attribute", 99);
  if (attribute) {
    const Value* def = arg(a, "default", 99);
    for (const Value& item : iterate(seq)) {
      Value x = lookup_path(item, to_str(*attribute));
      if (x.is_undefined() && def) x = *def;
      out.push_back(std::move(x));
    }
    return generator(std::move(out));
  }
  if (a.pos.empty()) return generator(iterate(seq));
  std::string name = to_str(a.pos[0]);
  if (!has_filter(name)) throw Fail("no filter named '" + name + "'");
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const Value& item : iterate(seq)) {
    r.charge(1);
    CallArgs copy = fargs;
    out.push_back(apply_filter(r, name, item, copy));
  }
  return generator(std::move(out));
}

Value do_sort(const Value& seq, const CallArgs& a) {
  bool reverse = flag(a, "reverse", 0, false), cs = flag(a, "case_sensitive", 1, false);
  const Value* attribute = arg(a, "attribute", 2);
  std::vector<Value> items = iterate(seq);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(sort_key(attr_or_self(v, attribute), cs), v);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::make_list(std::move(out));
}

Value do_minmax(const Value& seq, const CallArgs& a, bool want_max) {
  bool cs = flag(a, "case_sensitive", 0, false);
  const Value* attribute = arg(a, "attribute", 1);
  std::vector<Value> items = iterate(seq);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare(sort_key(attr_or_self(items[i], attribute), cs), sort_key(attr_or_self(items[best], attribute), cs));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value do_indent(Renderer& r, const Value& v, const CallArgs& a) {
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_string()) throw Fail("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  std::string ind;
  const Value* w = arg(a, "width", 0);
  if (w && w->is_string()) {
    ind = w->str();
  } else {
    int64_t n = int_opt(a, "width", 0, 4);
    r.check_string(size_t(std::max<int64_t>(n, 0)));
    ind.assign(size_t(std::max<int64_t>(n, 0)), ' ');
  }
  bool first = flag(a, "first", 1, false), blank = flag(a, "blank", 2, false);
  std::string s = to_str(v) + "\n";
  std::vector<std::string> lines = py_splitlines(s, false);
  r.check_string(s.size() + lines.size() * ind.size());
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += ind;
        rv += lines[i];
      }
    }
  }
  if (first) rv = ind + rv;
  return Value(std::move(rv));
}

Value do_truncate(const Value& v, const CallArgs& a) {
  if (!v.is_string()) {  // Jinja2 compares len(s) first: short sequences come back as they are
    int64_t n = length(v);
    if (n <= int_opt(a, "length", 0, 255) + int_opt(a, "leeway", 3, 5)) return v;
    throw Fail("'" + type_name(v) + "' object has no attribute 'rfind'");
  }
  std::string s = v.str();
  int64_t length = int_opt(a, "length", 0, 255);
  bool killwords = flag(a, "killwords", 1, false);
  const Value* endv = arg(a, "end", 2);
  std::string end = endv ? to_str(*endv) : "...";
  int64_t leeway = int_opt(a, "leeway", 3, 5);
  std::vector<std::string_view> cs = utf8_chars(s);
  int64_t n = int64_t(cs.size()), elen = int64_t(utf8_length(end));
  if (length < elen) throw Fail("expected length >= " + std::to_string(elen) + ", got " + std::to_string(length));
  if (leeway < 0) throw Fail("expected leeway >= 0, got " + std::to_string(leeway));
  if (n <= length + leeway) return Value(s);
  std::string cut;
  for (int64_t i = 0; i < length - elen; ++i) cut += cs[size_t(i)];
  if (killwords) return Value(cut + end);
  size_t sp = cut.rfind(' ');
  if (sp != std::string::npos) cut.resize(sp);
  return Value(cut + end);
}

Value do_round(const Value& v, const CallArgs& a) {
  int64_t prec = int_opt(a, "precision", 0, 0);
  const Value* m = arg(a, "method", 1);
  std::string method = m ? to_str(*m) : "common";
  if ((v.is_int() || v.is_bool()) && prec >= 0) return v.is_bool() ? Value(int64_t(v.as_bool())) : v;
  double x = v.as_number(), p = std::pow(10.0, double(prec));
  if (method == "common") {
    double y = x * p, rn = std::nearbyint(y);  // Python's round(): half to even
    return Value(rn / p);
  }
  if (method == "ceil") return Value(std::ceil(x * p) / p);
  if (method == "floor") return Value(std::floor(x * p) / p);
  throw Fail("method must be common, ceil or floor");
}

Value do_tojson(Renderer& r, const Value& v, const CallArgs& a) {
  JsonDumpOptions o;
  o.max_bytes = r.limits().max_string_bytes;
  o.ensure_ascii = flag(a, "ensure_ascii", 0, false);
  const Value* ind = arg(a, "indent", 1);
  if (ind && !ind->is_none()) {
    if (ind->is_string()) {
      o.indent = ind->str();
    } else {
      int64_t n = int_opt(a, "indent", 1, 0);
      r.check_string(size_t(std::max<int64_t>(n, 0)));
      o.indent = std::string(size_t(std::max<int64_t>(n, 0)), ' ');
    }
    o.item_sep = ",";
  }
  const Value* seps = arg(a, "separators", 2);
  if (seps && !seps->is_none()) {
    std::vector<Value> s = iterate(*seps);
    if (s.size() != 2 || !s[0].is_string() || !s[1].is_string()) throw Fail("tojson: separators must be two strings");
    o.item_sep = s[0].str();
    o.key_sep = s[1].str();
  }
  o.sort_keys = flag(a, "sort_keys", 3, false);
  return Value(to_json_text(v, o));
}

Value do_groupby(const Value& seq, const CallArgs& a) {
  const Value* attribute = arg(a, "attribute", 0);
  if (!attribute) throw Fail("groupby needs an attribute");
  const Value* def = arg(a, "default", 1);
  bool cs = flag(a, "case_sensitive", 2, false);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& v : iterate(seq)) {
    Value k = attr_or_self(v, attribute);
    if (k.is_undefined() && def) k = *def;
    keyed.emplace_back(k, v);
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [&](const auto& x, const auto& y) { return compare(sort_key(x.first, cs), sort_key(y.first, cs)) < 0; });
  std::vector<Value> groups;
  for (size_t i = 0; i < keyed.size();) {
    size_t j = i;
    std::vector<Value> members;
    while (j < keyed.size() && equals(sort_key(keyed[j].first, cs), sort_key(keyed[i].first, cs)))
      members.push_back(keyed[j++].second);
    groups.push_back(Value::make_list({keyed[i].first, Value::make_list(std::move(members))}, true));
    i = j;
  }
  return Value::make_list(std::move(groups));
}

}  // namespace

bool has_filter(std::string_view name) {
  for (const char* const* f = kFilters; *f; ++f)
    if (name == *f) return true;
  return false;
}

Value apply_filter(Renderer& r, std::string_view f, const Value& v, CallArgs& a) {
  if (f == "default" || f == "d") {
    bool boolean = flag(a, "boolean", 1, false);
    if (v.is_undefined() || (boolean && !truthy(v))) {
      const Value* d = arg(a, "default_value", 0);
      return d ? *d : Value("");
    }
    return v;
  }
  if (f == "length" || f == "count") return Value(length(v));
  if (f == "string") return v.is_string() ? v : Value(to_str(v));
  if (f == "safe") return v.is_markup() ? v : Value::markup(to_str(v));
  if (f == "tojson") return do_tojson(r, v, a);
  if (f == "items")
    return lazily([&] {
      if (v.is_undefined()) return generator({});
      if (!v.is_dict() || v.dict().is_namespace) throw Fail("Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, x] : v.dict().items) out.push_back(Value::make_list({k, x}, true));
      return generator(std::move(out));
    });
  if (f == "list") return Value::make_list(iterate(v));
  if (f == "first" || f == "last") {
    if (f == "last" && v.is_list() && v.list().iter_type && std::strncmp(v.list().iter_type, "dict_", 5) != 0)
      throw Fail(std::string("'") + v.list().iter_type + "' object is not reversible");
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(std::string("No ") + std::string(f) + " item, sequence was empty.");
    return f == "first" ? items.front() : items.back();
  }
  if (f == "join") {
    const Value* sepv = arg(a, "d", 0);
    std::string sep = sepv ? to_str(*sepv) : "";
    const Value* attribute = arg(a, "attribute", 1);
    std::string out;
    size_t i = 0;
    for (const Value& x : iterate(v)) {
      if (i++) out += sep;
      append_str(out, attr_or_self(x, attribute));
      r.check_string(out.size());
    }
    return Value(std::move(out));
  }
  if (f == "trim") {
    const Value* chars = arg(a, "chars", 0);
    std::string cs = chars && !chars->is_none() ? to_str(*chars) : "";
    std::string t = py_strip(to_str(v), chars && !chars->is_none() ? &cs : nullptr, true, true);
    return v.is_markup() ? Value::markup(std::move(t)) : Value(std::move(t));
  }
  if (f == "upper") return Value(py_upper(to_str(v)));
  if (f == "lower") return Value(py_lower(to_str(v)));
  if (f == "title") return Value(jinja_title(to_str(v)));
  if (f == "capitalize") return Value(py_capitalize(to_str(v)));
  if (f == "replace") {
    if (a.pos.size() < 2) throw Fail("replace needs the old and the new string");
    return Value(py_replace(r, to_str(v), to_str(a.pos[0]), to_str(a.pos[1]), int_opt(a, "count", 2, -1)));
  }
  if (f == "map") return lazily([&] { return do_map(r, v, a); });
  if (f == "select" || f == "reject") return lazily([&] { return select_like(r, v, a, false, f == "select"); });
  if (f == "selectattr" || f == "rejectattr")
    return lazily([&] { return select_like(r, v, a, true, f == "selectattr"); });
  if (f == "sort") return do_sort(v, a);
  if (f == "dictsort") {
    if (!v.is_dict()) throw Fail("dictsort: expected a mapping");
    bool cs = flag(a, "case_sensitive", 0, false);
    const Value* by = arg(a, "by", 1);
    bool by_value = by && to_str(*by) == "value";
    if (by && !by_value && to_str(*by) != "key") throw Fail("You can only sort by either \"key\" or \"value\"");
    bool reverse = flag(a, "reverse", 2, false);
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.dict().items) pairs.push_back(Value::make_list({k, x}, true));
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
      int c = compare(sort_key(p.list().items[by_value], cs), sort_key(q.list().items[by_value], cs));
      return reverse ? c > 0 : c < 0;
    });
    return Value::make_list(std::move(pairs));
  }
  if (f == "unique") return lazily([&] {
    bool cs = flag(a, "case_sensitive", 0, false);
    const Value* attribute = arg(a, "attribute", 1);
    std::vector<Value> out, seen;
    for (const Value& x : iterate(v)) {
      Value k = sort_key(attr_or_self(x, attribute), cs);
      bool dup = false;
      for (const Value& s : seen)
        if (equals(s, k)) dup = true;
      if (!dup) {
        seen.push_back(k);
        out.push_back(x);
      }
      r.charge(int64_t(seen.size()));
    }
    return generator(std::move(out));
  });
  if (f == "reverse") {
    if (v.is_string()) {
      std::vector<std::string_view> cs = utf8_chars(v.str());
      std::string o;
      for (size_t i = cs.size(); i-- > 0;) o += cs[i];
      return Value(std::move(o));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    // reversed(): an iterator; a generator cannot be reversed, so Jinja2
    // makes a list of it instead.
    bool gen = v.is_list() && v.list().iter_type && std::strncmp(v.list().iter_type, "dict_", 5) != 0;
    return Value::make_list(std::move(items), false, gen ? nullptr : v.is_list() ? "list_reverseiterator" : "reversed");
  }
  if ((f == "int" || f == "float") && v.is_undefined()) v.fail_undefined();
  if (f == "int") {
    const Value* dv = arg(a, "default", 0);
    Value def = dv ? *dv : Value(int64_t(0));
    if (v.is_int()) return v;
    if (v.is_bool()) return Value(int64_t(v.as_bool()));
    if (v.is_float()) return std::isfinite(v.as_float()) ? Value(int64_t(v.as_float())) : def;
    if (v.is_string()) {
      std::string s = py_strip(v.str(), nullptr, true, true);
      int64_t base = int_opt(a, "base", 1, 10);
      if (base < 2 || base > 36) base = 10;
      errno = 0;
      char* end = nullptr;
      long long x = std::strtoll(s.c_str(), &end, int(base));
      if (!s.empty() && end && *end == 0 && errno == 0) return Value(int64_t(x));
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0 && std::isfinite(d) && std::fabs(d) < 9e18) return Value(int64_t(d));
    }
    return def;
  }
  if (f == "float") {
    const Value* dv = arg(a, "default", 0);
    Value def = dv ? *dv : Value(0.0);
    if (v.is_number()) return Value(v.as_number());
    if (v.is_string()) {
      std::string s = py_strip(v.str(), nullptr, true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value(d);
    }
    return def;
  }
  if (f == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) return unary_op(v.is_int() && v.as_int() < 0 ? "-" : "+", v);
    throw Fail("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (f == "round") return do_round(v, a);
  if (f == "sum") {
    const Value* attribute = arg(a, "attribute", 0);
    const Value* start = arg(a, "start", 1);
    Value total = start ? *start : Value(int64_t(0));
    for (const Value& x : iterate(v)) total = binary_op(r, "+", total, attr_or_self(x, attribute));
    return total;
  }
  if (f == "max" || f == "min") return do_minmax(v, a, f == "max");
  if (f == "e" || f == "escape") return v.is_markup() ? v : Value::markup(html_escape(to_str(v)));
  if (f == "forceescape") return Value::markup(html_escape(to_str(v)));
  if (f == "indent") return do_indent(r, v, a);
  if (f == "center") {
    CallArgs ca;
    ca.pos.push_back(Value(int_opt(a, "width", 0, 80)));
    return *call_method(r, Value(to_str(v)), "center", ca);
  }
  if (f == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (unsigned char c : to_str(v)) {
      bool w = std::isalnum(c) || c == '_' || c >= 0x80;
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(n);
  }
  if (f == "truncate") return do_truncate(v, a);
  if (f == "format") {
    if (!a.pos.empty() && !a.kw.empty()) throw Fail("can't handle positional and keyword arguments at the same time");
    if (!a.kw.empty()) {
      Value d = Value::new_dict();
      for (const auto& [k, x] : a.kw) d.dict().items.emplace_back(Value(k), x);
      return Value(py_percent(r, to_str(v), d));
    }
    return Value(py_percent(r, to_str(v), Value::make_list(a.pos, true)));
  }
  if (f == "attr") {
    if (a.pos.empty()) throw Fail("attr needs a name");
    return get_attr(v, to_str(a.pos[0]));
  }
  if (f == "pprint") return Value(repr(v));
  if (f == "striptags") {
    std::string s = to_str(v), o;
    bool in_tag = false;
    for (char c : s) {
      if (c == '<') in_tag = true;
      else if (c == '>' && in_tag) in_tag = false;
      else if (!in_tag) o += c;
    }
    std::vector<std::string> words = py_split(o, nullptr, -1, false);
    std::string j;
    for (size_t i = 0; i < words.size(); ++i) j += (i ? " " : "") + words[i];
    return Value(j);
  }
  if (f == "batch" || f == "slice") return lazily([&] {
    int64_t n = int_opt(a, f == "batch" ? "linecount" : "slices", 0, 1);
    if (n <= 0) throw Fail(std::string(f) + " needs a positive count");
    const Value* fill = arg(a, "fill_with", 1);
    if (fill) r.check_list(size_t(n));
    std::vector<Value> items = iterate(v), out;
    if (f == "batch") {
      for (size_t i = 0; i < items.size(); i += size_t(n)) {
        std::vector<Value> chunk(items.begin() + long(i), items.begin() + long(std::min(items.size(), i + size_t(n))));
        while (fill && int64_t(chunk.size()) < n) chunk.push_back(*fill);
        out.push_back(Value::make_list(std::move(chunk)));
      }
    } else {
      size_t per = items.size() / size_t(n), extra = items.size() % size_t(n), off = 0;
      r.check_list(size_t(n));
      for (size_t s = 0; s < size_t(n); ++s) {
        size_t len = per + (s < extra ? 1 : 0);
        std::vector<Value> chunk(items.begin() + long(off), items.begin() + long(off + len));
        off += len;
        if (fill && s >= extra && extra) chunk.push_back(*fill);
        out.push_back(Value::make_list(std::move(chunk)));
      }
    }
    return generator(std::move(out));
  });
  if (f == "groupby") return do_groupby(v, a);
  throw Fail("unknown filter '" + std::string(f) + "'");
}

}  // namespace ebb::jinja
