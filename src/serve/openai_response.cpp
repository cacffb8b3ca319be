// Writing responses (openai.h): whole responses with n choices, messages
// with reasoning and tool calls, logprobs in the chat and the legacy
// completions shapes, and stream chunks with tool-call deltas.
#include "serve/openai.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

json envelope(const CompletionRequest& r, const std::string& id, int64_t created, bool chunk) {
  const bool chat = r.endpoint == Endpoint::kChat;
  return json{{"id", id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", created},
              {"model", r.model},
              {"system_fingerprint", "ebb"}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json ids_of(std::span<const TokenId> ids) { return json(std::vector<TokenId>(ids.begin(), ids.end())); }

// A stream chunk's delta from the parser's deltas: content and reasoning
// joined, one tool_calls entry per call (its header and argument pieces merged).
json chat_delta(const StreamChoice& c) {
  json d = json::object();
  if (c.first) d["role"] = "assistant";
  std::string content, reasoning;
  bool has_content = false, has_reasoning = false;
  json calls = json::array();
  for (const ChatDelta& x : c.deltas) {
    switch (x.kind) {
      case ChatDelta::Kind::kContent:
        content += x.text;
        has_content = true;
        break;
      case ChatDelta::Kind::kReasoning:
        reasoning += x.text;
        has_reasoning = true;
        break;
      case ChatDelta::Kind::kToolCall:
        calls.push_back({{"index", x.index},
                         {"id", x.id},
                         {"type", "function"},
                         {"function", {{"name", x.name}, {"arguments", ""}}}});
        break;
      case ChatDelta::Kind::kToolArguments:
        if (!calls.empty() && calls.back()["index"] == x.index) {
          calls.back()["function"]["arguments"] = calls.back()["function"]["arguments"].get<std::string>() + x.text;
        } else {
          calls.push_back({{"index", x.index}, {"function", {{"arguments", x.text}}}});
        }
        break;
    }
  }
  // The first chunk carries content "" as OpenAI's does, so a client sees
  // the message start even when the model begins with reasoning or a call.
  if (has_content || (c.first && !c.finish_reason)) d["content"] = content;
  if (has_reasoning) d["reasoning_content"] = reasoning;
  if (!calls.empty()) d["tool_calls"] = calls;
  return d;
}

}  // namespace

json chat_logprobs(std::span<const TokenLogprob> lp) {
  json content = json::array();
  for (const TokenLogprob& t : lp) {
    json top = json::array();
    for (const TopLogprob& a : t.top)
      top.push_back({{"token", a.text}, {"logprob", a.logprob}, {"bytes", bytes_of(a.text)}});
    content.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_of(t.text)}, {"top_logprobs", top}});
  }
  return json{{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs(std::span<const TokenLogprob> lp, int64_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  int64_t at = text_offset;
  for (const TokenLogprob& t : lp) {
    tokens.push_back(t.text);
    token_logprobs.push_back(t.logprob);
    json alts = json::object();
    for (const TopLogprob& a : t.top) {
      if (!alts.contains(a.text)) alts[a.text] = a.logprob;  // two ids can share a text: the likelier stays
    }
    top.push_back(alts);
    offsets.push_back(at);
    at += static_cast<int64_t>(t.text.size());
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json chat_message(const ParsedOutput& p) {
  json m = {{"role", "assistant"}};
  m["content"] = p.content.empty() && !p.tool_calls.empty() ? json(nullptr) : json(p.content);
  if (!p.reasoning_content.empty()) m["reasoning_content"] = p.reasoning_content;
  if (!p.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCall& c : p.tool_calls)
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = calls;
  }
  return m;
}

json completion_response(const CompletionRequest& r, const std::string& id, int64_t created,
                         std::span<const Choice> choices, const Usage& u, std::span<const TokenId> prompt_token_ids) {
  json j = envelope(r, id, created, false);
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    const bool calls = c.parsed && !c.parsed->tool_calls.empty();
    json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", finish_reason(c.stop, calls)}};
    if (r.endpoint == Endpoint::kChat) {
      choice["message"] = c.parsed ? chat_message(*c.parsed) : json{{"role", "assistant"}, {"content", c.text}};
      if (r.logprobs) choice["logprobs"] = chat_logprobs(c.logprobs);
    } else {
      choice["text"] = c.text;
      if (r.logprobs) choice["logprobs"] = completion_logprobs(c.logprobs);
    }
    if (r.return_token_ids) choice["token_ids"] = ids_of(c.token_ids);
    out.push_back(std::move(choice));
  }
  j["choices"] = std::move(out);
  j["usage"] = u.json();
  if (r.return_token_ids) j["prompt_token_ids"] = ids_of(prompt_token_ids);
  return j;
}

json completion_response(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& text,
                         StopReason stop, const Usage& u) {
  Choice c;
  c.text = text;
  c.stop = stop;
  return completion_response(r, id, created, std::span<const Choice>(&c, 1), u);
}

json stream_chunk(const CompletionRequest& r, const std::string& id, int64_t created,
                  std::span<const StreamChoice> choices, std::span<const TokenId> prompt_token_ids) {
  json j = envelope(r, id, created, true);
  json out = json::array();
  for (const StreamChoice& c : choices) {
    json choice = {{"index", c.index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (c.finish_reason) choice["finish_reason"] = *c.finish_reason;
    if (r.endpoint == Endpoint::kChat) {
      choice["delta"] = chat_delta(c);
      if (r.logprobs && !c.logprobs.empty()) choice["logprobs"] = chat_logprobs(c.logprobs);
    } else {
      choice["text"] = c.text;
      if (r.logprobs && !c.logprobs.empty()) choice["logprobs"] = completion_logprobs(c.logprobs, c.text_offset);
    }
    if (r.return_token_ids) choice["token_ids"] = ids_of(c.token_ids);
    out.push_back(std::move(choice));
  }
  j["choices"] = std::move(out);
  if (r.return_token_ids && !prompt_token_ids.empty()) j["prompt_token_ids"] = ids_of(prompt_token_ids);
  if (r.include_usage) j["usage"] = nullptr;
  return j;
}

json stream_chunk(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& text,
                  bool role_first, const std::string* finish) {
  json j = envelope(r, id, created, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = *finish;
  if (r.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (role_first) delta["role"] = "assistant";
    if (!finish || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  if (r.include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const CompletionRequest& r, const std::string& id, int64_t created, const Usage& u) {
  json j = envelope(r, id, created, true);
  j["choices"] = json::array();
  j["usage"] = u.json();
  return j;
}

}  // namespace ebb::serve
