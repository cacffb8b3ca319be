// The online learning loop's pieces below the server (issue 38 part 4;
// LOCAL §2.2): the rule judge that turns feedback into a training target,
// the running-mean baseline of REINFORCE, the bounded replay buffer and the
// gate's held-back loss. The server (serve/server_learning.cpp) runs them:
// feedback → judge → replay buffer → training jobs on the scheduler →
// versions committed, gated, published.
//
// The rule judge (judge_correction): a correction is either the text the
// user wanted, or a rename in one of the forms
//     "call her X, not Y"   "call him X, not Y"   "call it X, not Y"
//     "call them X, not Y"  "call me X, not Y"    "X, not Y"
// (case-insensitive "call", optional final '.', '!'; X and Y one or more
// words). A rename rewrites the response, every whole-word Y becoming X;
// when the response has no Y the correction does not apply (no target).
//
// Samples (make_sample): a correction trains toward prompt + corrected text
// with weight +correction_weight on the corrected tokens; a reward trains
// the sampled tokens with the advantage A = reward - baseline (REINFORCE
// with a baseline: A < 0 pushes them away), the baseline being the running
// mean of the agent's rewards before this one. Prompt tokens weigh 0.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "train/trainer.h"

namespace ebb {

struct Rename {
  std::string to, from;  // "call her X, not Y": to X, from Y
};
// The rename a correction asks for, if it has one of the forms above.
std::optional<Rename> parse_rename(const std::string& correction);
// The text the user wanted: a rename applied to `response` (nullopt when
// `response` has no whole-word `from`), or the correction itself.
std::optional<std::string> judge_correction(const std::string& response, const std::string& correction);

// The running mean of an agent's rewards (REINFORCE's baseline).
class RewardBaseline {
 public:
  // The advantage of `reward` against the mean so far, then adds it.
  double advantage(double reward) {
    const double a = reward - (n_ > 0 ? mean_ : 0.0);
    ++n_;
    mean_ += (reward - mean_) / static_cast<double>(n_);
    return a;
  }
  double mean() const { return mean_; }
  int64_t count() const { return n_; }
  // Back to a saved state (learn_store.h).
  void restore(double mean, int64_t count) {
    mean_ = mean;
    n_ = count;
  }

 private:
  double mean_ = 0;
  int64_t n_ = 0;
};

// A training target made from a judged trace.
struct LearnSample {
  std::string response_id;
  TrainSample sample;   // tokens and weights
  double weight = 0;    // the weight on its target tokens (advantage, or the correction's)
  bool positive() const { return weight > 0; }
};

// prompt ++ target tokens, the prompt weighing 0 and the target `weight`.
// Target: `corrected` encoded without BOS (a correction), else `output`.
LearnSample make_sample(std::string response_id, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& target, double weight);

// The most recent `capacity` samples, oldest dropped first.
class ReplayBuffer {
 public:
  explicit ReplayBuffer(size_t capacity) : capacity_(capacity) {}
  void push(LearnSample s) {
    items_.push_back(std::move(s));
    while (items_.size() > capacity_) items_.pop_front();
  }
  const std::deque<LearnSample>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::deque<LearnSample> items_;
};

// The gate's measure: the mean cross-entropy of the samples' positively
// weighted tokens (each such token weighing 1) under adapter `name` at
// `version` (name "": the base model). Runs the model: on the thread that
// owns the engine (the scheduler's). Throws ebb::Error for an unknown version.
double heldout_loss(Engine& engine, const std::string& name, uint64_t version, const std::vector<TrainSample>& samples);
// The same over one sample, as a sum and a count of tokens (a gate run as
// a background task measures one sample per step).
struct LossSum {
  double sum = 0;
  int64_t tokens = 0;
};
LossSum heldout_loss_sum(Engine& engine, const std::string& name, uint64_t version, const TrainSample& sample);

}  // namespace ebb
