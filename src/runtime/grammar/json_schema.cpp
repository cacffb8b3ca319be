#include "runtime/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "platform/error.h"
#include "runtime/grammar/schema_ranges.h"
#include "runtime/grammar/schema_regex.h"

namespace ebb::grammar {
namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("JSON schema at #" + path + ": " + what);
}

struct Prim {
  const char* name;
  const char* body;
  std::vector<const char*> deps;
};

const Prim* find_prim(const std::string& name) {
  static const Prim prims[] = {
      {"ws", R"(( " " | "\n" [ \t]{0,32} )?)", {}},
      {"json-char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) ))", {}},
      {"json-string", R"("\"" json-char* "\"")", {"json-char"}},
      {"json-int", R"("-"? ( "0" | [1-9] [0-9]{0,17} ))", {}},
      {"json-frac", R"("." [0-9]{1,16})", {}},
      {"json-exp", R"([eE] [-+]? [0-9]{1,2})", {}},
      {"json-number", R"(json-int json-frac? json-exp?)", {"json-int", "json-frac", "json-exp"}},
      {"json-nonneg-number", R"(( "0" | [1-9] [0-9]{0,17} ) json-frac? json-exp?)", {"json-frac", "json-exp"}},
      {"json-boolean", R"("true" | "false")", {}},
      {"json-null", R"("null")", {}},
      {"json-value", R"(json-object | json-array | json-string | json-number | json-boolean | json-null)",
       {"json-object", "json-array", "json-string", "json-number", "json-boolean", "json-null"}},
      {"json-object",
       R"("{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}")",
       {"ws", "json-string", "json-value"}},
      {"json-array", R"("[" ws ( json-value ws ( "," ws json-value ws )* )? "]")", {"ws", "json-value"}},
      {"json-date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))", {}},
      {"json-time",
       R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( [Zz] | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
       {}},
      {"json-date-time", R"(json-date [Tt] json-time)", {"json-date", "json-time"}},
      {"json-uuid",
       R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})", {}},
      {"regex-char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) ))", {}},
  };
  for (const Prim& p : prims)
    if (name == p.name) return &p;
  return nullptr;
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    out += ok ? c : '-';
  }
  return out.empty() ? "r" : out;
}

