#include "train/optimizer.h"

#include <cmath>
#include <cstring>

#include "platform/error.h"

namespace ebb {

AdamW::AdamW(const LoraAdapter& params, const AdamWOptions& opts, Allocator& alloc) : opts_(opts) {
  if (!(opts_.lr > 0) || !(opts_.beta1 >= 0 && opts_.beta1 < 1) || !(opts_.beta2 >= 0 && opts_.beta2 < 1) ||
      !(opts_.eps > 0) || !(opts_.weight_decay >= 0) || !(opts_.grad_clip >= 0) || opts_.warmup_steps < 0 ||
      opts_.total_steps < 0 || !(opts_.min_lr_ratio >= 0 && opts_.min_lr_ratio <= 1)) {
    throw Error("AdamW: the learning rate and eps must be > 0, beta1 and beta2 in [0, 1), weight decay, clip, "
                "warm-up and total steps >= 0, and the minimum learning-rate ratio in [0, 1]");
  }
  for (const LoraPair& p : params.pairs) {
    for (const Buffer* b : {&p.a, &p.a, &p.bt, &p.bt}) {
      Buffer m = alloc.allocate(b->size(), MemCategory::kTrainOptimizer);
      std::memset(m.data(), 0, m.size());
      moments_.push_back(std::move(m));
    }
  }
}

float AdamW::lr_at(int64_t t) const {
  if (t < opts_.warmup_steps) return opts_.lr * static_cast<float>(t + 1) / static_cast<float>(opts_.warmup_steps);
  if (opts_.total_steps <= opts_.warmup_steps) return opts_.lr;
  const double p = std::min(1.0, static_cast<double>(t - opts_.warmup_steps) /
                                     static_cast<double>(opts_.total_steps - opts_.warmup_steps));
  const double lo = static_cast<double>(opts_.lr) * opts_.min_lr_ratio;
  return static_cast<float>(lo + (opts_.lr - lo) * 0.5 * (1.0 + std::cos(M_PI * p)));
}

double AdamW::update(LoraAdapter& params, const LoraGrads& grads) {
  EBB_CHECK(grads.da.size() == params.pairs.size() && grads.dbt.size() == params.pairs.size());
  double sq = 0;
  for (size_t i = 0; i < params.pairs.size(); ++i) {
    for (const Buffer* g : {&grads.da[i], &grads.dbt[i]}) {
      const float* x = g->as<const float>();
      for (size_t k = 0; k < g->size() / sizeof(float); ++k) sq += double(x[k]) * x[k];
    }
  }
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) {
    throw Error("training: the gradient is not finite (norm " + std::to_string(norm) +
                "); the step is not applied (lower the learning rate, or check the samples' weights)");
  }
  const float clip = opts_.grad_clip > 0 && norm > opts_.grad_clip ? static_cast<float>(opts_.grad_clip / norm) : 1.0f;
  const float lr = lr_at(step_);
  const float b1 = opts_.beta1, b2 = opts_.beta2;
  const float c1 = 1.0f - static_cast<float>(std::pow(double(b1), double(step_ + 1)));
  const float c2 = 1.0f - static_cast<float>(std::pow(double(b2), double(step_ + 1)));
  for (size_t i = 0; i < params.pairs.size(); ++i) {
    LoraPair& p = params.pairs[i];
    const Buffer* gs[2] = {&grads.da[i], &grads.dbt[i]};
    Buffer* ps[2] = {&p.a, &p.bt};
    for (int h = 0; h < 2; ++h) {
      float* th = ps[h]->as<float>();
      const float* g = gs[h]->as<const float>();
      float* m = moments_[i * 4 + static_cast<size_t>(h) * 2].as<float>();
      float* v = moments_[i * 4 + static_cast<size_t>(h) * 2 + 1].as<float>();
      const size_t n = ps[h]->size() / sizeof(float);
      for (size_t k = 0; k < n; ++k) {
        const float gk = g[k] * clip;
        m[k] = b1 * m[k] + (1.0f - b1) * gk;
        v[k] = b2 * v[k] + (1.0f - b2) * gk * gk;
        const float mh = m[k] / c1, vh = v[k] / c2;
        th[k] -= lr * (mh / (std::sqrt(vh) + opts_.eps) + opts_.weight_decay * th[k]);
      }
    }
  }
  ++step_;
  return norm;
}

}  // namespace ebb
