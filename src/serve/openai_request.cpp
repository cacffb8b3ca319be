// Reading a request (openai.h): the model, the prompt, sampling, stops,
// logprobs, n, and the fields ebb refuses. Messages, tools and
// response_format: openai_messages.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "platform/error.h"
#include "serve/openai.h"
#include "serve/openai_internal.h"

namespace ebb::serve {

using nlohmann::json;
using namespace detail;

namespace {

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr size_t kMaxNamespaceBytes = 256;
constexpr int64_t kMaxChoices = 8;  // choices decode in one batch (the scheduler's default max_batch)
constexpr int64_t kMaxTopLogprobsChat = 20;
constexpr int64_t kMaxLogprobsCompletions = 5;
constexpr size_t kMaxLogitBias = 1024;
// A seed of 0 asks ebb's sampler for a random one; a client's 0 is a seed
// like any other, so it becomes this constant.
constexpr uint64_t kSeedForZero = 0x9e3779b97f4a7c15ull;

void read_prompt(const json& body, CompletionRequest& r, const RequestLimits& lim) {
  const json* p = field(body, "prompt");
  if (!p) throw ApiException(invalid_request("'prompt' is required", "prompt"));
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return;
  }
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
    return;
  }
  if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (size_t i = 0; i < p->size(); ++i) {
      const json& t = (*p)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= lim.n_vocab)
        throw ApiException(invalid_request("'prompt[" + std::to_string(i) + "]' must be a token id in [0, " +
                                               std::to_string(lim.n_vocab) + ")",
                                           "prompt"));
      r.prompt_tokens.push_back(static_cast<TokenId>(t.get<int64_t>()));
    }
    r.prompt_is_tokens = true;
    return;
  }
  throw ApiException(invalid_request(
      "'prompt' must be a string, an array of one string, or an array of token ids (one prompt per request)", "prompt"));
}

void read_model(const json& body, CompletionRequest& r, const RequestLimits& lim) {
  if (field(body, "model")) r.model = string_field(body, "model");
  std::string adapter;
  if (!r.model.empty() && r.model != lim.model_id && r.model != "base") {
    const size_t colon = r.model.rfind(':');
    const std::string head = colon == std::string::npos ? "" : r.model.substr(0, colon);
    if (colon == std::string::npos || (head != lim.model_id && head != "base") || colon + 1 == r.model.size()) {
      ApiError e;
      e.status = 404;
      e.message = "The model '" + r.model + "' does not exist; this server runs '" + lim.model_id +
                  "' (adapters as '" + lim.model_id + ":NAME'; GET /v1/models lists them)";
      e.param = "model";
      e.code = "model_not_found";
      throw ApiException(e);
    }
    adapter = r.model.substr(colon + 1);
    if (adapter.rfind("agent/", 0) == 0) {
      r.agent = adapter.substr(6);
      adapter.clear();
      if (r.agent.empty()) throw ApiException(invalid_request("'model' names no agent after 'agent/'", "model"));
    }
  }
  if (field(body, "agent")) {
    const std::string a = string_field(body, "agent");
    if (a.empty()) throw ApiException(invalid_request("'agent' must name an agent", "agent"));
    if (!r.agent.empty() && a != r.agent)
      throw ApiException(invalid_request("'agent' is '" + a + "' but 'model' names agent '" + r.agent + "'", "agent"));
    r.agent = a;
  }
  if (field(body, "adapter")) {
    const std::string a = string_field(body, "adapter");
    if (!adapter.empty() && a != adapter)
      throw ApiException(invalid_request("'adapter' is '" + a + "' but 'model' names adapter '" + adapter + "'", "adapter"));
    adapter = a;
  }
  if (r.model.empty()) r.model = lim.model_id;
  if (!r.agent.empty() && !adapter.empty())
    throw ApiException(invalid_request("'adapter' cannot be given with an agent: the agent binds its own adapter",
                                       "adapter"));
  r.adapter = adapter;
  if (field(body, "adapter_version")) {
    const int64_t v = integer(body, "adapter_version");
    if (v < 1) throw ApiException(invalid_request("'adapter_version' must be >= 1", "adapter_version"));
    if (adapter.empty())
      throw ApiException(invalid_request("'adapter_version' needs an adapter ('model': \"" + lim.model_id +
                                             ":NAME\" or 'adapter')", "adapter_version"));
    r.adapter_version = static_cast<uint64_t>(v);
  }
}