std::string class_char(uint32_t cp) {
  char buf[16];
  if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : 3;
    uint32_t cp = extra ? c & (0x3F >> extra) : c;
    for (int k = 1; k <= extra && i + static_cast<size_t>(k) < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

const char* const kUnsupported[] = {"not", "if", "then", "else", "dependentSchemas", "dependentRequired",
                                    "dependencies", "patternProperties", "propertyNames", "minProperties",
                                    "maxProperties", "uniqueItems", "contains", "minContains", "maxContains",
                                    "multipleOf", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
                                    "$recursiveRef"};
const char* const kValidating[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                   "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength",
                                   "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                   "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref"};

void check_siblings(const ojson& s, const std::string& keyword, const std::string& path) {
  for (const char* k : kValidating)
    if (k != keyword && s.contains(k))
      fail(path, "'" + keyword + "' together with '" + k + "' is not supported");
}

}  // namespace

std::string JsonSchemaConverter::fresh_name(const std::string& base) {
  std::string name = sanitize(base);
  for (int i = 1; names_.count(name) || find_prim(name); ++i) name = sanitize(base) + "-" + std::to_string(i);
  names_.insert(name);
  return name;
}

void JsonSchemaConverter::add_rule(const std::string& name, const std::string& body) {
  names_.insert(name);
  rules_.push_back({name, body});
}

std::string JsonSchemaConverter::primitive(const std::string& name) {
  const Prim* p = find_prim(name);
  EBB_CHECK_MSG(p != nullptr, "unknown JSON grammar primitive");
  if (names_.count(name)) return name;
  add_rule(name, p->body);
  for (const char* d : p->deps) primitive(d);
  return name;
}

std::string JsonSchemaConverter::gbnf() const {
  std::string out;
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  return out;
}

std::string JsonSchemaConverter::add_schema(const ojson& schema, const std::string& name) {
  doc_ = &schema;
  doc_name_ = name;
  const std::string expr = visit(schema, name, "");
  doc_ = nullptr;
  if (expr == sanitize(name)) return expr;
  const std::string rule = fresh_name(name);
  add_rule(rule, expr);
  return rule;
}

std::string JsonSchemaConverter::visit_ref(const std::string& ref, const std::string& path) {
  const std::string key = doc_name_ + "\n" + ref;
  if (auto it = refs_.find(key); it != refs_.end()) return it->second;
  if (ref.empty() || ref[0] != '#') fail(path, "the $ref \"" + ref + "\" is not local (only #/$defs/..., #/definitions/..., #)");
  const ojson* target = nullptr;
  try {
    const auto ptr = ojson::json_pointer(ref.substr(1));
    if (doc_->contains(ptr)) target = &doc_->at(ptr);
  } catch (const nlohmann::json::exception&) {
  }
  if (!target) fail(path, "the $ref \"" + ref + "\" points to nothing");
  const size_t slash = ref.rfind('/');
  const std::string rule = fresh_name("ref-" + (slash == std::string::npos ? std::string("root") : ref.substr(slash + 1)));
  refs_[key] = rule;  // before visiting, so a recursive $ref finds it
  const std::string expr = visit(*target, rule + "-body", ref.substr(1));
  add_rule(rule, expr);
  return rule;
}

std::string JsonSchemaConverter::visit(const ojson& s, const std::string& name, const std::string& path) {
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } depth{depth_};
  if (++depth_ > kMaxDepth) fail(path, "schemas nested more than " + std::to_string(kMaxDepth) + " deep");
  if (s.is_boolean()) {
    if (s.get<bool>()) return primitive("json-value");
    fail(path, "the schema false accepts nothing");
  }
  if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
  for (const char* k : kUnsupported) {
    if (!s.contains(k)) continue;
    const ojson& v = s[k];
    if ((v.is_boolean() && !v.get<bool>() && std::string(k) == "uniqueItems") ||
        (v.is_number() && v.get<double>() == 0 && std::string(k) == "minProperties"))
      continue;
    fail(path, "the keyword '" + std::string(k) + "' is not supported");
  }
  if (s.contains("$ref")) {
    check_siblings(s, "$ref", path);
    if (!s["$ref"].is_string()) fail(path + "/$ref", "must be a string");
    return visit_ref(s["$ref"].get<std::string>(), path);
  }
  // A type beside const or enum keeps only the values of that type.
  auto type_allows = [&](const ojson& v) {
    if (!s.contains("type")) return true;
    auto one = [&](const ojson& t) {
      const std::string n = t.is_string() ? t.get<std::string>() : "";
      return (n == "object" && v.is_object()) || (n == "array" && v.is_array()) || (n == "string" && v.is_string()) ||
             (n == "number" && v.is_number()) || (n == "integer" && v.is_number_integer()) ||
             (n == "boolean" && v.is_boolean()) || (n == "null" && v.is_null());
    };
    const ojson& t = s["type"];
    return t.is_array() ? std::any_of(t.begin(), t.end(), one) : one(t);
  };
  if (s.contains("const")) {
    if (!type_allows(s["const"])) fail(path, "'const' is not of the schema's 'type': nothing is valid");
    return gbnf_literal(s["const"].dump());
  }
  if (s.contains("enum")) {
    const ojson& e = s["enum"];
    if (!e.is_array() || e.empty()) fail(path + "/enum", "must be a non-empty array");
    std::string out;
    for (const ojson& v : e)
      if (type_allows(v)) out += (out.empty() ? "(" : " | ") + gbnf_literal(v.dump());
    if (out.empty()) fail(path, "no value of 'enum' is of the schema's 'type': nothing is valid");
    return out + ")";
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw)) continue;
    check_siblings(s, kw, path);
    const ojson& alts = s[kw];
    if (!alts.is_array() || alts.empty()) fail(path + "/" + kw, "must be a non-empty array");
    std::string body;
    for (size_t i = 0; i < alts.size(); ++i)
      body += (i ? " | " : "") + visit(alts[i], name + "-" + std::to_string(i), path + "/" + kw + "/" + std::to_string(i));
    const std::string rule = fresh_name(name);
    add_rule(rule, body);
    return rule;
  }
  if (s.contains("allOf")) {
    const ojson& parts = s["allOf"];
    if (!parts.is_array() || parts.empty()) fail(path + "/allOf", "must be a non-empty array");
    // Merge object schemas (resolving $refs) with the keywords beside allOf.
    ojson merged = s;
    merged.erase("allOf");
    ojson props = merged.value("properties", ojson::object());
    ojson required = merged.value("required", ojson::array());
    for (size_t i = 0; i < parts.size(); ++i) {
      const ojson* part = &parts[i];
      const std::string ppath = path + "/allOf/" + std::to_string(i);
      for (int hops = 0; part->is_object() && part->contains("$ref") && hops < 32; ++hops) {
        const std::string ref = (*part)["$ref"].get<std::string>();
        const auto ptr = ojson::json_pointer(ref.size() > 1 ? ref.substr(1) : "");
        if (ref.empty() || ref[0] != '#' || !doc_->contains(ptr)) fail(ppath, "the $ref \"" + ref + "\" cannot be merged");
        part = &doc_->at(ptr);
      }
      if (!part->is_object()) fail(ppath, "allOf is supported only for object schemas");
      for (const auto& [k, v] : part->items()) {
        if (k == "properties") {
          for (const auto& [pk, pv] : v.items()) {
            if (props.contains(pk) && props[pk] != pv) fail(ppath, "allOf declares property '" + pk + "' twice, differently");
            props[pk] = pv;
          }
        } else if (k == "required") {
          for (const auto& r : v) required.push_back(r);
        } else if (k == "type") {
          if (v != "object") fail(ppath, "allOf is supported only for object schemas");
        } else if (k == "additionalProperties") {
          if (merged.contains(k) && merged[k] != v) fail(ppath, "allOf with differing additionalProperties");
          merged[k] = v;
        } else if (std::find(std::begin(kValidating), std::end(kValidating), k) != std::end(kValidating) ||
                   std::find(std::begin(kUnsupported), std::end(kUnsupported), k) != std::end(kUnsupported)) {
          fail(ppath, "allOf with the keyword '" + k + "' is not supported (only properties, required, additionalProperties)");
        }
      }
    }
    merged["type"] = "object";
    merged["properties"] = props;
    merged["required"] = required;
    return visit_object(merged, name, path);
  }

  if (s.contains("type") && s["type"].is_array()) {
    const ojson& types = s["type"];
    if (types.empty()) fail(path + "/type", "an empty type list accepts nothing");
    std::string body;
    for (size_t i = 0; i < types.size(); ++i) {
      ojson one = s;
      one["type"] = types[i];
      body += (i ? " | " : "") + visit(one, name + "-" + (types[i].is_string() ? types[i].get<std::string>() : "t"), path);
    }
    const std::string rule = fresh_name(name);
    add_rule(rule, body);
    return rule;
  }
  std::string type;
  if (s.contains("type")) {
    if (!s["type"].is_string()) fail(path + "/type", "must be a string or an array of strings");
    type = s["type"].get<std::string>();
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
    type = "object";
  } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
    type = "array";
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
    type = "string";
  } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
             s.contains("exclusiveMaximum")) {
    type = "number";
  } else {
    return primitive("json-value");
  }
  if (type == "object") return visit_object(s, name, path);
  if (type == "array") return visit_array(s, name, path);
  if (type == "string") return visit_string(s, name, path);
  if (type == "number") return visit_number(s, false, path);
  if (type == "integer") return visit_number(s, true, path);
  if (type == "boolean") return primitive("json-boolean");
  if (type == "null") return primitive("json-null");
  fail(path + "/type", "unknown type \"" + type + "\"");
}

