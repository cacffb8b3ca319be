// ebb serve's chat side: a request's prompt (rendered through the model's
// Jinja template, or the marker renderer when there is none) and its
// grammar (response_format, grammar, json_schema, tools), following the
// recipe in openai.h's header comment.
//
// Grammars: a forced call (tool_choice required or a named function) is the
// tool grammar wrapped in the format's call_prefix/call_suffix from the
// first token; tool_choice auto is the same grammar, lazy on the format's
// trigger words (formats whose calls start only with a bare '{' at the
// output's start, kGeneric and kLlama3 without <|python_tag|>, get no lazy
// grammar: their calls are parsed, not constrained). response_format /
// grammar / json_schema constrain the whole output when no call is forced;
// with tool_choice auto and a response format both, the response format wins.
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/tool_grammar.h"
#include "serve/server_impl.h"

namespace ebb::serve {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// nlohmann::json keeps keys sorted; the template and the grammar take the
// ordered kind (tool schemas print as tojson).
ordered_json ordered(const json& j) { return ordered_json::parse(j.dump()); }

// The messages as templates take them: an assistant message that only made
// calls has content "" rather than null, since templates (Qwen3's among
// them) test `'</think>' in message.content`, which fails on None.
ordered_json template_messages(const json& messages) {
  ordered_json m = ordered(messages);
  for (auto& x : m)
    if (x.value("role", "") == "assistant" && x.contains("content") && x["content"].is_null()) x["content"] = "";
  return m;
}

// A value of the body in the client's key order, when it is the same value
// as the request's (sorted) one; else the request's.
ordered_json same_or(const ordered_json* from_body, const json& in_request) {
  if (from_body && json::parse(from_body->dump()) == in_request) return *from_body;
  return ordered(in_request);
}

const ordered_json* member(const ordered_json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

}  // namespace

ClientOrder client_order(const CompletionRequest& r, const std::string& body) {
  ClientOrder out;
  if (r.tools.empty() && r.response_format.schema.is_null()) return out;
  // The body was read (bounded) already; this is a second, ordered reading.
  const ordered_json b = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  const ordered_json* body_tools = member(b, "tools");
  for (const json& t : r.tools_json) {
    ordered_json tool = ordered(t);
    const ordered_json* params = nullptr;
    if (body_tools && body_tools->is_array() && t.contains("function")) {
      for (const ordered_json& bt : *body_tools) {
        const ordered_json* f = member(bt, "function");
        const ordered_json* name = f ? member(*f, "name") : nullptr;
        if (name && name->is_string() && *name == t["function"].value("name", "")) params = member(*f, "parameters");
      }
    }
    if (t.contains("function") && t["function"].contains("parameters"))
      tool["function"]["parameters"] = same_or(params, t["function"]["parameters"]);
    out.tools.push_back(std::move(tool));
  }
  if (!r.response_format.schema.is_null()) {
    const ordered_json* rf = member(b, "response_format");
    const ordered_json* js = rf ? member(*rf, "json_schema") : nullptr;
    const ordered_json* candidates[] = {js ? member(*js, "schema") : nullptr, rf ? member(*rf, "schema") : nullptr,
                                        member(b, "json_schema")};
    out.schema = ordered(r.response_format.schema);
    for (const ordered_json* c : candidates) {
      if (c && json::parse(c->dump()) == r.response_format.schema) {
        out.schema = *c;
        break;
      }
    }
  }
  return out;
}

std::shared_ptr<const grammar::TokenTrie> Server::Impl::token_trie() const {
  std::lock_guard lock(trie_mu);
  if (!trie) trie = grammar::TokenTrie::from_tokenizer(engine.tokenizer());
  return trie;
}

std::vector<TokenId> Server::Impl::prompt_tokens(const CompletionRequest& r, GenerateOptions& go,
                                                 ChatOutputFormat& fmt, const ClientOrder& order,
                                                 bool generation_prompt) const {
  const Tokenizer& tok = engine.tokenizer();
  EncodeOptions eo;
  eo.add_bos = tok.add_bos_default();
  fmt = opts.output_format;
  if (r.endpoint != Endpoint::kChat) {
    if (r.prompt_is_tokens) return r.prompt_tokens;
    return tok.encode(r.prompt, eo);
  }
  std::string text;
  if (opts.chat_template) {
    try {
      ordered_json extra = ordered(r.chat_template_kwargs);
      if (!r.reasoning_effort.empty() && !extra.contains("reasoning_effort"))
        extra["reasoning_effort"] = r.reasoning_effort;
      const ordered_json tools = r.tools.empty() ? ordered_json() : order.tools;
      text = opts.chat_template->render(template_messages(r.chat_messages), tools, generation_prompt, extra);
    } catch (const Error& e) {
      throw ApiException(invalid_request(std::string("the chat template cannot render these messages: ") + e.what(),
                                         "messages"));
    }
    fmt.open_think = prompt_opens_think(text, fmt);
    for (const std::string& s : fmt.stop_strings) go.stop_strings.push_back(s);
    // The family's markers reach the text (and so the parser) even where
    // the vocabulary holds them as control tokens.
    EncodeOptions one;
    one.add_bos = false;
    one.parse_special = true;
    for (const std::string& m : fmt.preserved_tokens) {
      const std::vector<TokenId> ids = tok.encode(m, one);
      if (ids.size() == 1 && tok.is_control(ids[0])) go.shown_special_tokens.push_back(ids[0]);
    }
    // A template that writes the BOS text itself gets no second one.
    const std::string& bos = opts.chat_template->bos_token();
    if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) eo.add_bos = false;
  } else {
    try {
      text = apply_chat_template(opts.chat_format, r.messages, generation_prompt);
    } catch (const Error& e) {
      throw ApiException(invalid_request(e.what(), "messages"));
    }
    for (const std::string& s : chat_stop_strings(opts.chat_format)) go.stop_strings.push_back(s);
  }
  eo.parse_special = true;
  return tok.encode(text, eo);
}

