// JSON Schema -> GBNF text (then Grammar::parse), for structured output
// (response_format json_schema / json_object) and tool-call arguments.
//
// Supported:
//  - true / {} (any JSON value); type (object, array, string, number,
//    integer, boolean, null, and arrays of types); enum; const;
//  - object: properties in declaration order, `required` ones mandatory,
//    the others optional; additionalProperties false / true / a schema
//    (extra keys come after the declared ones and may not repeat a declared
//    name). additionalProperties absent: no extra keys when `properties` is
//    given (stricter than the schema, never producing invalid output), any
//    keys when it is not;
//  - array: items, prefixItems (all present, in order), minItems, maxItems;
//  - anyOf / oneOf (as alternatives: oneOf's exclusivity is not enforced),
//    allOf of object schemas (merged), $ref to #/$defs/..., #/definitions/...
//    or # (recursion allowed);
//  - integer minimum / maximum / exclusiveMinimum / exclusiveMaximum (exact
//    digit-range grammars within +-10^18); number minimum 0;
//  - string minLength / maxLength, pattern (schema_regex.h), format date,
//    time, date-time, uuid. Other formats are annotations in JSON Schema
//    2020-12 (they do not change validity) and are not constrained.
// Keywords that change validity and are not supported (not, if/then/else,
// uniqueItems, contains, multipleOf, patternProperties, propertyNames,
// min/maxProperties, dependent*, unevaluated*, bounds on non-integer numbers
// other than minimum 0, ...) throw ebb::Error naming the keyword and where
// it is (a JSON pointer). Unknown keywords are annotations and are ignored.
//
// Whitespace between tokens is optional and bounded: at most one space, or
// one newline and up to 32 spaces or tabs of indentation, so a model cannot
// loop on whitespace. Numbers are bounded too (at most 18 integer digits,
// 16 fraction digits, a 2-digit exponent, so every number fits a double), and
// \u escapes never name UTF-16 surrogates (a lone one is not valid JSON
// text). No whitespace before or after the top-level value.
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ebb::grammar {

// Builds one GBNF grammar from any number of schemas (tool_grammar.h adds one
// per tool) plus hand-written rules.
class JsonSchemaConverter {
 public:
  // Compiles `schema` into rules named from `name`; $refs resolve against
  // `schema` itself. Returns the name of the rule matching the schema.
  std::string add_schema(const nlohmann::ordered_json& schema, const std::string& name);
  // Adds "name ::= body" verbatim (body in GBNF).
  void add_rule(const std::string& name, const std::string& body);
  // A rule of the JSON building blocks ("json-value", "json-object",
  // "json-string", "ws", ...), added on first use; returns its name.
  std::string primitive(const std::string& name);
  // Every rule so far, one per line.
  std::string gbnf() const;

 private:
  std::string visit(const nlohmann::ordered_json& s, const std::string& name, const std::string& path);
  std::string visit_object(const nlohmann::ordered_json& s, const std::string& name, const std::string& path);
  std::string visit_array(const nlohmann::ordered_json& s, const std::string& name, const std::string& path);
  std::string visit_string(const nlohmann::ordered_json& s, const std::string& name, const std::string& path);
  std::string visit_number(const nlohmann::ordered_json& s, bool integer, const std::string& path);
  std::string visit_ref(const std::string& ref, const std::string& path);
  std::string excluded_key(const std::vector<std::string>& names, const std::string& name);
  std::string fresh_name(const std::string& base);

  std::vector<std::pair<std::string, std::string>> rules_;  // in order
  std::set<std::string> names_;
  const nlohmann::ordered_json* doc_ = nullptr;    // the schema being added, for $ref
  std::string doc_name_;
  std::map<std::string, std::string> refs_;  // doc_name + pointer -> rule
  static constexpr int kMaxDepth = 200;       // nested schemas (visit recurses)
  int depth_ = 0;
};

// root ::= the schema. Throws ebb::Error (see above). Properties come in the
// object's key order: declaration order for ordered_json and for JSON text,
// alphabetical for nlohmann::json (which sorts its keys).
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
std::string json_schema_to_gbnf(const nlohmann::json& schema);
// The same from JSON text (ebb::Error when it is not JSON).
std::string json_schema_to_gbnf(std::string_view schema_json);
// response_format json_object: any JSON object.
std::string json_object_gbnf();

}  // namespace ebb::grammar