std::string JsonSchemaConverter::excluded_key(const std::vector<std::string>& names, const std::string& base) {
  // A trie over the names' JSON text (code points); each node is a rule
  // that either leaves the trie (then anything may follow) or follows it.
  struct TNode {
    std::map<uint32_t, size_t> kids;
    bool terminal = false;
  };
  std::vector<TNode> trie(1);
  for (const std::string& n : names) {
    const std::string text = ojson(n).dump();
    size_t at = 0;
    for (const uint32_t cp : code_points(text.substr(1, text.size() - 2))) {
      auto it = trie[at].kids.find(cp);
      if (it == trie[at].kids.end()) {
        trie.push_back({});
        it = trie[at].kids.emplace(cp, trie.size() - 1).first;
      }
      at = it->second;
    }
    trie[at].terminal = true;
  }
  const std::string chr = primitive("json-char");
  std::vector<std::string> rule(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rule[i] = fresh_name(base + "-k" + std::to_string(i));
  for (size_t i = 0; i < trie.size(); ++i) {
    std::vector<std::string> alts;
    if (!trie[i].terminal) alts.push_back("\"\\\"\"");
    std::string other = "[^\"\\\\\\x00-\\x1F";
    for (const auto& [cp, kid] : trie[i].kids) {
      std::string alt = "[";  // (built in steps: GCC 12 warns falsely on "[" + string)
      alt += class_char(cp);
      alt += "] ";
      alt += rule[kid];
      alts.push_back(std::move(alt));
      other += class_char(cp);
    }
    alts.push_back(other + "] " + chr + "* \"\\\"\"");
    std::string body;
    for (size_t k = 0; k < alts.size(); ++k) body += (k ? " | " : "") + alts[k];
    add_rule(rule[i], body);
  }
  return "\"\\\"\" " + rule[0];
}

std::string JsonSchemaConverter::visit_object(const ojson& s, const std::string& name, const std::string& path) {
  const std::string ws = primitive("ws");
  struct Item {
    std::string kv;
    bool required;
  };
  std::vector<Item> items;
  std::vector<std::string> declared;
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) fail(path + "/required", "must be an array of strings");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) fail(path + "/required", "must be an array of strings");
      required.insert(r.get<std::string>());
    }
  }
  const bool has_props = s.contains("properties");
  if (has_props) {
    if (!s["properties"].is_object()) fail(path + "/properties", "must be an object");
    for (const auto& [k, v] : s["properties"].items()) {
      const std::string value = visit(v, name + "-" + k, path + "/properties/" + k);
      items.push_back({gbnf_literal(ojson(k).dump()) + " " + ws + " \":\" " + ws + " " + value + " " + ws,
                       required.count(k) > 0});
      declared.push_back(k);
    }
  }
  std::string add_value;  // empty: no extra keys
  if (s.contains("additionalProperties")) {
    const ojson& ap = s["additionalProperties"];
    if (!(ap.is_boolean() && !ap.get<bool>())) add_value = visit(ap, name + "-additional", path + "/additionalProperties");
  } else if (!has_props) {
    add_value = primitive("json-value");
  }
  for (const std::string& r : required) {
    if (std::find(declared.begin(), declared.end(), r) != declared.end()) continue;
    if (add_value.empty()) fail(path + "/required", "'" + r + "' is required but no such property is allowed");
    items.push_back({gbnf_literal(ojson(r).dump()) + " " + ws + " \":\" " + ws + " " + add_value + " " + ws, true});
    declared.push_back(r);
  }
  const std::string rule = fresh_name(name);
  std::string kv_add;
  if (!add_value.empty()) {
    const std::string key = declared.empty() ? primitive("json-string") : excluded_key(declared, rule + "-key");
    kv_add = key + " " + ws + " \":\" " + ws + " " + add_value + " " + ws;
  }
  // after_i: the rest from item i when something came before (each item
  // starts with a comma); first_i: the rest when nothing did.
  const size_t n = items.size();
  std::vector<std::string> after(n + 1), first(n + 1);
  after[n] = fresh_name(rule + "-after");
  add_rule(after[n], kv_add.empty() ? "\"\"" : "( \",\" " + ws + " " + kv_add + " )*");
  first[n] = fresh_name(rule + "-first");
  add_rule(first[n], kv_add.empty() ? "\"\"" : "( " + kv_add + " ( \",\" " + ws + " " + kv_add + " )* )?");
  for (size_t i = n; i-- > 0;) {
    const std::string piece = "\",\" " + ws + " " + items[i].kv;
    after[i] = fresh_name(rule + "-after");
    add_rule(after[i], (items[i].required ? piece : "( " + piece + " )?") + " " + after[i + 1]);
    first[i] = fresh_name(rule + "-first");
    add_rule(first[i], items[i].kv + " " + after[i + 1] + (items[i].required ? "" : " | " + first[i + 1]));
  }
  add_rule(rule, "\"{\" " + ws + " " + first[0] + " \"}\"");
  return rule;
}

