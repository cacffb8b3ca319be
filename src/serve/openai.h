// OpenAI's wire format for ebb serve: requests of /v1/chat/completions and
// /v1/completions read into what the scheduler runs, and the responses,
// stream chunks and errors written back. No HTTP here (server.cpp), no
// engine: the server hands in plain structs (Choice, StreamChoice,
// TokenLogprob), so every shape is testable alone (tests/test_openai.cpp).
// Reading is in openai_request.cpp and openai_messages.cpp, writing in
// openai_response.cpp.
//
// Fields read (unknown fields are ignored, as OpenAI-compatible servers do;
// known ones ebb cannot honour are refused with a 400 naming them: audio,
// modalities other than ["text"], prediction, web_search_options, and for
// completions suffix, echo: true, best_of > 1):
//   model                 "ID", "ID:ADAPTER" or "base:ADAPTER" (ID: the base model's)
//   model "ID:agent/NAME" an agent (ebb's agents, serve/server_agents.cpp)
//   agent                 ebb's extension: the agent NAME (its system prompt,
//                         namespace and adapter binding); not with 'adapter'
//   adapter               an adapter name (instead of the model's suffix)
//   adapter_version       that adapter's version (a staged one too); absent: the published one
//   messages              chat: [{role, content, name, tool_calls, tool_call_id,
//                         reasoning_content}], roles system, developer (read
//                         as system), user, assistant, tool, function (legacy,
//                         read as tool); content a string, text parts (joined),
//                         or null for an assistant message with tool calls.
//                         Kept whole in chat_messages (tool-call arguments
//                         parsed into objects, as chat templates expect).
//   prompt                completions: a string, one-string array, or token ids
//   tools, tool_choice, parallel_tool_calls   (functions/function_call: legacy, read as tools)
//   response_format       {type: text | json_object | json_schema}; llama.cpp's
//                         top-level grammar (GBNF) and json_schema; one of them at most
//   logprobs, top_logprobs   chat: bool and 0..20; completions: logprobs 0..5
//   max_tokens, max_completion_tokens   >= 1; absent: until a stop or the context ends
//   temperature (>= 0), top_p (0, 1], top_k (>= 0), min_p [0, 1], seed
//   (negative or absent: random), presence_penalty, frequency_penalty
//   (>= 0: ebb's sampler only lowers repeated tokens), repeat_penalty (> 0),
//   logit_bias ({"token id": -100..100}, carried for the sampler),
//   stop (a string or token id, or an array of up to 16 mixing both),
//   stop_token_ids (vLLM's: an array of up to 16 token ids),
//   stream, stream_options.include_usage, n (1..8), cache_namespace,
//   ignore_eos (llama.cpp's: generate past end-of-generation tokens),
//   chat_template_kwargs (an object for the template, e.g. enable_thinking),
//   reasoning_effort (a string, carried for the template)
//   return_token_ids      ebb's extension: the response carries the prompt's
//                         token ids ("prompt_token_ids", top level) and each
//                         choice's generated ids ("token_ids"; in a stream,
//                         each chunk's)
// Absent sampling fields take `ebb run`'s defaults (temperature 0.8, top-k 40,
// top-p 0.95, min-p 0.05), as llama.cpp's server does.
//
// Serving a chat request with these pieces:
//   1. r = parse_completion_request(body, ep, limits).
//   2. fmt = detect_chat_output_format(template, arch) (model/chat_parse.h);
//      render the prompt from r.chat_messages, r.tools_json and
//      r.chat_template_kwargs; fmt.open_think = prompt_opens_think(prompt,
//      fmt); add fmt.stop_strings to the stops; detokenize so that
//      fmt.preserved_tokens reach the text.
//   3. calls on (r.tools not empty, r.tool_choice != kNone): a grammar from
//      r.tools_json wrapped in fmt.call_prefix / call_suffix, lazy on
//      fmt.triggers (fmt.start_triggers: at the output's start) for kAuto,
//      forced for kRequired and kFunction (that one tool only).
//   4. per choice (r.n of them): a ChatStreamParser(fmt, calls on, ids) fed
//      the text; streamed as StreamChoice{index, first, deltas,
//      finish_reason(stop, made calls)}; whole as Choice{parsed =
//      parse_chat_output(...)}; usage from total_usage.
//   5. stops: r.gen.stop_strings and r.stop_token_ids; r.logit_bias is for
//      the sampler, which must apply it (or the server must refuse it).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/chat_parse.h"
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