// An entry of an array field: the message names the entry, param the field.
TokenId token_id(const json& v, const std::string& entry, const char* param, const RequestLimits& lim) {
  const int64_t t = v.get<int64_t>();
  if (t < 0 || t >= lim.n_vocab)
    throw ApiException(
        invalid_request("'" + entry + "' must be a token id in [0, " + std::to_string(lim.n_vocab) + ")", param));
  return static_cast<TokenId>(t);
}

// "stop": a string or a token id, or an array mixing them; vLLM's
// "stop_token_ids": an array of token ids.
void read_stop(const json& body, CompletionRequest& r, const RequestLimits& lim) {
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) bad("stop_token_ids", "must be an array of token ids");
    if (ids->size() > kMaxStops)
      bad("stop_token_ids", "has " + std::to_string(ids->size()) + " entries; at most " + std::to_string(kMaxStops));
    for (size_t i = 0; i < ids->size(); ++i) {
      const std::string p = "stop_token_ids[" + std::to_string(i) + "]";
      if (!(*ids)[i].is_number_integer()) bad(p.c_str(), "must be a token id (an integer)");
      r.stop_token_ids.push_back(token_id((*ids)[i], p, "stop_token_ids", lim));
    }
  }
  const json* st = field(body, "stop");
  if (!st) return;
  const char* kShape = "must be a string, a token id, or an array of them";
  std::vector<json> items;
  if (st->is_array()) {
    if (st->size() > kMaxStops)
      bad("stop", "has " + std::to_string(st->size()) + " entries; at most " + std::to_string(kMaxStops));
    items.assign(st->begin(), st->end());
  } else {
    items.push_back(*st);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const json& x = items[i];
    const std::string p = st->is_array() ? "stop[" + std::to_string(i) + "]" : "stop";
    if (x.is_number_integer()) {
      r.stop_token_ids.push_back(token_id(x, p, "stop", lim));
    } else if (x.is_string()) {
      std::string s = x.get<std::string>();
      if (s.size() > kMaxStopBytes)
        throw ApiException(
            invalid_request("a 'stop' string is longer than " + std::to_string(kMaxStopBytes) + " bytes", "stop"));
      if (!s.empty()) r.gen.stop_strings.push_back(std::move(s));
    } else {
      throw ApiException(invalid_request("'" + p + "' " + kShape, "stop"));
    }
  }
}

// {"token id": bias in [-100, 100]}, as OpenAI takes it.
void read_logit_bias(const json& body, CompletionRequest& r, const RequestLimits& lim) {
  const json* lb = field(body, "logit_bias");
  if (!lb) return;
  if (!lb->is_object()) bad("logit_bias", "must be an object of {\"token id\": bias}");
  if (lb->size() > kMaxLogitBias) bad("logit_bias", "has more than " + std::to_string(kMaxLogitBias) + " entries");
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    const std::string p = "logit_bias." + key;
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size() || id < 0 || id >= lim.n_vocab)
      throw ApiException(invalid_request("'logit_bias' key '" + key + "' must be a token id in [0, " +
                                             std::to_string(lim.n_vocab) + ")",
                                         "logit_bias"));
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < -100 || it->get<double>() > 100)
      throw ApiException(invalid_request("'" + p + "' must be a number in [-100, 100]", "logit_bias"));
    r.logit_bias.emplace_back(static_cast<TokenId>(id), static_cast<float>(it->get<double>()));
  }
  std::sort(r.logit_bias.begin(), r.logit_bias.end());  // by token id (JSON keys sort as text)
}

