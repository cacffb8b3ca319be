// OpenAI's wire format for ebb serve: requests of /v1/chat/completions and
// /v1/completions read into what the scheduler runs, and the responses,
// stream chunks and errors written back. No HTTP here (server.cpp).
//
// Fields read (others are ignored, as OpenAI-compatible servers do):
//   model                 "ID", "ID:ADAPTER" or "base:ADAPTER" (ID: the base model's)
//   adapter               an adapter name (instead of the model's suffix)
//   adapter_version       that adapter's version (a staged one too); absent: the published one
//   messages | prompt     chat: [{role, content}] (content a string or text
//                         parts); completions: a string, one-string array, or
//                         an array of token ids
//   max_tokens, max_completion_tokens   >= 1; absent: until a stop or the context ends
//   temperature (>= 0), top_p (0, 1], top_k (>= 0), min_p [0, 1], seed,
//   presence_penalty, frequency_penalty (>= 0: ebb's sampler only lowers
//   repeated tokens), repeat_penalty (> 0), stop (string or array of up to 16),
//   stream, stream_options.include_usage, n (1 only), cache_namespace,
//   ignore_eos (llama.cpp's: generate past end-of-generation tokens)
// Absent sampling fields take `ebb run`'s defaults (temperature 0.8, top-k 40,
// top-p 0.95, min-p 0.05), as llama.cpp's server does.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace ebb::serve {

// An error answered in OpenAI's shape:
//   {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 500;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" : null
  std::string code;   // "" : null
  nlohmann::json body() const;
};

// Thrown while reading a request.
class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError e) : e_(std::move(e)) {}
  const char* what() const noexcept override { return e_.message.c_str(); }
  const ApiError& error() const { return e_; }

 private:
  ApiError e_;
};

ApiError invalid_request(std::string message, std::string param = "", std::string code = "");

enum class Endpoint { kChat, kCompletions };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;    // as the client gave it (echoed in responses)
  std::string adapter;  // "" : the base model
  uint64_t adapter_version = 0;  // 0: the adapter's published version
  std::vector<ChatMessage> messages;       // chat
  std::string prompt;                      // completions, as text
  std::vector<TokenId> prompt_tokens;      // completions, as token ids (when given so)
  bool prompt_is_tokens = false;
  bool max_tokens_given = false;
  GenerateOptions gen;
  bool stream = false;
  bool include_usage = false;
  std::string cache_namespace;
  bool cache_namespace_given = false;
};

// What the server knows when it reads a request.
struct RequestLimits {
  std::string model_id;  // the base model's id
  int32_t n_vocab = 0;
  int64_t n_ctx = 0;
};

// Reads a request body (already parsed as JSON). Throws ApiException (400)
// naming the field and what is wrong, and (404 model_not_found) for a model
// that is not the base model's id.
CompletionRequest parse_completion_request(const nlohmann::json& body, Endpoint ep, const RequestLimits& lim);

// "stop" or "length" (null while running).
std::string finish_reason(StopReason r);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  nlohmann::json json() const;
};

// The whole response of a non-streaming request.
nlohmann::json completion_response(const CompletionRequest& r, const std::string& id, int64_t created,
                                   const std::string& text, StopReason stop, const Usage& u);
// One streamed chunk: a piece of text (role_first: the chat's first chunk
// also carries the role), or the last chunk (finish set), or the usage chunk.
nlohmann::json stream_chunk(const CompletionRequest& r, const std::string& id, int64_t created,
                            const std::string& text, bool role_first, const std::string* finish);
nlohmann::json usage_chunk(const CompletionRequest& r, const std::string& id, int64_t created, const Usage& u);

// "data: {...}\n\n"
std::string sse(const nlohmann::json& j);

}  // namespace ebb::serve