// A function the model may call (tools[i].function).
struct ToolSpec {
  std::string name;         // ^[a-zA-Z0-9_-]{1,64}$, unique in the request
  std::string description;  // "" when absent
  nlohmann::json parameters = nlohmann::json::object();  // a JSON Schema object
  bool strict = false;
};

enum class ToolChoice { kAuto, kNone, kRequired, kFunction };

// What the output must match (the grammar engine's input).
enum class OutputConstraint { kNone, kJsonObject, kJsonSchema, kGrammar };
struct ResponseFormat {
  OutputConstraint kind = OutputConstraint::kNone;
  nlohmann::json schema;  // kJsonSchema: the schema (also kJsonObject given llama.cpp's "schema"); else null
  std::string name;       // response_format.json_schema.name ("" for llama.cpp's json_schema)
  bool strict = false;
  std::string grammar;    // kGrammar: GBNF text
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;    // as the client gave it (echoed in responses)
  std::string adapter;  // "" : the base model
  uint64_t adapter_version = 0;  // 0: the adapter's published version
  std::string agent;    // "" : none (the server applies the agent's spec)
  std::vector<ChatMessage> messages;       // chat, flattened for chat_template.h ({role, text})
  // chat: the messages in full for a Jinja template, normalised: each
  // {role, content (string or null), [name], [tool_calls: [{id, type,
  // function: {name, arguments (an object, or the string when not JSON)}}]],
  // [tool_call_id], [reasoning_content]}; roles system, user, assistant, tool.
  nlohmann::json chat_messages = nlohmann::json::array();
  std::string prompt;                      // completions, as text
  std::vector<TokenId> prompt_tokens;      // completions, as token ids (when given so)
  bool prompt_is_tokens = false;
  bool max_tokens_given = false;
  GenerateOptions gen;                     // gen.stop_strings: the request's stop strings
  std::vector<TokenId> stop_token_ids;     // the request's stop entries given as token ids
  std::vector<std::pair<TokenId, float>> logit_bias;  // added to the logits before sampling
  bool stream = false;
  bool include_usage = false;
  std::string cache_namespace;
  bool cache_namespace_given = false;
  // Tools: tools_json is [{type: "function", function: {name, description,
  // parameters}}] as a chat template takes it.
  std::vector<ToolSpec> tools;
  nlohmann::json tools_json = nlohmann::json::array();
  ToolChoice tool_choice = ToolChoice::kNone;  // kAuto when tools are given and tool_choice is not
  std::string tool_choice_name;                // kFunction: a name in tools
  bool parallel_tool_calls = true;
  ResponseFormat response_format;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
  std::string reasoning_effort;
  bool logprobs = false;
  int top_logprobs = 0;  // alternatives per token (chat 0..20; completions' logprobs 0..5)
  int n = 1;             // choices to generate
  bool return_token_ids = false;
};

// What the server knows when it reads a request.
// What the server behind the parser carries out beyond one plain choice. A
// request asking for something it does not is refused (400 naming the
// field) rather than half served. All off by default, so a server learns
// each by saying so; parse_completion_request checks the shape of every
// field either way.
struct ServedFeatures {
  bool tools = false;           // tools, tool_choice; tool messages and assistant tool_calls in history
  bool constraints = false;     // response_format json_object / json_schema, grammar, json_schema
  bool logprobs = false;        // logprobs, top_logprobs
  bool n_choices = false;       // n > 1
  bool token_ids = false;       // return_token_ids
  bool stop_token_ids = false;  // token ids in stop
  bool logit_bias = false;
  // Why tools are not served, appended to their refusal ("": "not yet").
  std::string tools_why_not;
  static ServedFeatures all() { return {true, true, true, true, true, true, true, {}}; }
};

struct RequestLimits {
  std::string model_id;  // the base model's id
  int32_t n_vocab = 0;
  int64_t n_ctx = 0;
  ServedFeatures served;
};