void read_sampling(const json& body, CompletionRequest& r, const RequestLimits& lim) {
  SamplerOptions& s = r.gen.sampling;
  if (field(body, "temperature")) {
    const double t = number(body, "temperature");
    if (t < 0) throw ApiException(invalid_request("'temperature' must be >= 0 (0 is greedy)", "temperature"));
    s.temperature = static_cast<float>(t);
  }
  if (field(body, "top_p")) {
    const double p = number(body, "top_p");
    if (!(p > 0 && p <= 1)) throw ApiException(invalid_request("'top_p' must be in (0, 1]", "top_p"));
    s.top_p = static_cast<float>(p);
  }
  if (field(body, "top_k")) {
    const int64_t k = integer(body, "top_k");
    if (k < 0 || k > std::numeric_limits<int>::max())
      throw ApiException(invalid_request("'top_k' must be >= 0 (0: off)", "top_k"));
    s.top_k = static_cast<int>(k);
  }
  if (field(body, "min_p")) {
    const double p = number(body, "min_p");
    if (!(p >= 0 && p <= 1)) throw ApiException(invalid_request("'min_p' must be in [0, 1]", "min_p"));
    s.min_p = static_cast<float>(p);
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (!field(body, name)) continue;
    const double v = number(body, name);
    if (v < 0 || v > 2)
      throw ApiException(invalid_request("'" + std::string(name) +
                                             "' must be in [0, 2] (ebb's penalties only lower repeated tokens)",
                                         name));
    (std::string(name) == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) = static_cast<float>(v);
  }
  if (field(body, "repeat_penalty")) {
    const double v = number(body, "repeat_penalty");
    if (v <= 0) throw ApiException(invalid_request("'repeat_penalty' must be > 0 (1: off)", "repeat_penalty"));
    s.repeat_penalty = static_cast<float>(v);
  }
  if (field(body, "seed")) {
    // Negative: a random seed (llama.cpp's -1); 0 is a seed like any other.
    const int64_t seed = integer(body, "seed");
    s.seed = seed < 0 ? 0 : seed == 0 ? kSeedForZero : static_cast<uint64_t>(seed);
  }
  try {
    s.validate();
  } catch (const Error& e) {
    throw ApiException(invalid_request(e.what()));
  }
  // Tokens to generate.
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (!field(body, name)) continue;
    const int64_t n = integer(body, name);
    if (n < 1) throw ApiException(invalid_request("'" + std::string(name) + "' must be >= 1", name));
    if (n > lim.n_ctx)
      throw ApiException(invalid_request("'" + std::string(name) + "' is " + std::to_string(n) +
                                             "; the context holds " + std::to_string(lim.n_ctx) + " tokens",
                                         name));
    r.gen.max_tokens = n;
    r.max_tokens_given = true;
    break;  // max_completion_tokens wins when both are given
  }
  if (!r.max_tokens_given) r.gen.max_tokens = lim.n_ctx;  // until a stop or the context ends
  read_stop(body, r, lim);
  read_logit_bias(body, r, lim);
}

// Chat: logprobs (bool) and top_logprobs (0..20, needs logprobs);
// completions: logprobs, the number of alternatives (0..5).
void read_logprobs(const json& body, CompletionRequest& r) {
  if (r.endpoint == Endpoint::kChat) {
    if (field(body, "logprobs")) r.logprobs = boolean(body, "logprobs");
    if (field(body, "top_logprobs")) {
      const int64_t k = integer(body, "top_logprobs");
      if (k < 0 || k > kMaxTopLogprobsChat)
        bad("top_logprobs", "must be in [0, " + std::to_string(kMaxTopLogprobsChat) + "]");
      if (!r.logprobs && k > 0) bad("top_logprobs", "needs 'logprobs': true");
      r.top_logprobs = static_cast<int>(k);
    }
    return;
  }
  if (!field(body, "logprobs")) return;
  const json& v = body["logprobs"];
  if (v.is_boolean()) bad("logprobs", "must be an integer in [0, 5] for /v1/completions (true/false is the chat form)");
  const int64_t k = integer(body, "logprobs");
  if (k < 0 || k > kMaxLogprobsCompletions)
    bad("logprobs", "must be in [0, " + std::to_string(kMaxLogprobsCompletions) + "]");
  r.logprobs = true;
  r.top_logprobs = static_cast<int>(k);
}

// Fields OpenAI defines that ebb cannot honour: refused, never ignored.
void refuse_unsupported(const json& body, const CompletionRequest& r) {
  for (const char* name : {"audio", "prediction", "web_search_options"}) {
    if (field(body, name))
      throw ApiException(invalid_request("'" + std::string(name) + "' is not supported by ebb serve", name));
  }
  if (const json* m = field(body, "modalities")) {
    if (!m->is_array()) bad("modalities", "must be an array");
    for (const json& x : *m) {
      if (x != "text")
        throw ApiException(invalid_request("'modalities': ebb serve generates text only (got " + x.dump() + ")",
                                           "modalities"));
    }
  }
  if (r.endpoint == Endpoint::kCompletions) {
    if (field(body, "suffix")) bad("suffix", "(insertion) is not supported by ebb serve");
    if (field(body, "echo") && boolean(body, "echo")) bad("echo", "is not supported by ebb serve");
    if (field(body, "best_of") && integer(body, "best_of") != 1) bad("best_of", "is not supported by ebb serve (1 only)");
  }
}

