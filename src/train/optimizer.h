// AdamW over a LoRA adapter's pairs, with clipping by global gradient norm
// and a learning-rate schedule (linear warm-up, then cosine decay).
//
//   lr(t)  = lr · (t + 1) / warmup                         t < warmup
//          = lr_min + (lr - lr_min) · (1 + cos(π · p)) / 2 p = (t - warmup) / (total - warmup), capped at 1
//   g      = g · min(1, clip / ‖g‖₂)                       (clip 0: off)
//   m      = β1 m + (1 - β1) g,  v = β2 v + (1 - β2) g²
//   θ      = θ - lr(t) · (m / (1 - β1^(t+1)) / (sqrt(v / (1 - β2^(t+1))) + ε) + wd · θ)
//
// Deterministic: the same gradients give the same parameters bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "model/lora.h"
#include "platform/allocator.h"
#include "train/train_pass.h"

namespace ebb {

struct AdamWOptions {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_clip = 1.0f;     // max global gradient norm (0: no clipping)
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;    // of the cosine decay (0: constant after warm-up)
  float min_lr_ratio = 0.1f;  // lr_min = lr · min_lr_ratio
};

class ThreadPool;

class AdamW {
 public:
  AdamW(const LoraAdapter& params, const AdamWOptions& opts, Allocator& alloc);

  // The learning rate of step t (0-based).
  float lr_at(int64_t t) const;
  // One update of params from grads (step() counts them), split over the
  // pool's threads (the same bits on any number). Returns the gradient norm
  // before clipping.
  double update(LoraAdapter& params, const LoraGrads& grads, ThreadPool& pool);
  int64_t step() const { return step_; }

  // Optimizer state, for checkpoints: per pair, m and v of A then of B.
  std::vector<Buffer>& moments() { return moments_; }
  const std::vector<Buffer>& moments() const { return moments_; }
  void set_step(int64_t s) { step_ = s; }
  const AdamWOptions& options() const { return opts_; }

 private:
  AdamWOptions opts_;
  std::vector<Buffer> moments_;  // [pair * 4 + {m_a, v_a, m_b, v_b}]
  int64_t step_ = 0;
};

}  // namespace ebb