std::string JsonSchemaConverter::visit_array(const ojson& s, const std::string& name, const std::string& path) {
  const std::string ws = primitive("ws");
  auto count = [&](const char* k, int64_t def) -> int64_t {
    if (!s.contains(k)) return def;
    if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0) fail(path + "/" + k, "must be a non-negative integer");
    if (s[k].get<int64_t>() > 10000) fail(path + "/" + k, "over the limit of 10000");
    return s[k].get<int64_t>();
  };
  const int64_t min = count("minItems", 0), max = count("maxItems", -1);
  if (max >= 0 && max < min) fail(path, "maxItems < minItems: no array is valid");
  std::vector<std::string> prefix;
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) fail(path + "/prefixItems", "must be an array");
    for (size_t i = 0; i < s["prefixItems"].size(); ++i)
      prefix.push_back(visit(s["prefixItems"][i], name + "-" + std::to_string(i), path + "/prefixItems/" + std::to_string(i)));
  }
  std::string item;  // empty: no (further) items
  if (s.contains("items")) {
    const ojson& it = s["items"];
    if (it.is_array()) fail(path + "/items", "an array of schemas (draft 4 tuples) is not supported; use prefixItems");
    if (!(it.is_boolean() && !it.get<bool>())) item = visit(it, name + "-item", path + "/items");
  } else if (prefix.empty()) {
    item = primitive("json-value");
  }
  const auto k = static_cast<int64_t>(prefix.size());
  if (max >= 0 && max < k) fail(path, "maxItems is below the number of prefixItems");
  if (item.empty() && min > k) fail(path, "minItems needs more items than the schema allows");
  std::string body = "\"[\" " + ws;
  for (int64_t i = 0; i < k; ++i) body += (i ? " \",\" " + ws + " " : " ") + prefix[static_cast<size_t>(i)] + " " + ws;
  if (!item.empty() && max != k) {
    const int64_t lo = std::max<int64_t>(0, min - k);
    const int64_t hi = max < 0 ? -1 : max - k;
    const std::string hi_s = hi < 0 ? "" : std::to_string(hi);
    if (k > 0) {
      body += " ( \",\" " + ws + " " + item + " " + ws + " ){" + std::to_string(lo) + "," + hi_s + "}";
    } else {
      const std::string more = "( \",\" " + ws + " " + item + " " + ws + " ){" + std::to_string(lo > 0 ? lo - 1 : 0) +
                               "," + (hi < 0 ? "" : std::to_string(hi - 1)) + "}";
      const std::string list = item + " " + ws + " " + more;
      body += lo > 0 ? " " + list : " ( " + list + " )?";
    }
  }
  body += " \"]\"";
  const std::string rule = fresh_name(name);
  add_rule(rule, body);
  return rule;
}

