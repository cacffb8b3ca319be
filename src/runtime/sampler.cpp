#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "platform/error.h"
#include "runtime/grammar/constraint.h"

namespace ebb {
namespace {

[[noreturn]] void bad_option(const char* name, double value, const char* valid) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "sampler option %s = %g is out of range; valid: %s", name, value,
                valid);
  throw Error(buf);
}

// Falling logit; equal logits keep the lower id first, so every ordering (and
// therefore every draw) is a pure function of the logits. A function object,
// not a function pointer, so the sorts inline it.
struct Higher {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

}  // namespace

void SamplerOptions::validate() const {
  // Written as !(in range) so that NaN fails too.
  if (!(temperature >= 0.0f) || std::isinf(temperature))
    bad_option("temperature", temperature, "finite and >= 0 (0: greedy)");
  if (top_k < 0) bad_option("top_k", top_k, ">= 0 (0: off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad_option("top_p", top_p, "(0, 1] (1: off)");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad_option("min_p", min_p, "[0, 1] (0: off)");
  if (!(repeat_penalty > 0.0f) || std::isinf(repeat_penalty))
    bad_option("repeat_penalty", repeat_penalty, "finite and > 0 (1: off)");
  if (!(frequency_penalty >= 0.0f) || std::isinf(frequency_penalty))
    bad_option("frequency_penalty", frequency_penalty, "finite and >= 0 (0: off)");
  if (!(presence_penalty >= 0.0f) || std::isinf(presence_penalty))
    bad_option("presence_penalty", presence_penalty, "finite and >= 0 (0: off)");
  if (penalty_last_n < 0 || penalty_last_n > kMaxPenaltyLastN)
    bad_option("penalty_last_n", penalty_last_n, "[0, 1048576] (0: no penalties)");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) bad_option("logit_bias token id", id, ">= 0 and < n_vocab");
    if (!(bias >= -100.0f && bias <= 100.0f)) bad_option("logit_bias", bias, "[-100, 100] (-100: ban the token)");
  }
}

Sampler::Sampler(SamplerOptions opts, int32_t n_vocab) : opts_(opts), n_vocab_(n_vocab) {
  opts_.validate();
  if (n_vocab <= 0) bad_option("n_vocab", n_vocab, ">= 1");
  for (const auto& [id, bias] : opts_.logit_bias)
    if (id >= n_vocab) bad_option("logit_bias token id", id, "< n_vocab");
  seed_ = opts_.seed;
  if (seed_ == 0) {
    std::random_device rd;
    seed_ = (uint64_t{rd()} << 32) | rd();
    if (seed_ == 0) seed_ = 1;  // 0 means "pick one"; keep seed() reusable
  }
  rng_.seed(seed_);
  candidates_.resize(static_cast<size_t>(n_vocab));
  probs_.resize(static_cast<size_t>(n_vocab));
  counts_.assign(static_cast<size_t>(n_vocab), 0);
  history_.resize(static_cast<size_t>(opts_.penalty_last_n));
}

void Sampler::accept(int32_t token) {
  EBB_CHECK_MSG(token >= 0 && token < n_vocab_, "accepted token outside the vocabulary");
  if (constraint_) constraint_->accept(token);
  if (history_.empty()) return;
  history_[history_next_] = token;
  history_next_ = (history_next_ + 1) % history_.size();
  history_size_ = std::min(history_size_ + 1, history_.size());
}

void Sampler::set_constraint(std::shared_ptr<grammar::GrammarConstraint> constraint) {
  constraint_ = std::move(constraint);
  if (constraint_) mask_.resize(static_cast<size_t>(n_vocab_));
}

void Sampler::reset() {
  if (constraint_) constraint_->reset();
  history_next_ = 0;
  history_size_ = 0;
  rng_.seed(seed_);
}

int32_t Sampler::sample(std::span<const float> logits) {
  EBB_CHECK_MSG(logits.size() == static_cast<size_t>(n_vocab_), "logits row is not n_vocab long");
  fill_and_penalize(logits);
  if (constraint_ && constraint_->active()) return sample_constrained();
  if (opts_.temperature == 0.0f) return argmax();

  apply_top_k();
  apply_top_p();
  apply_min_p();
  return draw();
}

