// Reading a chat request's messages, tools, tool_choice and response_format
// (openai.h), with llama.cpp's grammar / json_schema and OpenAI's legacy
// functions / function_call.
#include <set>
#include <string>

#include "serve/openai.h"
#include "serve/openai_internal.h"

namespace ebb::serve::detail {

using nlohmann::json;

namespace {

constexpr size_t kMaxTools = 128;

std::string at(const std::string& p, size_t i) { return p + "[" + std::to_string(i) + "]"; }

// A message's content: a string, or an array of {"type": "text", "text"} parts (joined).
std::string content_of(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(param, "must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string p = at(param, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(p, "must be an object with a 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type != "text") {
      const bool image = type == "image_url" || type == "image" || type == "input_image";
      const bool audio = type == "input_audio" || type == "audio";
      const std::string what = image ? "image" : audio ? "audio" : type == "file" ? "file" : "'" + type + "'";
      throw ApiException(invalid_request(
          "'" + p + "': ebb does not accept " + what + " inputs (only text parts: {\"type\": \"text\", \"text\"})", p));
    }
    if (!part.contains("text") || !part["text"].is_string()) bad(p + ".text", "must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

// Arguments as a template takes them: the object an OpenAI client's JSON
// string holds, or the string itself when it is not a JSON object.
json arguments_for_template(const json& a, const std::string& p) {
  if (a.is_object()) return a;
  if (!a.is_string()) bad(p, "must be a string of JSON");
  json parsed = json::parse(a.get<std::string>(), nullptr, false);
  if (!parsed.is_discarded() && parsed.is_object()) return parsed;
  return a;
}

json tool_call_of(const json& tc, const std::string& p) {
  if (!tc.is_object()) bad(p, "must be an object");
  json out = json::object();
  if (field(tc, "id")) out["id"] = string_field(tc, "id", p + ".id");
  if (field(tc, "type") && string_field(tc, "type", p + ".type") != "function")
    bad(p + ".type", "must be \"function\"");
  out["type"] = "function";
  const json* fn = field(tc, "function");
  if (!fn || !fn->is_object()) bad(p + ".function", "must be an object {name, arguments}");
  if (!field(*fn, "name")) bad(p + ".function.name", "is required");
  const std::string name = string_field(*fn, "name", p + ".function.name");
  json args = json::object();
  if (const json* a = field(*fn, "arguments")) args = arguments_for_template(*a, p + ".function.arguments");
  out["function"] = {{"name", name}, {"arguments", args}};
  return out;
}

void read_message(const json& msg, const std::string& p, CompletionRequest& r) {
  if (!msg.is_object()) bad(p, "must be an object");
  if (!msg.contains("role") || !msg["role"].is_string()) bad(p + ".role", "must be a string");
  std::string role = msg["role"].get<std::string>();
  if (role == "developer") role = "system";  // OpenAI's newer name for it
  if (role == "function") role = "tool";     // the legacy form of a tool's answer
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    throw ApiException(invalid_request(
        "'" + p + ".role' is '" + role + "'; supported roles are system, developer, user, assistant, tool", p + ".role"));
  json out = {{"role", role}};
  if (field(msg, "name")) out["name"] = string_field(msg, "name", p + ".name");
  // Assistant tool calls (and the legacy single function_call).
  json calls = json::array();
  if (role == "assistant") {
    if (const json* tc = field(msg, "tool_calls")) {
      if (!tc->is_array()) bad(p + ".tool_calls", "must be an array");
      for (size_t i = 0; i < tc->size(); ++i) calls.push_back(tool_call_of((*tc)[i], at(p + ".tool_calls", i)));
    } else if (const json* fc = field(msg, "function_call")) {
      calls.push_back(tool_call_of(json{{"type", "function"}, {"function", *fc}}, p + ".function_call"));
    }
    if (field(msg, "reasoning_content"))
      out["reasoning_content"] = string_field(msg, "reasoning_content", p + ".reasoning_content");
  }
  const json* c = field(msg, "content");
  std::string text;
  if (c) {
    text = content_of(*c, p + ".content");
    out["content"] = text;
  } else if (calls.empty()) {
    bad(p + ".content", "is required");
  } else {
    out["content"] = nullptr;  // an assistant turn of tool calls only
  }
  if (!calls.empty()) out["tool_calls"] = calls;
  if (role == "tool") {
    if (field(msg, "tool_call_id")) {
      out["tool_call_id"] = string_field(msg, "tool_call_id", p + ".tool_call_id");
    } else if (msg["role"] == "tool") {
      bad(p + ".tool_call_id", "is required for a tool message (the id of the call it answers)");
    } else if (!out.contains("name")) {
      bad(p + ".name", "is required for a function message");
    }
  }
  r.messages.push_back({role, text});
  r.chat_messages.push_back(std::move(out));
}

ToolSpec tool_of(const json& fn, const std::string& p) {
  if (!fn.is_object()) bad(p, "must be an object {name, description, parameters}");
  ToolSpec t;
  if (!field(fn, "name")) bad(p + ".name", "is required");
  t.name = string_field(fn, "name", p + ".name");
  if (!valid_function_name(t.name))
    bad(p + ".name", "is '" + t.name + "'; a function name is 1 to 64 of a-z, A-Z, 0-9, '_' and '-'");
  if (field(fn, "description")) t.description = string_field(fn, "description", p + ".description");
  if (const json* params = field(fn, "parameters")) {
    if (!params->is_object()) bad(p + ".parameters", "must be a JSON Schema object");
    if (params->contains("type") && (*params)["type"] != "object")
      bad(p + ".parameters", "must be a schema of \"type\": \"object\"");
    t.parameters = *params;
  } else {
    t.parameters = {{"type", "object"}, {"properties", json::object()}};
  }
  if (field(fn, "strict")) t.strict = boolean(fn, "strict", p + ".strict");
  return t;
}

json tool_json(const ToolSpec& t) {
  json fn = {{"name", t.name}, {"parameters", t.parameters}};
  if (!t.description.empty()) fn["description"] = t.description;
  if (t.strict) fn["strict"] = true;
  return json{{"type", "function"}, {"function", fn}};
}

}  // namespace

void read_messages(const json& body, CompletionRequest& r) {
  const json* m = field(body, "messages");
  if (!m) throw ApiException(invalid_request("'messages' is required", "messages"));
  if (!m->is_array() || m->empty()) bad("messages", "must be a non-empty array");
  for (size_t i = 0; i < m->size(); ++i) read_message((*m)[i], at("messages", i), r);
}

void read_tools(const json& body, CompletionRequest& r) {
  const json* tools = field(body, "tools");
  const json* functions = field(body, "functions");  // legacy
  if (tools && functions) bad("functions", "cannot be given with 'tools' (it is their legacy form)");
  std::set<std::string> names;
  const auto add = [&](ToolSpec t, const std::string& p) {
    if (!names.insert(t.name).second) bad(p + ".name", "'" + t.name + "' is given twice");
    r.tools_json.push_back(tool_json(t));
    r.tools.push_back(std::move(t));
  };
  if (tools) {
    if (!tools->is_array()) bad("tools", "must be an array of {type: \"function\", function: {...}}");
    if (tools->size() > kMaxTools) bad("tools", "has " + std::to_string(tools->size()) + " tools; at most 128");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string p = at("tools", i);
      if (!t.is_object()) bad(p, "must be an object");
      if (!field(t, "type") || string_field(t, "type", p + ".type") != "function")
        bad(p + ".type", "must be \"function\" (the only kind of tool ebb runs)");
      if (!field(t, "function")) bad(p + ".function", "is required");
      add(tool_of(t["function"], p + ".function"), p + ".function");
    }
  } else if (functions) {
    if (!functions->is_array()) bad("functions", "must be an array");
    if (functions->size() > kMaxTools) bad("functions", "has more than 128 functions");
    for (size_t i = 0; i < functions->size(); ++i) add(tool_of((*functions)[i], at("functions", i)), at("functions", i));
  }
  // tool_choice (or the legacy function_call).
  const char* choice_name = field(body, "tool_choice") ? "tool_choice" : "function_call";
  const json* choice = field(body, choice_name);
  if (field(body, "tool_choice") && field(body, "function_call")) bad("function_call", "cannot be given with 'tool_choice'");
  r.tool_choice = r.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (choice) {
    const std::string p = choice_name;
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") r.tool_choice = ToolChoice::kNone;
      else if (c == "auto") r.tool_choice = r.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
      else if (c == "required" && p == "tool_choice") r.tool_choice = ToolChoice::kRequired;
      else bad(p, "is '" + c + "'; it is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}");
    } else if (choice->is_object()) {
      const json* fn = p == "tool_choice" ? field(*choice, "function") : choice;
      if (p == "tool_choice" && (!field(*choice, "type") || (*choice)["type"] != "function"))
        bad(p + ".type", "must be \"function\"");
      if (!fn || !fn->is_object() || !field(*fn, "name"))
        bad(p == "tool_choice" ? p + ".function.name" : p + ".name", "is required");
      const std::string fp = p == "tool_choice" ? p + ".function.name" : p + ".name";
      r.tool_choice_name = string_field(*fn, "name", fp);
      if (!names.count(r.tool_choice_name)) bad(fp, "is '" + r.tool_choice_name + "', which is not in 'tools'");
      r.tool_choice = ToolChoice::kFunction;
    } else {
      bad(p, "must be a string or an object");
    }
    if (r.tools.empty() && r.tool_choice == ToolChoice::kRequired) bad(p, "is \"required\" but no 'tools' are given");
  }
  if (field(body, "parallel_tool_calls")) r.parallel_tool_calls = boolean(body, "parallel_tool_calls");
}

void read_response_format(const json& body, CompletionRequest& r) {
  ResponseFormat& f = r.response_format;
  std::vector<std::string> given;  // constraints named, for the one-at-most rule
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object() || !field(*rf, "type")) bad("response_format", "must be an object with a 'type'");
    const std::string type = string_field(*rf, "type", "response_format.type");
    if (type == "json_object") {
      f.kind = OutputConstraint::kJsonObject;
      if (const json* s = field(*rf, "schema")) {  // llama.cpp's form
        if (!s->is_object()) bad("response_format.schema", "must be a JSON Schema object");
        f.kind = OutputConstraint::kJsonSchema;
        f.schema = *s;
      }
      given.push_back("response_format");
    } else if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) bad("response_format.json_schema", "must be an object {name, schema, strict}");
      if (!field(*js, "name")) bad("response_format.json_schema.name", "is required");
      f.name = string_field(*js, "name", "response_format.json_schema.name");
      if (!valid_function_name(f.name))
        bad("response_format.json_schema.name", "must be 1 to 64 of a-z, A-Z, 0-9, '_' and '-'");
      f.kind = OutputConstraint::kJsonObject;  // no schema: any JSON object
      if (const json* s = field(*js, "schema")) {
        if (!s->is_object()) bad("response_format.json_schema.schema", "must be a JSON Schema object");
        f.kind = OutputConstraint::kJsonSchema;
        f.schema = *s;
      }
      if (field(*js, "strict")) f.strict = boolean(*js, "strict", "response_format.json_schema.strict");
      given.push_back("response_format");
    } else if (type != "text") {
      bad("response_format.type", "is '" + type + "'; it is \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  if (const json* s = field(body, "json_schema")) {  // llama.cpp's top-level schema
    if (!s->is_object()) bad("json_schema", "must be a JSON Schema object");
    f.kind = OutputConstraint::kJsonSchema;
    f.schema = *s;
    f.name.clear();
    given.push_back("json_schema");
  }
  if (field(body, "grammar")) {  // llama.cpp's GBNF
    const std::string g = string_field(body, "grammar");
    if (g.empty()) bad("grammar", "is empty");
    f = ResponseFormat{};
    f.kind = OutputConstraint::kGrammar;
    f.grammar = g;
    given.push_back("grammar");
  }
  if (given.size() > 1)
    bad(given.back(), "cannot be given with '" + given.front() + "': at most one of grammar, json_schema and a JSON response_format");
  if (f.kind == OutputConstraint::kGrammar && r.tool_choice != ToolChoice::kNone)
    bad("grammar", "cannot be given with tools (unless 'tool_choice' is \"none\"): the tool calls have their own grammar");
}

}  // namespace ebb::serve::detail
