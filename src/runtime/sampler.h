// Picks the next token from a row of logits.
//
// The order of the steps, fixed and the same for every call:
//   0. grammar (only with a constraint set, see set_constraint): tokens the
//      grammar does not allow are dropped before any later step sees them;
//   1. logit_bias: each listed token's logit gets its bias added (a bias of
//      -100 or less bans the token: its logit becomes -inf); then the
//      penalties, over the last `penalty_last_n` accepted tokens:
//        repetition (CTRL, Keskar et al. 2019): a positive logit is divided by
//          repeat_penalty, a negative one multiplied, so both move down;
//        frequency: logit -= count * frequency_penalty;
//        presence:  logit -= presence_penalty (once, if the token occurs).
//   2. top-k: keep the k largest logits (top_k = 0: off).
//   3. top-p: keep the smallest prefix, by falling probability, whose
//      cumulative probability is >= top_p (top_p = 1: off).
//   4. min-p: drop tokens whose probability is < min_p * the largest
//      probability (min_p = 0: off).
//   5. temperature: divide the surviving logits by it, softmax, draw.
// Steps 3 and 4 see the distribution at temperature 1, so temperature only
// reshapes what the filters let through; it never widens the set.
//
// temperature = 0 is greedy: logit_bias and penalties, then argmax (ties go to the lowest id),
// and the random generator is not touched. Truncation cannot change the
// argmax, so greedy skips steps 2-4.
//
// With a grammar constraint (set_constraint), greedy sampling first checks
// the argmax with GrammarConstraint::allows() and computes the full mask
// only when it is refused; that is exact, since the argmax of the allowed
// tokens is the overall argmax whenever the grammar allows it. Sampling at
// temperature > 0 always applies the full mask before the filters, so the
// draw comes from the masked distribution exactly (no sample-then-resample
// shortcut, which would skew it). When the grammar allows no token, or every
// allowed token has logit -inf, sample() throws ebb::Error.
//
// Randomness comes from std::mt19937_64, whose output is fixed by the C++
// standard, and is turned into a uniform double by bit arithmetic rather than
// std::uniform_real_distribution (whose algorithm each standard library picks),
// so one seed gives one token sequence on every platform.
//
// Nothing is allocated per call: the candidate and probability buffers
// ([n_vocab] each) and the penalty history ([penalty_last_n]) are sized in the
// constructor. Top-k selects with a k-element heap (one comparison for most of
// the vocabulary) and sorts only the k survivors, so top-k 40 over a 150k
// vocabulary takes well under a millisecond; top-p without top-k sorts only as
// far down the ranking as its cumulative sum needs.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace ebb {

namespace grammar {
class GrammarConstraint;
}

struct SamplerOptions {
  float temperature = 0.8f;       // >= 0; 0: greedy
  int top_k = 40;                 // >= 0; 0: off
  float top_p = 0.95f;            // (0, 1]; 1: off
  float min_p = 0.05f;            // [0, 1]; 0: off
  float repeat_penalty = 1.0f;    // > 0; 1: off
  float frequency_penalty = 0.0f; // >= 0; 0: off
  float presence_penalty = 0.0f;  // >= 0; 0: off
  int penalty_last_n = 64;        // [0, kMaxPenaltyLastN]; 0: no penalties
  uint64_t seed = 0;              // 0: a random seed from std::random_device
  // Added to the logits before anything else (OpenAI's logit_bias): ids in
  // [0, n_vocab), biases in [-100, 100]; -100 bans the token.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // The history is preallocated, so its length is bounded.
  static constexpr int kMaxPenaltyLastN = 1 << 20;

  // Throws ebb::Error naming the first option out of range and its valid range.
  void validate() const;
};

class Sampler {
 public:
  // Validates `opts` (ebb::Error on a bad value, or on n_vocab <= 0).
  Sampler(SamplerOptions opts, int32_t n_vocab);
  Sampler(const Sampler&) = delete;  // owns n_vocab-sized buffers
  Sampler& operator=(const Sampler&) = delete;
  Sampler(Sampler&&) = default;
  Sampler& operator=(Sampler&&) = default;

  // logits: [n_vocab], left untouched. NaN or +inf logits, or a row with no
  // finite logit, come from the model's data (NaN weights, overflow) and
  // throw ebb::Error naming the cause; the sampler is unchanged and usable.
  // -inf is fine (a masked token).
  int32_t sample(std::span<const float> logits);

  // Records a token (prompt or generated) for the penalties; with a
  // constraint set, also advances the grammar by it (ebb::Error, before
  // anything is recorded, when the grammar refuses it).
  void accept(int32_t token);

  // Constrains every later sample() to the grammar (nullptr: no constraint).
  // Set it after the prompt's tokens were accepted: from then on accept()
  // feeds each token to the grammar. Sizes a [n_vocab] mask buffer once.
  void set_constraint(std::shared_ptr<grammar::GrammarConstraint> constraint);
  grammar::GrammarConstraint* constraint() const { return constraint_.get(); }

  // Forgets the history and restarts the random sequence from seed(), so a
  // reset sampler repeats its first run exactly; a constraint goes back to
  // its start.
  void reset();

  // The seed in use: opts.seed, or the one drawn when opts.seed was 0.
  uint64_t seed() const { return seed_; }
  const SamplerOptions& options() const { return opts_; }
  int32_t n_vocab() const { return n_vocab_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  void fill_and_penalize(std::span<const float> logits);
  int32_t argmax() const;
  // Makes candidates_[0, k) the k largest, in falling order (ties: lower id
  // first), given that [0, sorted_) already are.
  void sort_prefix(size_t k);
  void apply_top_k();
  void apply_top_p();
  void apply_min_p();
  int32_t draw();
  int32_t sample_constrained();  // steps 0-5 with constraint_ active
  double uniform01();  // in [0, 1), 53 random bits

  SamplerOptions opts_;
  int32_t n_vocab_;
  uint64_t seed_;
  std::mt19937_64 rng_;

  std::vector<Candidate> candidates_;  // [n_vocab]; [0, n_candidates_) alive
  size_t n_candidates_ = 0;
  size_t sorted_ = 0;                  // candidates_[0, sorted_) is the sorted top
  std::vector<float> probs_;           // [n_vocab] scratch for the draw

  std::vector<int32_t> history_;       // [penalty_last_n] ring of accepted tokens
  size_t history_next_ = 0;            // ring write position
  size_t history_size_ = 0;            // valid entries, <= penalty_last_n
  std::vector<int32_t> counts_;        // [n_vocab] scratch, all zero between calls

  std::shared_ptr<grammar::GrammarConstraint> constraint_;  // null: unconstrained
  std::vector<uint8_t> mask_;          // [n_vocab] allowed tokens, when constrained
};

}  // namespace ebb