void Sampler::fill_and_penalize(std::span<const float> logits) {
  float max_logit = -INFINITY;
  bool nan = false;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    const float x = logits[i];
    nan |= std::isnan(x);
    max_logit = std::max(max_logit, x);
    candidates_[i] = {x, i};
  }
  // A NaN would break the orderings below; an all -inf (or any +inf) row has
  // no distribution. Both come from the data (weights that hold NaN or
  // overflow), so they are bad input: the caller ends the turn and can add
  // the position.
  if (nan) {
    int64_t n = 0;
    for (int32_t i = 0; i < n_vocab_; ++i) n += std::isnan(logits[i]);
    throw Error("the model produced NaN logits (" + std::to_string(n) + " of " + std::to_string(n_vocab_) +
                "): its weights hold NaN or infinite values, or its activations overflowed; the model file is "
                "probably damaged or badly converted");
  }
  if (!std::isfinite(max_logit)) {
    throw Error(std::string("the model produced ") + (max_logit > 0 ? "an infinite logit" : "no finite logit") +
                ": its activations overflowed or its weights hold infinite values; the model file is probably "
                "damaged or badly converted");
  }
  n_candidates_ = candidates_.size();
  sorted_ = 0;
  // Candidates are in id order here, so candidates_[t] is token t.
  for (const auto& [id, bias] : opts_.logit_bias) {
    float& l = candidates_[static_cast<size_t>(id)].logit;
    l = bias <= -100.0f ? -INFINITY : l + bias;
  }

  const bool penalties = opts_.repeat_penalty != 1.0f || opts_.frequency_penalty != 0.0f ||
                         opts_.presence_penalty != 0.0f;
  if (!penalties || history_size_ == 0) return;
  // Count occurrences in counts_, then visit each distinct token once,
  // zeroing its count as we go, so counts_ is all zero again afterwards and
  // the cost is O(penalty_last_n), not O(n_vocab).
  for (size_t j = 0; j < history_size_; ++j) ++counts_[history_[j]];
  for (size_t j = 0; j < history_size_; ++j) {
    const int32_t t = history_[j];
    const int32_t count = counts_[t];
    if (count == 0) continue;  // already applied
    counts_[t] = 0;
    // Candidates are still in id order here, so candidates_[t] is token t.
    float& l = candidates_[t].logit;
    l = l > 0.0f ? l / opts_.repeat_penalty : l * opts_.repeat_penalty;
    l -= static_cast<float>(count) * opts_.frequency_penalty + opts_.presence_penalty;
  }
}

int32_t Sampler::argmax() const {
  // Strict '>' in id order: ties go to the lowest id.
  int32_t best = 0;
  for (int32_t i = 1; i < n_vocab_; ++i)
    if (candidates_[i].logit > candidates_[best].logit) best = i;
  return best;
}

void Sampler::sort_prefix(size_t k) {
  k = std::min(k, n_candidates_);
  if (k <= sorted_) return;
  auto first = candidates_.begin() + static_cast<ptrdiff_t>(sorted_);
  auto mid = candidates_.begin() + static_cast<ptrdiff_t>(k);
  auto last = candidates_.begin() + static_cast<ptrdiff_t>(n_candidates_);
  // Everything past sorted_ is <= the sorted prefix, so selecting within the
  // tail extends the prefix without touching it.
  const Higher cmp;
  if (k - sorted_ <= (n_candidates_ - sorted_) / 64) {
    // Few wanted from many (top-k 40 of 150k): heap selection compares most
    // of the tail once against the heap's weakest member, about twice as fast
    // as nth_element's repeated partitioning.
    std::partial_sort(first, mid, last, cmp);
  } else {
    if (mid < last) std::nth_element(first, mid, last, cmp);
    std::sort(first, mid, cmp);
  }
  sorted_ = k;
}

void Sampler::apply_top_k() {
  const auto k = static_cast<size_t>(opts_.top_k);
  if (k == 0 || k >= n_candidates_) return;
  sort_prefix(k);
  n_candidates_ = k;
}

