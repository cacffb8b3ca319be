// Chat output formats, and reading one call's text into a name and compact
// arguments. The incremental parser is in chat_stream.cpp.
#include "model/chat_parse.h"

#include <nlohmann/json.hpp>

#include "model/chat_parse_internal.h"

namespace ebb {

using nlohmann::ordered_json;

std::string_view tool_call_syntax_name(ToolCallSyntax s) {
  switch (s) {
    case ToolCallSyntax::kHermes: return "hermes";
    case ToolCallSyntax::kLlama3: return "llama3";
    case ToolCallSyntax::kMistral: return "mistral";
    case ToolCallSyntax::kGeneric: return "generic";
  }
  return "generic";
}

ChatOutputFormat chat_output_format(ToolCallSyntax s, bool thinking) {
  ChatOutputFormat f;
  f.syntax = s;
  f.thinking = thinking;
  switch (s) {
    case ToolCallSyntax::kHermes:
      f.triggers = {"<tool_call>"};
      f.call_prefix = "<tool_call>\n";
      f.call_suffix = "\n</tool_call>";
      f.preserved_tokens = {"<tool_call>", "</tool_call>"};
      break;
    case ToolCallSyntax::kLlama3:
      f.triggers = {"<|python_tag|>"};
      f.start_triggers = {"{"};
      f.arguments_key = "parameters";
      f.stop_strings = {"<|eom_id|>"};
      f.preserved_tokens = {"<|python_tag|>", "<|eom_id|>"};
      break;
    case ToolCallSyntax::kMistral:
      f.triggers = {"[TOOL_CALLS]"};
      f.call_prefix = "[TOOL_CALLS][";
      f.call_suffix = "]";
      f.preserved_tokens = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
      break;
    case ToolCallSyntax::kGeneric:
      f.start_triggers = {"{"};
      break;
  }
  if (thinking) {
    f.preserved_tokens.push_back(f.think_start);
    f.preserved_tokens.push_back(f.think_end);
  }
  return f;
}

ChatOutputFormat detect_chat_output_format(std::string_view tmpl, std::string_view arch) {
  const auto has = [&](std::string_view m) { return tmpl.find(m) != std::string_view::npos; };
  const bool qwen = arch.substr(0, 5) == "qwen2" || arch.substr(0, 5) == "qwen3";
  if (tmpl.empty()) return chat_output_format(qwen ? ToolCallSyntax::kHermes : ToolCallSyntax::kGeneric,
                                              arch.substr(0, 5) == "qwen3");
  const bool thinking = has("<think>");
  if (has("<tool_call>")) return chat_output_format(ToolCallSyntax::kHermes, thinking);
  if (has("[TOOL_CALLS]")) return chat_output_format(ToolCallSyntax::kMistral, thinking);
  if (has("<|python_tag|>") || has("<|start_header_id|>")) return chat_output_format(ToolCallSyntax::kLlama3, thinking);
  return chat_output_format(ToolCallSyntax::kGeneric, thinking);
}

bool prompt_opens_think(std::string_view prompt, const ChatOutputFormat& f) {
  size_t n = prompt.size();
  while (n > 0 && chat_detail::is_space(prompt[n - 1])) --n;
  const std::string_view t = f.think_start;
  return !t.empty() && n >= t.size() && prompt.substr(n - t.size(), t.size()) == t;
}

std::string make_call_id(std::mt19937_64& rng) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<int> pick(0, 61);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[pick(rng)];
  return id;
}

void apply_deltas(ParsedOutput& out, const std::vector<ChatDelta>& deltas) {
  for (const ChatDelta& d : deltas) {
    switch (d.kind) {
      case ChatDelta::Kind::kContent: out.content += d.text; break;
      case ChatDelta::Kind::kReasoning: out.reasoning_content += d.text; break;
      case ChatDelta::Kind::kToolCall:
        if (out.tool_calls.size() <= static_cast<size_t>(d.index)) out.tool_calls.resize(d.index + 1);
        out.tool_calls[d.index].id = d.id;
        out.tool_calls[d.index].name = d.name;
        break;
      case ChatDelta::Kind::kToolArguments:
        if (out.tool_calls.size() <= static_cast<size_t>(d.index)) out.tool_calls.resize(d.index + 1);
        out.tool_calls[d.index].arguments += d.text;
        break;
    }
  }
}

