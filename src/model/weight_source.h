// Where the forward pass gets its weights. With everything resident the
// model's own units serve every request (ResidentWeights); elastic restore
// hands out a layer once its latch opens, and budget mode streams the
// non-resident tensors of a layer through a prefetch window. The forward pass
// only sees views, acquired and released layer by layer in order.
#pragma once

#include <cstdint>
#include <span>

#include "model/weights.h"

namespace ebb {

class Model;

// Row `row` of `matrix` (whatever its packing).
struct MatrixRow {
  WeightView matrix;
  int64_t row = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // A forward pass over these tokens starts / ended. A streamer starts its
  // prefetch window here; the embedding rows of `tokens` may be read now.
  virtual void begin_pass(std::span<const int32_t> tokens) {}
  virtual void end_pass() {}

  // Blocks until every tensor of layer l is readable. The views stay valid
  // until release_layer(l). Layers are acquired in increasing order.
  virtual LayerWeights acquire_layer(int l) = 0;
  virtual void release_layer(int l) {}

  // Token t's embedding row (the embedding's type): the whole matrix and t,
  // or a one-row view and 0; valid until the next call or end_pass(). t was
  // checked against the vocabulary.
  virtual MatrixRow embedding_row(int32_t t) = 0;

  // Output norm and head (GlobalWeights::token_embd is not set). A source may
  // serve the head in row ranges (output.rows < n_vocab): the forward pass then
  // calls acquire_head/release_head again for the next rows until n_vocab.
  virtual GlobalWeights acquire_head() = 0;
  virtual void release_head() {}
};

// Every unit resident: views straight into the model's units.
class ResidentWeights final : public WeightSource {
 public:
  explicit ResidentWeights(const Model& model) : model_(model) {}
  LayerWeights acquire_layer(int l) override;
  MatrixRow embedding_row(int32_t t) override;
  GlobalWeights acquire_head() override;

 private:
  const Model& model_;
};

}  // namespace ebb