// Reads a request body (already parsed as JSON). Throws ApiException (400)
// naming the field and what is wrong (or what lim.served lacks), and (404
// model_not_found) for a model that is not the base model's id.
CompletionRequest parse_completion_request(const nlohmann::json& body, Endpoint ep, const RequestLimits& lim);

// "stop" or "length" (null while running); "tool_calls" when the choice
// made calls and was not cut off by a limit.
std::string finish_reason(StopReason r);
std::string finish_reason(StopReason r, bool made_tool_calls);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  nlohmann::json json() const;
};

// One token's log-probability and the most likely alternatives at its step.
struct TopLogprob {
  TokenId id = 0;
  std::string text;  // the token's bytes (may be part of a UTF-8 character)
  float logprob = 0;
};
struct TokenLogprob {
  TokenId id = 0;
  std::string text;
  float logprob = 0;
  std::vector<TopLogprob> top;  // most likely first; r.top_logprobs of them
};

// One finished choice, as the server hands it over.
struct Choice {
  std::string text;                    // the generated text (completions; chat without `parsed`)
  std::optional<ParsedOutput> parsed;  // chat: content, reasoning_content, tool_calls
  StopReason stop = StopReason::kEndOfGeneration;
  std::vector<TokenLogprob> logprobs;  // one per generated token, when r.logprobs
  std::vector<TokenId> token_ids;      // the generated tokens, when r.return_token_ids
  int64_t completion_tokens = 0;
};

// Usage over n choices: the prompt counted once, the completions summed.
Usage total_usage(int64_t prompt_tokens, int64_t cached_tokens, std::span<const Choice> choices);

// chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}
nlohmann::json chat_logprobs(std::span<const TokenLogprob> lp);
// completions (legacy): {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset},
// offsets counted from text_offset (where the first token's text starts).
nlohmann::json completion_logprobs(std::span<const TokenLogprob> lp, int64_t text_offset = 0);
// chat: {role: "assistant", content (null when there are only calls),
// [reasoning_content], [tool_calls: [{id, type: "function", function: {name, arguments}}]]}
nlohmann::json chat_message(const ParsedOutput& p);

// The whole response of a non-streaming request: choices with their index,
// usage, and prompt_token_ids when r.return_token_ids.
nlohmann::json completion_response(const CompletionRequest& r, const std::string& id, int64_t created,
                                   std::span<const Choice> choices, const Usage& u,
                                   std::span<const TokenId> prompt_token_ids = {});
// One choice of plain text (the server's first form; chat content unparsed).
nlohmann::json completion_response(const CompletionRequest& r, const std::string& id, int64_t created,
                                   const std::string& text, StopReason stop, const Usage& u);

// What one streamed chunk carries for one choice.
struct StreamChoice {
  int index = 0;
  bool first = false;               // chat: the choice's first chunk (delta.role)
  std::vector<ChatDelta> deltas;    // chat: from ChatStreamParser (merged into one delta)
  std::string text;                 // completions: the piece of text
  std::optional<std::string> finish_reason;  // the choice's last chunk
  std::vector<TokenLogprob> logprobs;        // this chunk's tokens, when r.logprobs
  int64_t text_offset = 0;          // completions: where `text` starts in the choice's output
  std::vector<TokenId> token_ids;   // this chunk's tokens, when r.return_token_ids
};
// A chunk for one or more choices; prompt_token_ids (given with the first
// chunk, when r.return_token_ids) go at the top level.
nlohmann::json stream_chunk(const CompletionRequest& r, const std::string& id, int64_t created,
                            std::span<const StreamChoice> choices, std::span<const TokenId> prompt_token_ids = {});
// One streamed chunk: a piece of text (role_first: the chat's first chunk
// also carries the role), or the last chunk (finish set), or the usage chunk.
nlohmann::json stream_chunk(const CompletionRequest& r, const std::string& id, int64_t created,
                            const std::string& text, bool role_first, const std::string* finish);
nlohmann::json usage_chunk(const CompletionRequest& r, const std::string& id, int64_t created, const Usage& u);

// "data: {...}\n\n"
std::string sse(const nlohmann::json& j);

}  // namespace ebb::serve