ParsedOutput parse_chat_output(const ChatOutputFormat& f, std::string_view text, bool tools_present,
                               const CallIdFn& next_id) {
  ChatStreamParser p(f, tools_present, next_id);
  ParsedOutput out;
  apply_deltas(out, p.feed(text));
  apply_deltas(out, p.finish());
  return out;
}

namespace chat_detail {

namespace {

constexpr size_t kMaxDepth = 256;

std::string compact(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

std::optional<NamedCall> call_from_json(const ordered_json& j, bool args_optional) {
  if (!j.is_object()) return std::nullopt;
  const ordered_json* o = &j;
  if (j.contains("function") && j["function"].is_object()) {  // OpenAI's own shape
    if (j.contains("type") && j["type"] != "function") return std::nullopt;
    o = &j["function"];
  }
  const auto name = o->find("name");
  if (name == o->end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = o->find("arguments");
  if (args == o->end()) args = o->find("parameters");
  NamedCall c;
  c.name = name->get<std::string>();
  if (args == o->end() || args->is_null()) {
    if (!args_optional) return std::nullopt;
    c.arguments = "{}";
    return c;
  }
  if (args->is_string()) {  // arguments written as a JSON string, as OpenAI sends them
    const ordered_json inner = ordered_json::parse(args->get<std::string>(), nullptr, false);
    if (inner.is_discarded() || !inner.is_object()) return std::nullopt;
    c.arguments = compact(inner);
    return c;
  }
  if (!args->is_object()) return std::nullopt;
  c.arguments = compact(*args);
  return c;
}

}  // namespace

JsonScan scan_json(std::string_view s, size_t pos) {
  JsonScan r;
  std::string stack;
  bool in_string = false, escape = false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      if (stack.empty()) return {JsonScan::Status::kInvalid, i};
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (stack.size() >= kMaxDepth) return {JsonScan::Status::kInvalid, i};
      stack += c == '{' ? '}' : ']';
    } else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != c) return {JsonScan::Status::kInvalid, i};
      stack.pop_back();
      if (stack.empty()) return {JsonScan::Status::kComplete, i + 1};
    } else if (stack.empty()) {
      return {JsonScan::Status::kInvalid, i};  // the value must start with a bracket
    }
  }
  r.end = s.size();
  return r;
}

std::optional<NamedCall> call_from_json_text(std::string_view text, bool args_optional) {
  const ordered_json j = ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return call_from_json(j, args_optional);
}

std::optional<std::vector<NamedCall>> calls_from_json_value(std::string_view text, ToolCallSyntax syntax,
                                                            bool args_optional, std::string* content) {
  const ordered_json j = ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  std::vector<NamedCall> calls;
  const auto add_all = [&](const ordered_json& arr) {
    if (!arr.is_array() || arr.empty()) return false;
    for (const ordered_json& x : arr) {
      std::optional<NamedCall> c = call_from_json(x, args_optional);
      if (!c) return false;
      calls.push_back(std::move(*c));
    }
    return true;
  };
  if (j.is_array()) {
    if (!add_all(j)) return std::nullopt;
    return calls;
  }
  if (!j.is_object()) return std::nullopt;
  if (syntax == ToolCallSyntax::kGeneric) {
    // {"tool_calls": [...], "content": "..."}, {"tool_call": {...}}, {"response": "..."}
    std::string text_part;
    for (const char* key : {"content", "response"}) {
      if (j.contains(key) && j[key].is_string()) text_part = j[key].get<std::string>();
    }
    bool ok = false;
    if (j.contains("tool_calls")) ok = add_all(j["tool_calls"]);
    else if (j.contains("tool_call") && j["tool_call"].is_object()) ok = add_all(ordered_json::array({j["tool_call"]}));
    else if (j.size() == 1 && j.contains("response") && j["response"].is_string()) ok = true;
    if (ok) {
      if (content) *content = text_part;
      return calls;
    }
  }
  std::optional<NamedCall> c = call_from_json(j, args_optional);
  if (!c) return std::nullopt;
  calls.push_back(std::move(*c));
  return calls;
}

