// Log-probabilities of a sampled token and its most likely alternatives,
// for clients that ask for them (OpenAI's logprobs / top_logprobs).
//
// The distribution is the model's own: log_softmax of the raw logits row,
// before logit_bias, penalties, the grammar mask, truncation and
// temperature, so a token's figure does not depend on how it was sampled.
// Cost: one pass for the maximum, one for the sum of exponentials, and one
// heap selection of top_n (<= 20) over the row; nothing is sorted beyond
// the top_n survivors. Only computed when asked for.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ebb {

struct TokenAlternative {
  int32_t id = 0;
  float logprob = 0;
};

struct StepLogprobs {
  int32_t id = 0;     // the sampled token
  float logprob = 0;  // log_softmax(logits)[id]
  std::vector<TokenAlternative> top;  // the top_n most likely, falling (ties: lower id first)
};

// logits: [n_vocab] (-inf allowed; at least one finite). top_n >= 0, at
// most n_vocab. `out.top` is reused (no allocation once it holds top_n).
void step_logprobs(std::span<const float> logits, int32_t chosen, int top_n, StepLogprobs& out);

}  // namespace ebb
