// The transformer layer as named blocks, written once for inference
// (runtime/forward.cpp) and training (train/train_pass.cpp), like gemma.cpp's
// TransformerLayer. A layer over n rows is
//
//   attention_block: norm -> q/k/v projections -> biases -> [keep q, k]
//                    -> Q/K norms -> RoPE -> attend -> o projection -> residual
//   ffn_block:       norm -> gate/up projections -> SwiGLU -> down projection
//                    -> residual
//
// Two stages differ between the callers and are theirs (LayerHooks):
//   project  a product of the rows with a layer matrix plus the adapters that
//            apply there. Inference multiplies every row of a step in one
//            dispatch and applies each sequence's adapters; training splits
//            the sample into matmul_rows blocks and keeps each pair's A x for
//            the backward.
//   attend   inference stores K and V into each sequence's KV chunks and
//            attends over them (F16 KV, online softmax); training attends
//            causally over the sample's own F32 rows and keeps the softmax's
//            log-sum-exp for the backward.
// Everything else (the order of the stages, the norms, biases, RoPE,
// residuals and the SwiGLU) is here and nowhere else, so a new architecture
// changes these two functions, and a caller asks for what the backward needs
// through the buffers it passes (AttentionRows::q_raw, FfnRows::h, ...).
//
// Rows are the step's rows (inference: sequence after sequence) or the
// sample's positions (training); every buffer is [n, width] row-major.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/weights.h"

namespace ebb {

// The caller's part of a layer (see above). Per-call state: a caller makes
// one for its step or sample and passes it to the blocks.
class LayerHooks {
 public:
  // One product of a projection: y = x W^T (+ the adapters of (layer, target)).
  struct Out {
    LoraTarget target;
    const WeightView* w;  // [n_in -> n_out]
    float* y;             // [n, y_stride]
    int64_t y_stride;
  };
  // Every product in outs reads the same x: [n, x_stride] (x_stride = n_in).
  // Writes (does not add to) each y.
  virtual void project(int layer, std::initializer_list<Out> outs, const float* x, int64_t x_stride, int64_t n) = 0;
  // Attention of the rows: out = softmax(q k^T * scale) v per head, over the
  // rows' context (the caller's KV, which this call also extends with k, v).
  //   q, out: [n, q_dim]  k, v: [n, kv_dim] (after the Q/K norms and RoPE)
  virtual void attend(int layer, const float* q, const float* k, const float* v, float* out, int64_t n) = 0;

 protected:
  ~LayerHooks() = default;
};

// What the blocks run with: the model's shapes and the target's row kernels.
struct BlockKernels {
  const ModelConfig& cfg;
  const OpsKernels& ops;
};

// The buffers of attention_block over n rows.
struct AttentionRows {
  const float* x_in = nullptr;  // [n, n_embd] the layer's input (the residual stream)
  // [n, n_embd] x_in + o projection. Either x_out == x_in (in place: the
  // projection goes to y, then x_out += y) or y == x_out (the projection
  // goes to x_out, then x_out += x_in).
  float* x_out = nullptr;
  float* y = nullptr;           // [n, n_embd] the o projection's output
  float* xn = nullptr;          // [n, n_embd] the attention norm's output
  float* q = nullptr;           // [n, q_dim]  after the Q norm and RoPE
  float* k = nullptr;           // [n, kv_dim] after the K norm and RoPE
  float* v = nullptr;           // [n, kv_dim]
  float* att = nullptr;         // [n, q_dim]  attention output
  const float* rope = nullptr;  // [n, rope_dim] (cos, sin) pairs of each row's position
  // Kept for the backward when not null: q and k after their projections
  // and biases, before the Q/K norms and RoPE.
  float* q_raw = nullptr;  // [n, q_dim]
  float* k_raw = nullptr;  // [n, kv_dim]
};

// The buffers of ffn_block over n rows.
struct FfnRows {
  const float* x_in = nullptr;  // [n, n_embd] the block's input
  float* x_out = nullptr;       // [n, n_embd] x_in + down projection (as AttentionRows::x_out)
  float* y = nullptr;           // [n, n_embd] the down projection's output
  float* xn = nullptr;          // [n, n_embd] the FFN norm's output
  float* gate = nullptr;        // [n, n_ff]
  float* up = nullptr;          // [n, n_ff]
  float* h = nullptr;           // [n, n_ff] swiglu(gate, up): gate (in place) or a buffer to keep
};

void attention_block(const BlockKernels& k, const LayerWeights& w, int layer, LayerHooks& hooks,
                     const AttentionRows& r, int64_t n);
void ffn_block(const BlockKernels& k, const LayerWeights& w, int layer, LayerHooks& hooks, const FfnRows& r,
               int64_t n);

}  // namespace ebb