namespace {

bool ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9'); }

struct Cursor {
  std::string_view s;
  size_t i = 0;
  void skip() {
    while (i < s.size() && is_space(s[i])) ++i;
  }
  bool eat(char c) {
    skip();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  std::string ident() {
    skip();
    const size_t b = i;
    if (i < s.size() && ident_start(s[i]))
      while (i < s.size() && ident_char(s[i])) ++i;
    return std::string(s.substr(b, i - b));
  }
};

// A Python literal: a quoted string (with the common escapes), a number,
// True / False / None.
std::optional<ordered_json> py_value(Cursor& k) {
  k.skip();
  if (k.i >= k.s.size()) return std::nullopt;
  const char q = k.s[k.i];
  if (q == '"' || q == '\'') {
    std::string out;
    for (++k.i; k.i < k.s.size(); ++k.i) {
      char c = k.s[k.i];
      if (c == q) {
        ++k.i;
        return ordered_json(out);
      }
      if (c == '\\' && k.i + 1 < k.s.size()) {
        c = k.s[++k.i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += c;
      }
    }
    return std::nullopt;
  }
  const size_t b = k.i;
  while (k.i < k.s.size() && k.s[k.i] != ',' && k.s[k.i] != ')' && !is_space(k.s[k.i])) ++k.i;
  const std::string word(k.s.substr(b, k.i - b));
  if (word == "True" || word == "true") return ordered_json(true);
  if (word == "False" || word == "false") return ordered_json(false);
  if (word == "None" || word == "null") return ordered_json(nullptr);
  ordered_json n = ordered_json::parse(word, nullptr, false);
  if (n.is_discarded() || !n.is_number()) return std::nullopt;
  return n;
}

}  // namespace

std::optional<NamedCall> builtin_call(std::string_view text) {
  Cursor k{text};
  NamedCall c;
  c.name = k.ident();
  if (c.name.empty() || !k.eat('.') || k.ident() != "call" || !k.eat('(')) return std::nullopt;
  ordered_json args = ordered_json::object();
  if (!k.eat(')')) {
    for (;;) {
      const std::string key = k.ident();
      if (key.empty() || !k.eat('=')) return std::nullopt;
      std::optional<ordered_json> v = py_value(k);
      if (!v) return std::nullopt;
      args[key] = std::move(*v);
      if (k.eat(')')) break;
      if (!k.eat(',')) return std::nullopt;
    }
  }
  k.skip();
  if (k.i != text.size()) return std::nullopt;
  c.arguments = compact(args);
  return c;
}

std::optional<std::vector<NamedCall>> python_tag_calls(std::string_view body) {
  size_t i = 0;
  while (i < body.size() && is_space(body[i])) ++i;
  if (i < body.size() && body[i] == '{') {
    std::vector<NamedCall> calls;
    while (i < body.size()) {
      const JsonScan sc = scan_json(body, i);
      if (sc.status != JsonScan::Status::kComplete) return std::nullopt;
      std::optional<NamedCall> c = call_from_json_text(body.substr(i, sc.end - i), true);
      if (!c) return std::nullopt;
      calls.push_back(std::move(*c));
      i = sc.end;
      while (i < body.size() && (is_space(body[i]) || body[i] == ';')) ++i;
    }
    return calls;
  }
  std::optional<NamedCall> c = builtin_call(body);
  if (!c) return std::nullopt;
  return std::vector<NamedCall>{std::move(*c)};
}

}  // namespace chat_detail

}  // namespace ebb
