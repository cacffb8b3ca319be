// One sample's forward and backward pass for LoRA training over a frozen
// base model (DESIGN.md "Trainer"; LOCAL §2.2, §4.2). The base weights are
// read, never written, in whatever format they are stored; only the LoRA
// pairs of the trainable adapter get gradients.
//
// The forward runs the whole sample causally (positions 0..T-1, F32
// activations, attention over the sample itself) and keeps, per layer,
// what the backward needs; with `recompute` only each layer's input is kept
// and the layer's forward runs again just before its backward
// (checkpointing: activation memory of one layer instead of all).
//
// The base weights come from a WeightSource (TrainPassOptions::weights: the
// engine's, as inference uses; none: the model's units, which must then be
// resident). Each call below is one pass of its own over the source
// (begin_pass .. end_pass) and holds a layer only while it computes it, so a
// layer may be evicted between two calls: the next one acquires it again
// (from elastic restore's latches or a stream). A caller with elastic memory
// starts the restore of what was evicted before a call (as a session does
// before a step; Trainer::run_phase).
//
// The loss of a sample is Σ_i w_i · CE_i over its positions i >= 1, where
// CE_i is the cross-entropy of token i given tokens [0, i) and w_i its
// weight (1 on a supervised answer's tokens, 0 on the prompt's, an
// advantage for REINFORCE). The logits are made and consumed a block of
// rows at a time, never [T, n_vocab] at once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/lora.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/train_ops.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "platform/allocator.h"
#include "platform/thread_pool.h"

namespace ebb {

// A trainable adapter's gradients, pair by pair of the adapter (same shapes
// as a and bt).
struct LoraGrads {
  std::vector<Buffer> da;   // [rank, n_in]
  std::vector<Buffer> dbt;  // [rank, n_out]
  void zero();
};
LoraGrads make_grads(const LoraAdapter& adapter, Allocator& alloc);

struct TrainPassOptions {
  bool recompute = false;     // checkpointing: keep only each layer's input
  // Logits rows made at once (a block of [head_rows, n_vocab]); 0: by the
  // head's format (default_head_rows).
  int64_t head_rows = 0;
  int64_t matmul_rows = 64;   // rows per forward product (bounds its scratch)
  // Where the base weights come from (nullptr: the model's own units, all
  // resident). The source must serve the output head whole.
  WeightSource* weights = nullptr;
};

// The head's block of rows for a model. The gradient back through the head,
// matmul_t, dequantizes all of the head's weights once per block: for a
// quantized head 32 rows spend 0.7-0.8x the time per row of 16 (Q4_0,
// 151936 x 1024, 2 threads: bench/bench_matmul_t.cpp `151936 1024 16` and
// `... 32`), for a block of 19 MiB there. An F32, F16 or BF16 head only
// converts, so it keeps 16 rows: a block of 32 took up to 0.35 s there,
// past the scheduler's 0.25 s window for one phase.
int64_t default_head_rows(const Model& model);

class TrainPass {
 public:
  // The adapter's pairs must target layer projections (q k v o gate up down)
  // of `model`. Its weight units need not be resident (opts.weights serves them).
  TrainPass(const Model& model, Isa isa, ThreadPool& pool, Allocator& alloc, TrainPassOptions opts = {});
  TrainPass(const TrainPass&) = delete;
  TrainPass& operator=(const TrainPass&) = delete;
  ~TrainPass();

  // Forward of one sample: keeps the activations for backward(). Returns
  // the weighted loss Σ w_i CE_i (not normalised).
  //   tokens, weights: [T] (weights[0] is not used: token 0 has no prediction)
  double forward(std::span<const int32_t> tokens, std::span<const float> weights, const LoraAdapter& adapter);
  // Backward of the last forward: grads += d(loss_scale · loss)/d(params).
  void backward(const LoraAdapter& adapter, float loss_scale, LoraGrads& grads);

