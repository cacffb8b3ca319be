#include "train/optimizer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "platform/error.h"
#include "platform/thread_pool.h"

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

double AdamW::update(LoraAdapter& params, const LoraGrads& grads, ThreadPool& pool) {
  EBB_CHECK(grads.da.size() == params.pairs.size() && grads.dbt.size() == params.pairs.size());
  // Buffer j: pair j / 2, A (even) or Bᵀ (odd). Each buffer's squared sum in
  // double, then the sums in buffer order: the same bits on any number of
  // threads.
  const int64_t nb = static_cast<int64_t>(params.pairs.size()) * 2;
  auto grad = [&](int64_t j) -> const Buffer& { return j % 2 ? grads.dbt[j / 2] : grads.da[j / 2]; };
  std::vector<double> sqs(static_cast<size_t>(nb));
  pool.parallel_for(nb, 1, [&](int64_t j0, int64_t j1, int) {
    for (int64_t j = j0; j < j1; ++j) {
      const Buffer& g = grad(j);
      const float* x = g.as<const float>();
      double sq = 0;
      for (size_t k = 0; k < g.size() / sizeof(float); ++k) sq += double(x[k]) * x[k];
      sqs[static_cast<size_t>(j)] = sq;
    }
  });
  double sq = 0;
  for (double x : sqs) sq += x;
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
  // Element by element, so the split over threads changes nothing.
  pool.parallel_for(nb, 1, [&](int64_t j0, int64_t j1, int) {
    for (int64_t j = j0; j < j1; ++j) {
      LoraPair& p = params.pairs[static_cast<size_t>(j / 2)];
      float* th = (j % 2 ? p.bt : p.a).as<float>();
      const float* g = grad(j).as<const float>();
      float* m = moments_[static_cast<size_t>(j) * 2].as<float>();
      float* v = moments_[static_cast<size_t>(j) * 2 + 1].as<float>();
      const size_t n = (j % 2 ? p.bt : p.a).size() / sizeof(float);
      for (size_t k = 0; k < n; ++k) {
        const float gk = g[k] * clip;
        m[k] = b1 * m[k] + (1.0f - b1) * gk;
        v[k] = b2 * v[k] + (1.0f - b2) * gk * gk;
        const float mh = m[k] / c1, vh = v[k] / c2;
        th[k] -= lr * (mh / (std::sqrt(vh) + opts_.eps) + opts_.weight_decay * th[k]);
      }
    }
  });
  ++step_;
  return norm;
}

}  // namespace ebb