void Sampler::apply_top_p() {
  if (opts_.top_p >= 1.0f) return;
  // Probabilities at temperature 1 over the current candidates.
  float max_logit = -INFINITY;
  double sum = 0.0;
  for (size_t i = 0; i < n_candidates_; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
  for (size_t i = 0; i < n_candidates_; ++i) sum += std::exp(candidates_[i].logit - max_logit);
  const double target = static_cast<double>(opts_.top_p) * sum;

  // Walk down the ranking, sorting more of it only as the walk needs it: a
  // peaked distribution stops after a few tokens and never pays for a full
  // sort of the vocabulary.
  double cum = 0.0;
  size_t kept = 0;
  while (kept < n_candidates_) {
    if (kept == sorted_) sort_prefix(std::max<size_t>(64, 2 * sorted_));
    cum += std::exp(candidates_[kept].logit - max_logit);
    ++kept;
    if (cum >= target) break;
  }
  n_candidates_ = kept;
  sorted_ = std::min(sorted_, n_candidates_);
}

void Sampler::apply_min_p() {
  if (opts_.min_p <= 0.0f) return;
  // p_i >= min_p * p_max  <=>  logit_i - logit_max >= log(min_p); comparing
  // logits saves an exp per candidate.
  float max_logit = -INFINITY;
  if (sorted_ > 0) {
    max_logit = candidates_[0].logit;
  } else {
    for (size_t i = 0; i < n_candidates_; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
  }
  const float threshold = max_logit + std::log(opts_.min_p);
  auto first = candidates_.begin();
  auto last = first + static_cast<ptrdiff_t>(n_candidates_);
  auto keep = [threshold](const Candidate& c) { return c.logit >= threshold; };
  // After top-k or top-p the survivors are fully sorted, so the kept ones are
  // a prefix; otherwise partition (deterministic, so draws stay reproducible).
  auto end = sorted_ == n_candidates_ ? std::partition_point(first, last, keep)
                                      : std::partition(first, last, keep);
  n_candidates_ = static_cast<size_t>(end - first);
  sorted_ = std::min(sorted_, n_candidates_);
  EBB_CHECK(n_candidates_ > 0);  // the max itself always passes
}

int32_t Sampler::draw() {
  float max_logit = -INFINITY;
  for (size_t i = 0; i < n_candidates_; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
  const float inv_t = 1.0f / opts_.temperature;
  double sum = 0.0;
  for (size_t i = 0; i < n_candidates_; ++i) {
    // Subtract before scaling: a tiny temperature then gives exp(-huge) = 0
    // instead of overflowing.
    probs_[i] = std::exp((candidates_[i].logit - max_logit) * inv_t);
    sum += probs_[i];
  }
  const double u = uniform01() * sum;
  double cum = 0.0;
  size_t last_nonzero = 0;
  for (size_t i = 0; i < n_candidates_; ++i) {
    if (probs_[i] == 0.0f) continue;
    cum += probs_[i];
    last_nonzero = i;
    if (cum > u) return candidates_[i].id;
  }
  return candidates_[last_nonzero].id;  // rounding left u just past the total
}

int32_t Sampler::sample_constrained() {
  if (opts_.temperature == 0.0f) {
    // Fast path: the unconstrained argmax, if the grammar takes it, is the
    // constrained argmax too.
    const int32_t best = argmax();
    if (constraint_->allows(best)) return best;
  }
  const size_t n_allowed = constraint_->fill_mask(mask_);
  if (n_allowed == 0)
    throw Error("grammar constraint: no token is allowed here (the grammar needs text that no token of the "
                "vocabulary starts, or it is complete and the vocabulary has no end-of-generation token)");
  // Drop the refused tokens, keeping id order (argmax ties and the draws
  // stay a pure function of the logits).
  size_t j = 0;
  float max_logit = -INFINITY;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    if (!mask_[static_cast<size_t>(i)]) continue;
    max_logit = std::max(max_logit, candidates_[static_cast<size_t>(i)].logit);
    candidates_[j++] = candidates_[static_cast<size_t>(i)];
  }
  if (!std::isfinite(max_logit))
    throw Error("grammar constraint: every token the grammar allows (" + std::to_string(n_allowed) +
                ") has logit -inf");
  n_candidates_ = j;
  sorted_ = 0;
  if (opts_.temperature == 0.0f) {
    size_t best = 0;  // strict '>' in id order: ties go to the lowest id
    for (size_t i = 1; i < n_candidates_; ++i)
      if (candidates_[i].logit > candidates_[best].logit) best = i;
    return candidates_[best].id;
  }
  apply_top_k();
  apply_top_p();
  apply_min_p();
  return draw();
}

double Sampler::uniform01() {
  // The top 53 bits of one mt19937_64 output, scaled to [0, 1).
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

}  // namespace ebb