  // The same passes in pieces, for phases shorter than a sample's (the
  // result is bit-identical to forward() and backward()):
  //   forward_begin(tokens, weights, adapter)    checks, activations, embeddings
  //   forward_layers(l0, l1, adapter)            layers [l0, l1), in order, covering [0, n_layer)
  //   forward_head(r0, r1)                       head rows [r0, r1) (block-aligned, in order, covering [0, T))
  //   loss()                                     Σ w_i CE_i so far
  //   backward_begin(loss_scale)                 through the final norm
  //   backward_layers(l1, l0, adapter, grads)    layers l1-1 down to l0, in order, covering [0, n_layer)
  void forward_begin(std::span<const int32_t> tokens, std::span<const float> weights, const LoraAdapter& adapter);
  void forward_layers(int l0, int l1, const LoraAdapter& adapter);
  void forward_head(int64_t r0, int64_t r1);
  double loss() const { return loss_; }
  void backward_begin(float loss_scale);
  void backward_layers(int l1, int l0, const LoraAdapter& adapter, LoraGrads& grads);
  int64_t head_rows() const { return opts_.head_rows; }
  // The source of the next calls (nullptr: the model's resident units). A
  // trainer sets the engine's before each phase: it may change between them.
  void set_weight_source(WeightSource* s) { opts_.weights = s; }
  // Frees the activations. Between samples they are kept for the next one
  // (one as long or shorter reuses them); a trainer releases them when it
  // stops or needs the memory.
  void release();
  // Bytes of activations held now (the ledger counts them in kTrainActivations).
  uint64_t held_bytes() const;

  // Bytes the activations of a sample of T tokens take (what forward() allocates).
  uint64_t activation_bytes(int64_t T, int64_t max_rank) const;

 private:
  struct LayerActs;
  class SampleHooks;  // the sample's part of the layer blocks (runtime/layer_blocks.h)
  // w: layer l's weights, held by the caller (a LayerLease) for the call.
  void layer_forward(int l, const LayerWeights& w, const LoraAdapter& ad, LayerActs& a, const float* x_in,
                     float* x_out);
  void layer_backward(int l, const LayerWeights& w, const LoraAdapter& ad, float s, LayerActs& a, float* dx,
                      bool want_dx, LoraGrads& g);
  WeightSource& source() { return opts_.weights ? *opts_.weights : resident_; }
  std::span<const int32_t> pass_tokens() const { return tokens_; }
  void project(const WeightView& w, const float* x, int64_t x_stride, float* y, int64_t y_stride);
  void allocate_acts(int64_t T, int64_t max_rank);

  const Model& model_;
  const ModelConfig& cfg_;
  Isa isa_;
  const KernelSet& ks_;
  const OpsKernels& ops_;
  const LoraKernels& lk_;
  const TrainOpsKernels& tk_;
  ThreadPool& pool_;
  Allocator& alloc_;
  TrainPassOptions opts_;
  ResidentWeights resident_;      // the source when opts_.weights is null

  int64_t T_ = 0;
  int64_t cap_T_ = 0, cap_rank_ = 0;  // what the held buffers were sized for
  double loss_ = 0;               // the sample's Σ w CE over the head rows run so far
  std::vector<float> dx_;         // [T, d] the backward's gradient flowing down the layers
  std::vector<int32_t> tokens_;
  std::vector<float> weights_;
  std::vector<LayerActs> acts_;   // one per layer (or one, reused, with recompute)
  std::vector<Buffer> inputs_;    // [n_layer + 1][T, n_embd]: each layer's input, then the final one
  Buffer rope_;                   // [T, rope_dim] (cos, sin) pairs
  Buffer rope_back_;              // [T, rope_dim] (cos, -sin): the transposed rotation
  Buffer mm_scratch_;             // forward products
  Buffer mt_scratch_;             // matmul_t
  Buffer work_;                   // backward temporaries
  Buffer attn_;                   // per thread: one KV head's gathered attention rows
  Buffer head_;                   // [head_rows, n_vocab] logits, then their gradient
};

}  // namespace ebb
