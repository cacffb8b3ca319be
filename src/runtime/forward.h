// The transformer forward pass over weight units and a chunked KV cache.
// Scratch is planned once for the largest micro-batch (STYLE habit 5), so
// running a batch allocates nothing.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu.h"
#include "kernels/lora.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "platform/allocator.h"
#include "platform/thread_pool.h"
#include "runtime/adapters.h"
#include "runtime/layer_blocks.h"

namespace ebb {

class KvCache;
class DeviceForward;

struct ForwardOptions {
  int64_t max_batch = 64;   // tokens per step (all sequences together)
  int64_t max_chunk_size = 256;  // largest KV chunk size of any session
};

// One sequence's part of a step: its tokens run at positions
// [kv->n_tokens(), kv->n_tokens() + tokens.size()) over its own chunk table.
struct StepSeq {
  KvCache* kv = nullptr;            // must already have writable chunks for the tokens
  std::span<const int32_t> tokens;
  float* logits = nullptr;          // [n_out, n_vocab]: n_out = tokens.size() when all_logits, else 1
  bool all_logits = false;
  // The adapters this sequence's rows apply at every projection they
  // adapt (nullptr or empty: the base model alone).
  const AdapterSet* adapters = nullptr;
};

class Forward {
 public:
  Forward(const Model& model, Isa isa, ThreadPool& pool, Allocator& alloc, ForwardOptions opts);
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // Runs tokens at positions [kv.n_tokens(), kv.n_tokens() + tokens.size()),
  // writes their K and V into kv (which must already have chunks for them)
  // and advances kv.n_tokens(). tokens.size() <= max_batch.
  //   logits: [n_out, n_vocab] where n_out = tokens.size() when all_logits,
  //           else 1 (the last token's logits).
  // Weights come from `source` (nullptr: the model's resident units).
  void run(std::span<const int32_t> tokens, KvCache& kv, float* logits, bool all_logits,
           WeightSource* source = nullptr, const AdapterSet* adapters = nullptr);

  // One step over several sequences (batched decode, prefill micro-batches
  // of different sessions): every weight matrix is read once for all their
  // rows; attention runs per sequence over its own chunks. The tokens of all
  // sequences together are at most max_batch. Each kv advances by its
  // sequence's tokens. A row's result does not depend on which other rows
  // share the step (the kernels compute each (row, token) the same way in a
  // batch of two or more; a one-token step may sum in another order).
  void run_batch(std::span<const StepSeq> seqs, WeightSource* source = nullptr);

  // Re-plans scratch for a larger KV chunk size (called when a session is
  // created, never during generation).
  void ensure_chunk_size(int64_t chunk_size);
  // Re-plans the adapters' rank-r intermediate for a larger rank (called
  // when a session binds adapters, never during generation).
  void ensure_lora_rank(int64_t rank);

  // Steps run on a compute device from now on (runtime/device_forward.h;
  // nullptr: on the CPU, here); in a split (DeviceForward::first_layer() >
  // 0) the layers before first_layer run here, and the hidden rows go to
  // the device for the rest and the head. Set once by the engine, before
  // any session.
  void set_device(DeviceForward* device) { device_ = device; }
  DeviceForward* device() const { return device_; }

  int64_t max_batch() const { return opts_.max_batch; }
  uint64_t scratch_bytes() const { return scratch_.size() + head_scratch_.size() + lora_scratch_.size(); }
  Isa isa() const { return isa_; }

 private:
  void plan_scratch();
  // The step's part of the layer blocks (runtime/layer_blocks.h): its
  // products with their adapters, and attention over each sequence's chunks.
  class StepHooks;
  // The one place adapters attach: adds Σ_i s_i · B_i (A_i x) of (layer,
  // target) to the rows of every sequence that binds adapters.
  //   x: [rows, x_stride]  y: [rows, y_stride], rows in step order; for the
  //   output head out_rows: rows are the gathered logits rows.
  void apply_lora(std::span<const StepSeq> seqs, int layer, LoraTarget target, const float* x, int64_t x_stride,
                  float* y, int64_t y_stride, bool out_rows = false);
  // The adapters' low-rank terms of (layer, target) for the weight w, which
  // matmul adds inside the product's own dispatch: the terms of one
  // sequence's one-row step (decode) when fused_lora_, else none. slot:
  // which product of a shared-input group (q, k, v), each with its own terms.
  std::span<const LowRankTerm> lora_terms(std::span<const StepSeq> seqs, int layer, LoraTarget target,
                                          const WeightView& w, int slot);
  void matmul(const WeightView& w, const float* x, int64_t n, float* y, int64_t y_stride,
              std::span<const LowRankTerm> terms = {});
  // Several weights that read the same input (q/k/v, gate/up): the input is
  // quantized once and all their rows run in one pool dispatch (matmul_multi).
  struct MatmulOut {
    const WeightView* w;
    float* y;  // [n, y_stride]
    int64_t y_stride;
    std::span<const LowRankTerm> terms = {};  // added after W x (one row: lora_terms)
  };
  void matmul_shared_input(std::span<const MatmulOut> outs, const float* x, int64_t n);

  const Model& model_;
  const ModelConfig& cfg_;
  ResidentWeights resident_;
  Isa isa_;
  const KernelSet& ks_;
  const OpsKernels& ops_;
  ThreadPool& pool_;
  Allocator& alloc_;
  ForwardOptions opts_;

  Buffer scratch_;  // one block, carved into the arrays below
  float* x_ = nullptr;      // [B, n_embd] residual stream
  float* xn_ = nullptr;     // [B, n_embd] normalised input
  float* q_ = nullptr;      // [B, q_dim]
  float* k_ = nullptr;      // [B, kv_dim]
  float* v_ = nullptr;      // [B, kv_dim]
  float* att_ = nullptr;    // [B, q_dim]
  float* gate_ = nullptr;   // [B, n_ff]
  float* up_ = nullptr;     // [B, n_ff]
  float* rope_ = nullptr;   // [B, rope_dim] (cos, sin) pairs
  Buffer head_scratch_;          // [n_out, n_vocab] logits of a multi-sequence step (grows, then stays)
  std::vector<int32_t> joined_;  // [B] a multi-sequence step's tokens, for the weight source
  std::vector<AttentionArgs> attn_args_;  // [sequences of the step] one layer's attention calls (reserved: B)
  float* attn_scratch_ = nullptr;
  void* mm_scratch_ = nullptr;
  static constexpr size_t kMaxSharedInput = 3;
  const LoraKernels& lk_;
  Buffer lora_scratch_;  // [B, max rank] the adapters' A x
  int64_t lora_rank_ = 0;
  bool any_lora_ = false;  // some sequence of the current step binds adapters
  // The step is one row of one sequence whose adapters (at most
  // kMaxFusedAdapters) are applied inside the products (lora_terms).
  bool fused_lora_ = false;
  static constexpr int kMaxFusedAdapters = 8;
  // [slot][adapter] the terms lora_terms hands out, their A x in lora_scratch_.
  LowRankTerm terms_[kMaxSharedInput][kMaxFusedAdapters];
  DeviceForward* device_ = nullptr;  // the engine's, when it runs on a device
};

}  // namespace ebb