std::string JsonSchemaConverter::visit_string(const ojson& s, const std::string& name, const std::string& path) {
  const std::string q = "\"\\\"\"";
  const bool lengths = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("pattern")) {
    if (lengths) fail(path, "'pattern' together with 'minLength'/'maxLength' is not supported");
    if (!s["pattern"].is_string()) fail(path + "/pattern", "must be a string");
    const std::string expr = regex_to_gbnf(s["pattern"].get<std::string>(), primitive("regex-char"));
    const std::string rule = fresh_name(name);
    add_rule(rule, q + " " + expr + " " + q);
    return rule;
  }
  if (s.contains("format") && s["format"].is_string()) {
    const std::string f = s["format"].get<std::string>();
    if (f == "date" || f == "time" || f == "date-time" || f == "uuid") {
      if (lengths) fail(path, "'format' together with 'minLength'/'maxLength' is not supported");
      return q + " " + primitive("json-" + f) + " " + q;
    }
  }
  if (!lengths) return primitive("json-string");
  auto count = [&](const char* k, int64_t def) -> int64_t {
    if (!s.contains(k)) return def;
    if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0) fail(path + "/" + k, "must be a non-negative integer");
    if (s[k].get<int64_t>() > 10000) fail(path + "/" + k, "over the limit of 10000");
    return s[k].get<int64_t>();
  };
  const int64_t lo = count("minLength", 0), hi = count("maxLength", -1);
  if (hi >= 0 && hi < lo) fail(path, "maxLength < minLength: no string is valid");
  return q + " " + primitive("json-char") + "{" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "} " + q;
}