std::shared_ptr<grammar::GrammarConstraint> Server::Impl::constraint_for(const CompletionRequest& r,
                                                                         const ChatOutputFormat& fmt,
                                                                         const ClientOrder& order) const {
  const bool forced = calls_on(r) && (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kFunction);
  const bool lazy = calls_on(r) && r.tool_choice == ToolChoice::kAuto &&
                    r.response_format.kind == OutputConstraint::kNone && !fmt.triggers.empty();
  std::string gbnf, param;
  try {
    if (forced || lazy) {
      param = r.tool_choice == ToolChoice::kFunction ? "tool_choice" : "tools";
      ordered_json tools = order.tools;
      if (r.tool_choice == ToolChoice::kFunction) {
        ordered_json one = ordered_json::array();
        for (const auto& t : tools)
          if (t.contains("function") && t["function"].value("name", "") == r.tool_choice_name) one.push_back(t);
        tools = std::move(one);
      }
      grammar::ToolCallGrammarOptions to;
      to.prefix = fmt.call_prefix;
      to.suffix = fmt.call_suffix;
      to.parallel = r.parallel_tool_calls && r.tool_choice != ToolChoice::kFunction;
      gbnf = grammar::tool_call_gbnf(tools, to);
    } else {
      switch (r.response_format.kind) {
        case OutputConstraint::kNone:
          return nullptr;
        case OutputConstraint::kJsonObject:
          param = "response_format";
          gbnf = r.response_format.schema.is_null() ? grammar::json_object_gbnf()
                                                    : grammar::json_schema_to_gbnf(order.schema);
          break;
        case OutputConstraint::kJsonSchema:
          param = r.response_format.name.empty() ? "json_schema" : "response_format";
          gbnf = grammar::json_schema_to_gbnf(order.schema);
          break;
        case OutputConstraint::kGrammar:
          param = "grammar";
          gbnf = r.response_format.grammar;
          break;
      }
    }
    std::shared_ptr<const grammar::Grammar> g = grammar::Grammar::parse(gbnf);
    grammar::ConstraintOptions co;
    if (lazy) {
      co.lazy = true;
      co.trigger_words = fmt.triggers;
      // A trigger the vocabulary holds as one (special) token triggers by id too.
      EncodeOptions eo;
      eo.add_bos = false;
      eo.parse_special = true;
      for (const std::string& w : fmt.triggers) {
        const std::vector<TokenId> ids = engine.tokenizer().encode(w, eo);
        if (ids.size() == 1) co.trigger_tokens.push_back(ids[0]);
      }
    }
    return std::make_shared<grammar::GrammarConstraint>(std::move(g), token_trie(), std::move(co));
  } catch (const Error& e) {
    throw ApiException(invalid_request("'" + param + "' cannot be served as a grammar: " + e.what(), param));
  }
}

}  // namespace ebb::serve
