#include "serve/openai.h"

#include <cmath>
#include <limits>

#include "platform/error.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr size_t kMaxNamespaceBytes = 256;
// A seed of 0 asks ebb's sampler for a random one; a client's 0 is a seed
// like any other, so it becomes this constant.
constexpr uint64_t kSeedForZero = 0x9e3779b97f4a7c15ull;

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& body, const char* name) {
  const json& v = *field(body, name);
  if (!v.is_number()) throw ApiException(invalid_request("'" + std::string(name) + "' must be a number", name));
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw ApiException(invalid_request("'" + std::string(name) + "' must be finite", name));
  return d;
}

int64_t integer(const json& body, const char* name) {
  const json& v = *field(body, name);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw ApiException(invalid_request("'" + std::string(name) + "' is too large", name));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  throw ApiException(invalid_request("'" + std::string(name) + "' must be an integer", name));
}

bool boolean(const json& body, const char* name) {
  const json& v = *field(body, name);
  if (!v.is_boolean()) throw ApiException(invalid_request("'" + std::string(name) + "' must be true or false", name));
  return v.get<bool>();
}

std::string string_field(const json& body, const char* name) {
  const json& v = *field(body, name);
  if (!v.is_string()) throw ApiException(invalid_request("'" + std::string(name) + "' must be a string", name));
  return v.get<std::string>();
}

// A message's content: a string, or an array of {"type": "text", "text"} parts.
std::string content_of(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string text;
    for (size_t i = 0; i < c.size(); ++i) {
      const json& part = c[i];
      const std::string p = param + "[" + std::to_string(i) + "]";
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        throw ApiException(invalid_request("'" + p + "' must be an object with a 'type'", p));
      if (part["type"] != "text")
        throw ApiException(invalid_request("'" + p + "': only text parts are supported (got '" +
                                               part["type"].get<std::string>() + "')",
                                           p));
      if (!part.contains("text") || !part["text"].is_string())
        throw ApiException(invalid_request("'" + p + ".text' must be a string", p + ".text"));
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw ApiException(invalid_request("'" + param + "' must be a string or an array of text parts", param));
}

void read_messages(const json& body, CompletionRequest& r) {
  const json* m = field(body, "messages");
  if (!m) throw ApiException(invalid_request("'messages' is required", "messages"));
  if (!m->is_array() || m->empty())
    throw ApiException(invalid_request("'messages' must be a non-empty array", "messages"));
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) throw ApiException(invalid_request("'" + p + "' must be an object", p));
    if (!msg.contains("role") || !msg["role"].is_string())
      throw ApiException(invalid_request("'" + p + ".role' must be a string", p + ".role"));
    std::string role = msg["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant")
      throw ApiException(invalid_request("'" + p + ".role' is '" + role + "'; supported roles are system, user, assistant",
                                         p + ".role"));
    if (!msg.contains("content") || msg["content"].is_null())
      throw ApiException(invalid_request("'" + p + ".content' is required", p + ".content"));
    r.messages.push_back({role, content_of(msg["content"], p + ".content")});
  }
}

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
  }
  if (field(body, "adapter")) {
    const std::string a = string_field(body, "adapter");
    if (!adapter.empty() && a != adapter)
      throw ApiException(invalid_request("'adapter' is '" + a + "' but 'model' names adapter '" + adapter + "'", "adapter"));
    adapter = a;
  }
  if (r.model.empty()) r.model = lim.model_id;
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
    const int64_t seed = integer(body, "seed");
    s.seed = seed == 0 ? kSeedForZero : static_cast<uint64_t>(seed);
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
  // Stop strings.
  if (const json* st = field(body, "stop")) {
    std::vector<std::string> stops;
    if (st->is_string()) {
      stops.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > kMaxStops)
        throw ApiException(invalid_request("'stop' has " + std::to_string(st->size()) + " strings; at most " +
                                               std::to_string(kMaxStops),
                                           "stop"));
      for (const json& x : *st) {
        if (!x.is_string()) throw ApiException(invalid_request("'stop' must be a string or an array of strings", "stop"));
        stops.push_back(x.get<std::string>());
      }
    } else {
      throw ApiException(invalid_request("'stop' must be a string or an array of strings", "stop"));
    }
    for (std::string& x : stops) {
      if (x.size() > kMaxStopBytes)
        throw ApiException(invalid_request("a 'stop' string is longer than " + std::to_string(kMaxStopBytes) + " bytes",
                                           "stop"));
      if (!x.empty()) r.gen.stop_strings.push_back(std::move(x));
    }
  }
}

}  // namespace

json ApiError::body() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

ApiError invalid_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

CompletionRequest parse_completion_request(const json& body, Endpoint ep, const RequestLimits& lim) {
  if (!body.is_object()) throw ApiException(invalid_request("the request body must be a JSON object"));
  CompletionRequest r;
  r.endpoint = ep;
  read_model(body, r, lim);
  if (ep == Endpoint::kChat) read_messages(body, r);
  else read_prompt(body, r, lim);
  if (field(body, "n") && integer(body, "n") != 1)
    throw ApiException(invalid_request("'n' must be 1: ebb serve returns one choice per request", "n"));
  read_sampling(body, r, lim);
  if (field(body, "stream")) r.stream = boolean(body, "stream");
  if (field(body, "ignore_eos")) r.gen.stop_at_eog = !boolean(body, "ignore_eos");
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiException(invalid_request("'stream_options' must be an object", "stream_options"));
    if (field(*so, "include_usage")) {
      if (!(*so)["include_usage"].is_boolean())
        throw ApiException(invalid_request("'stream_options.include_usage' must be true or false",
                                           "stream_options.include_usage"));
      r.include_usage = (*so)["include_usage"].get<bool>();
    }
  }
  if (field(body, "cache_namespace")) {
    r.cache_namespace = string_field(body, "cache_namespace");
    if (r.cache_namespace.size() > kMaxNamespaceBytes)
      throw ApiException(invalid_request("'cache_namespace' is longer than " + std::to_string(kMaxNamespaceBytes) +
                                             " bytes",
                                         "cache_namespace"));
    r.cache_namespace_given = true;
  }
  return r;
}

std::string finish_reason(StopReason r) {
  return r == StopReason::kMaxTokens || r == StopReason::kContextFull ? "length" : "stop";
}

json Usage::json() const {
  return nlohmann::json{{"prompt_tokens", prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"total_tokens", prompt_tokens + completion_tokens},
                        {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

namespace {

json envelope(const CompletionRequest& r, const std::string& id, int64_t created, bool chunk) {
  const bool chat = r.endpoint == Endpoint::kChat;
  return json{{"id", id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", created},
              {"model", r.model},
              {"system_fingerprint", "ebb"}};
}

}  // namespace

json completion_response(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& text,
                         StopReason stop, const Usage& u) {
  json j = envelope(r, id, created, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(stop)}};
  if (r.endpoint == Endpoint::kChat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  j["choices"] = json::array({choice});
  j["usage"] = u.json();
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

std::string sse(const json& j) {
  // Invalid UTF-8 in generated text (a model can emit any bytes) is replaced
  // rather than thrown.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace ebb::serve
