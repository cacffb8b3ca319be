// What `ebb train` reports beside its progress line: the held-out loss of
// the adapter being trained (--eval), and a small SVG line chart of the
// training and held-out losses (--plot). Pure functions of their inputs; the
// caller owns the files and the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "train/trainer.h"

namespace ebb::cli {

// Mean weighted cross-entropy of `samples` under the base model with
// `adapter` applied at scale 1 (Trainer::snapshot(), the parameters now):
// sum over samples and positions of w[i] * -log p(tokens[i] | tokens[<i])
// divided by the sum of the weights. The adapter is added to the engine's
// registry under a private name for the evaluation and removed after it.
double heldout_loss(Engine& engine, std::unique_ptr<LoraAdapter> adapter, const std::vector<TrainSample>& samples);

// One point of a loss curve.
struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

// An SVG line chart (width x height pixels) of the training loss and, when
// not empty, the held-out loss, against the step: axes with their ranges,
// a legend, no scripts or external references.
std::string loss_chart_svg(const std::vector<LossPoint>& train, const std::vector<LossPoint>& eval,
                           const std::string& title, int width = 640, int height = 360);

}  // namespace ebb::cli
