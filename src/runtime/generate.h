// The generation loop: prefill the prompt, then sample and run one token at
// a time until a stop condition, streaming text to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ebb {

struct GenerateOptions {
  int64_t max_tokens = 128;               // generated tokens at most
  SamplerOptions sampling;
  std::vector<std::string> stop_strings;  // generation ends before any of these
  bool stop_at_eog = true;                // end at EOS / EOT tokens
  ProgressFn prefill_progress;            // called after each prefill micro-batch
};

enum class StopReason { kMaxTokens, kEndOfGeneration, kStopString, kContextFull, kCancelled };
std::string_view stop_reason_name(StopReason r);

struct GenerateStats {
  int64_t prompt_tokens = 0;   // tokens run in prefill (new this turn)
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

// Feeds `prompt` into the session, then generates. The last sampled token is
// left pending in the session (it runs first on the next turn), so the
// conversation's tokens are complete.
GenerateStats generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& opts,
                       const TextFn& on_text);

}  // namespace ebb