std::string JsonSchemaConverter::visit_number(const ojson& s, bool integer, const std::string& path) {
  auto bound = [&](const char* k) -> std::optional<double> {
    if (!s.contains(k) || s[k].is_boolean()) return std::nullopt;
    if (!s[k].is_number()) fail(path + "/" + k, "must be a number");
    return s[k].get<double>();
  };
  auto flag = [&](const char* k) { return s.contains(k) && s[k].is_boolean() && s[k].get<bool>(); };
  std::optional<double> mn = bound("minimum"), mx = bound("maximum"), xmn = bound("exclusiveMinimum"),
                        xmx = bound("exclusiveMaximum");
  if (flag("exclusiveMinimum") && mn) xmn = mn, mn.reset();  // draft 4 booleans
  if (flag("exclusiveMaximum") && mx) xmx = mx, mx.reset();
  if (!integer) {
    if (!mn && !mx && !xmn && !xmx) return primitive("json-number");
    if (mn && *mn == 0 && !mx && !xmn && !xmx) return primitive("json-nonneg-number");
    fail(path, "bounds on a number are supported only for integers (and minimum 0)");
  }
  if (!mn && !mx && !xmn && !xmx) return primitive("json-int");
  constexpr double kLimit = 1e18;
  std::optional<int64_t> lo, hi;
  auto set_lo = [&](double v) {
    if (std::fabs(v) > kLimit) fail(path, "an integer bound beyond 10^18");
    const auto x = static_cast<int64_t>(v);
    if (!lo || x > *lo) lo = x;
  };
  auto set_hi = [&](double v) {
    if (std::fabs(v) > kLimit) fail(path, "an integer bound beyond 10^18");
    const auto x = static_cast<int64_t>(v);
    if (!hi || x < *hi) hi = x;
  };
  if (mn) set_lo(std::ceil(*mn));
  if (xmn) set_lo(std::floor(*xmn) + 1);
  if (mx) set_hi(std::floor(*mx));
  if (xmx) set_hi(std::ceil(*xmx) - 1);
  if (lo && hi && *lo > *hi)
    fail(path, "the integer range [" + std::to_string(*lo) + ", " + std::to_string(*hi) + "] is empty");
  return integer_range_gbnf(lo, hi);
}

std::string json_schema_to_gbnf(const ojson& schema) {
  JsonSchemaConverter c;
  const std::string rule = c.add_schema(schema, "root");
  std::string text = c.gbnf();
  if (rule != "root") text = "root ::= " + rule + "\n" + text;
  return text;
}

std::string json_schema_to_gbnf(const nlohmann::json& schema) { return json_schema_to_gbnf(ojson::parse(schema.dump())); }

std::string json_schema_to_gbnf(std::string_view schema_json) {
  ojson schema;
  try {
    schema = ojson::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("JSON schema: not valid JSON: ") + e.what());
  }
  return json_schema_to_gbnf(schema);
}

std::string json_object_gbnf() {
  JsonSchemaConverter c;
  c.add_rule("root", c.primitive("json-object"));
  return c.gbnf();
}

}  // namespace ebb::grammar
