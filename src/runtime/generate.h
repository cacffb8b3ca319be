// The generation loop: prefill the prompt, then sample and run one token at
// a time until a stop condition, streaming text to a callback. Generation
// advances one step at a time (a prefill micro-batch, or one decode token),
// so a scheduler can interleave and batch conversations and cancel between
// steps; generate() is the loop over its steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "platform/timer.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ebb {

struct GenerateOptions {
  int64_t max_tokens = 128;               // generated tokens at most
  SamplerOptions sampling;
  std::vector<std::string> stop_strings;  // generation ends before any of these
  bool stop_at_eog = true;                // end at EOS / EOT tokens
  ProgressFn prefill_progress;            // called after each prefill micro-batch
  // Constrains the generated tokens to a grammar (set on the sampler once
  // the prompt's tokens were accepted). One Generation owns it: pass a fresh
  // constraint (GrammarConstraint::copy()) per generation.
  std::shared_ptr<grammar::GrammarConstraint> constraint;
  // Generation ends (StopReason::kStopString) when one of these tokens is
  // sampled, whether or not stop_at_eog; its text is not emitted.
  std::vector<TokenId> stop_tokens;
  // Control tokens whose text the generated text includes (a chat format's
  // preserved tokens: Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>);
  // other control tokens render as nothing.
  std::vector<TokenId> shown_special_tokens;
  // -1: no log-probabilities; k >= 0: each sampled token's (runtime/
  // logprobs.h: the model's distribution) with its k most likely alternatives.
  int logprobs = -1;
  // Called with each sampled token (end-of-generation and stop tokens too)
  // before its text is emitted; logprob fields are set when logprobs >= 0.
  std::function<void(const StepLogprobs& token)> on_token;
};

enum class StopReason { kMaxTokens, kEndOfGeneration, kStopString, kContextFull, kCancelled };
std::string_view stop_reason_name(StopReason r);

struct GenerateStats {
  int64_t prompt_tokens = 0;   // tokens run in prefill (new this turn)
  int64_t cached_tokens = 0;   // prompt tokens whose KV came from the prefix cache
  double prefill_seconds = 0;
  int64_t generated_tokens = 0;
  double decode_seconds = 0;   // from the first sampled token to the end
  double ttft_seconds = 0;     // from the call to the first token's text
  StopReason stop = StopReason::kMaxTokens;
  std::string text;            // all generated text (stop string excluded)
  std::vector<TokenId> tokens; // all generated tokens
  double prefill_tok_s() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tok_s() const;
};

// Receives each piece of text as it becomes final; return false to stop.
using TextFn = std::function<bool(std::string_view text)>;

// One turn in progress. The constructor records the prompt in the session
// (throwing, with the session unchanged, when it does not fit) and runs
// nothing; each step() runs one prefill micro-batch or one decode token and
// samples what follows. The last sampled token is left pending in the
// session (it runs first on the next turn), so the conversation's tokens are
// complete whenever the generation stops, cancelled or not.
class Generation {
 public:
  Generation(Session& session, std::span<const TokenId> prompt, const GenerateOptions& opts, TextFn on_text);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Runs one step; returns !done().
  bool step();
  bool done() const { return done_; }
  // Ends the generation before its next step (stop reason kCancelled); the
  // session keeps every token recorded so far.
  void cancel();
  bool cancelled() const { return cancelled_; }
  const GenerateStats& stats() const { return st_; }
  Session& session() { return session_; }

  // Batched stepping (run_step in runtime/batch.h): the session's pending
  // tokens ran in a shared forward pass; sample what follows.
  void after_forward();

 private:
  void sample_next();
  void finish(StopReason why);
  void emit(const std::string& text);

  Session& session_;
  GenerateOptions opts_;
  TextFn on_text_;
  Sampler sampler_;
  StreamDecoder decoder_;
  class StopMatcher;
  std::unique_ptr<StopMatcher> stops_;
  Stopwatch clock_;
  int64_t run_before_ = 0, reused_before_ = 0;
  int64_t progress_from_ = -1;  // KV length when the prefill began
  double decode_start_ = 0;
  bool prefilled_ = false, cancelled_ = false, done_ = false;
  StepLogprobs step_lp_;  // the last sampled token's, for on_token
  GenerateStats st_;
};

// Feeds `prompt` into the session, then generates: a Generation stepped to
// its end.
GenerateStats generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& opts,
                       const TextFn& on_text);

}  // namespace ebb
