#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>

#include "platform/error.h"

namespace ebb {

void step_logprobs(std::span<const float> logits, int32_t chosen, int top_n, StepLogprobs& out) {
  const size_t n = logits.size();
  EBB_CHECK(chosen >= 0 && static_cast<size_t>(chosen) < n && top_n >= 0 && static_cast<size_t>(top_n) <= n);
  float max_logit = -INFINITY;
  for (float x : logits) max_logit = std::max(max_logit, x);
  EBB_CHECK_MSG(std::isfinite(max_logit), "logprobs: the logits row has no finite value");
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double lse = max_logit + std::log(sum);  // log sum exp
  out.id = chosen;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(chosen)] - lse);
  out.top.clear();
  if (top_n == 0) return;
  // A min-heap of the best top_n seen (its front the weakest): one
  // comparison for most of the row.
  const auto better = [](const TokenAlternative& a, const TokenAlternative& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  };
  const size_t k = static_cast<size_t>(top_n);
  for (size_t i = 0; i < n; ++i) {
    const TokenAlternative c{static_cast<int32_t>(i), logits[i]};  // raw logit for now
    if (out.top.size() < k) {
      out.top.push_back(c);
      std::push_heap(out.top.begin(), out.top.end(), better);
    } else if (better(c, out.top.front())) {
      std::pop_heap(out.top.begin(), out.top.end(), better);
      out.top.back() = c;
      std::push_heap(out.top.begin(), out.top.end(), better);
    }
  }
  std::sort_heap(out.top.begin(), out.top.end(), better);  // falling
  for (TokenAlternative& t : out.top) t.logprob = static_cast<float>(t.logprob - lse);
}

}  // namespace ebb
