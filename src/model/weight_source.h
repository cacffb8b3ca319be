// Where the forward pass (and a training pass) gets its weights. With
// everything resident the model's own units serve every request
// (ResidentWeights); elastic restore hands out a layer once its latch opens,
// and budget mode streams the non-resident tensors of a layer through a
// prefetch window. Passes only see views, acquired and released layer by
// layer: nothing may keep a view past release_layer(), since a unit can be
// evicted between two passes (a training phase acquires again each time).
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
  // until release_layer(l). Inference acquires layers in increasing order;
  // a training backward acquires them in decreasing order, one at a time
  // (elastic memory's stream serves that too, prefetching less well; budget
  // mode's forward window does not, and the trainer refuses budget mode).
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

// Holds layer l of a source for a scope: acquired on construction, released
// on destruction (also when the pass throws).
class LayerLease {
 public:
  LayerLease(WeightSource& s, int l) : s_(s), l_(l), w_(s.acquire_layer(l)) {}
  ~LayerLease() { s_.release_layer(l_); }
  LayerLease(const LayerLease&) = delete;
  LayerLease& operator=(const LayerLease&) = delete;
  const LayerWeights& weights() const { return w_; }

 private:
  WeightSource& s_;
  int l_;
  LayerWeights w_;
};

// begin_pass() on construction, end_pass() on destruction.
class PassScope {
 public:
  PassScope(WeightSource& s, std::span<const int32_t> tokens) : s_(s) { s_.begin_pass(tokens); }
  ~PassScope() { s_.end_pass(); }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

 private:
  WeightSource& s_;
};

// Views of layer l's / the output head's shapes, types and packings with no
// data (every pointer null): what sizing scratch needs, readable whether or
// not the units are resident. Never pass them to a kernel.
LayerWeights layer_shapes(const Model& model, int l);
WeightView head_shape(const Model& model);

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