void read_misc(const json& body, CompletionRequest& r) {
  if (field(body, "n")) {
    const int64_t n = integer(body, "n");
    if (n < 1 || n > kMaxChoices) bad("n", "must be in [1, " + std::to_string(kMaxChoices) + "]");
    r.n = static_cast<int>(n);
  }
  if (field(body, "stream")) r.stream = boolean(body, "stream");
  if (field(body, "ignore_eos")) r.gen.stop_at_eog = !boolean(body, "ignore_eos");
  if (field(body, "return_token_ids")) r.return_token_ids = boolean(body, "return_token_ids");
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiException(invalid_request("'stream_options' must be an object", "stream_options"));
    if (field(*so, "include_usage")) r.include_usage = boolean(*so, "include_usage", "stream_options.include_usage");
  }
  if (field(body, "cache_namespace")) {
    r.cache_namespace = string_field(body, "cache_namespace");
    if (r.cache_namespace.size() > kMaxNamespaceBytes)
      throw ApiException(invalid_request("'cache_namespace' is longer than " + std::to_string(kMaxNamespaceBytes) +
                                             " bytes",
                                         "cache_namespace"));
    r.cache_namespace_given = true;
  }
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs", "must be an object");
    r.chat_template_kwargs = *k;
  }
  if (field(body, "reasoning_effort")) r.reasoning_effort = string_field(body, "reasoning_effort");
}

// What the request asks for that the server does not carry out (lim.served).
void refuse_unserved(const json& body, const CompletionRequest& r, const ServedFeatures& sv) {
  const auto refuse = [](const std::string& param, const std::string& what) {
    throw ApiException(invalid_request("'" + param + "': this server does not support " + what + " yet", param));
  };
  if (!sv.tools) {
    const auto refuse_tools = [&](const std::string& param, const std::string& what) {
      if (sv.tools_why_not.empty()) refuse(param, what);
      throw ApiException(
          invalid_request("'" + param + "': this server does not support " + what + ": " + sv.tools_why_not, param));
    };
    if (!r.tools.empty()) refuse_tools(field(body, "tools") ? "tools" : "functions", "tool calls");
    for (size_t i = 0; i < r.chat_messages.size(); ++i) {
      const json& m = r.chat_messages[i];
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (m.contains("tool_calls")) refuse_tools(p + ".tool_calls", "tool calls in the conversation");
      if (m["role"] == "tool") refuse_tools(p + ".role", "tool results in the conversation");
    }
  }
  if (!sv.constraints && r.response_format.kind != OutputConstraint::kNone) {
    const char* f = r.response_format.kind == OutputConstraint::kGrammar ? "grammar"
                    : field(body, "json_schema")                        ? "json_schema"
                                                                        : "response_format";
    refuse(f, "constrained output (JSON, JSON Schema, grammars)");
  }
  if (!sv.logprobs && r.logprobs) refuse("logprobs", "log-probabilities");
  if (!sv.n_choices && r.n > 1) refuse("n", "more than one choice per request");
  if (!sv.token_ids && r.return_token_ids) refuse("return_token_ids", "token ids in responses");
  if (!sv.stop_token_ids && !r.stop_token_ids.empty()) refuse("stop", "stop token ids");
  if (!sv.logit_bias && !r.logit_bias.empty()) refuse("logit_bias", "logit_bias");
}

}  // namespace

CompletionRequest parse_completion_request(const json& body, Endpoint ep, const RequestLimits& lim) {
  if (!body.is_object()) throw ApiException(invalid_request("the request body must be a JSON object"));
  CompletionRequest r;
  r.endpoint = ep;
  read_model(body, r, lim);
  refuse_unsupported(body, r);
  if (ep == Endpoint::kChat) {
    read_messages(body, r);
    read_tools(body, r);
  } else {
    read_prompt(body, r, lim);
    for (const char* name : {"tools", "tool_choice", "functions", "function_call"}) {
      if (field(body, name)) bad(name, "is for /v1/chat/completions");
    }
  }
  read_response_format(body, r);
  read_sampling(body, r, lim);
  read_logprobs(body, r);
  read_misc(body, r);
  refuse_unserved(body, r, lim.served);
  return r;
}

}  // namespace ebb::serve
