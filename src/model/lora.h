// LoRA adapters (model layer): the low-rank pairs an adapter adds to a base
// model's projections, read from llama.cpp's GGUF adapter format or from a
// PEFT checkpoint directory. Adapter files are hostile input, as model files
// are (STYLE habit 10): every count, shape and offset is checked, and an
// error names the file, the tensor, and the expected and found shapes.
//
// The delta an adapter applies to a projection W (y = W x) at user scale u:
//   y += u · k · B (A x),   k = alpha / r  (llama.cpp: alpha absent or 0 → k = 1)
// with PEFT's lora_alpha / r, or lora_alpha / sqrt(r) under use_rslora,
// folded into the same k. A and B are kept in F16 when neither is stored as
// F32 and every value of both is exactly an F16 (always for F16 files; BF16
// and Q8_0 files when their values happen to fit), else in F32: F16 halves the bytes each token reads
// (the adapter's share of decode time), and widening it is exact, so it gives
// the same products as F32 would. token_embd pairs (one row read per token)
// stay F32. B is transposed, in allocations of their own
// (MemCategory::kAdapter), so base weights are never touched. Pairs made in
// memory (init_lora, training) are F32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.h"
#include "model/config.h"
#include "platform/allocator.h"
#include "platform/error.h"

namespace ebb {

// What a pair adapts. The layer targets come first.
enum class LoraTarget : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown, kOutput, kTokenEmbd };
inline constexpr int kLoraLayerTargets = 7;  // kQ .. kDown
inline constexpr int kLoraTargets = 9;

// "q,k,v,o,gate,up,down" (any subset, comma-separated) to targets; throws
// ebb::Error naming a word that is not one of them.
std::vector<LoraTarget> parse_lora_targets(std::string_view csv);

// The GGUF name part: "attn_q", "attn_k", "attn_v", "attn_output",
// "ffn_gate", "ffn_up", "ffn_down", "output", "token_embd".
std::string_view lora_target_name(LoraTarget t);
// The base tensor's GGUF name: "blk.3.attn_q.weight", "output.weight", ...
std::string lora_base_tensor_name(int layer, LoraTarget t);

// One adapted base tensor: y[n_out] += scale · B (A x[n_in]).
// For kTokenEmbd (llama.cpp's convention: A and B swapped, A indexed by
// token) `a` is [n_in = n_vocab, rank] and token id t's row is the
// intermediate A x directly; bt is [rank, n_embd] as for the others.
struct LoraPair {
  int layer = -1;  // -1 for kOutput and kTokenEmbd
  LoraTarget target = LoraTarget::kQ;
  int64_t rank = 0;
  int64_t n_in = 0;   // the base tensor's reduction dimension (ne0)
  int64_t n_out = 0;  // the base tensor's output features (ne1)
  float scale = 1.0f;  // k: alpha / rank (1 when the file has no alpha)
  DType dtype = DType::kF32;  // of a and bt: kF32, or kF16 (IEEE half bits)
  Buffer a;   // [rank, n_in] of dtype
  Buffer bt;  // [rank, n_out] of dtype: B transposed
  // The tensors of an F32 pair (an F16 pair is a bug here: use a_f16, or
  // a_at / widen_lora_pair where F32 is needed).
  const float* a_data() const {
    EBB_CHECK_MSG(dtype == DType::kF32, "LoraPair::a_data on an F16 pair");
    return a.as<const float>();
  }
  const float* bt_data() const {
    EBB_CHECK_MSG(dtype == DType::kF32, "LoraPair::bt_data on an F16 pair");
    return bt.as<const float>();
  }
  // The tensors of an F16 pair.
  const uint16_t* a_f16() const {
    EBB_CHECK_MSG(dtype == DType::kF16, "LoraPair::a_f16 on an F32 pair");
    return a.as<const uint16_t>();
  }
  const uint16_t* bt_f16() const {
    EBB_CHECK_MSG(dtype == DType::kF16, "LoraPair::bt_f16 on an F32 pair");
    return bt.as<const uint16_t>();
  }
  // Element i of a / bt as F32, whatever the dtype (slow: for tests, writers).
  float a_at(int64_t i) const;
  float bt_at(int64_t i) const;
};

// An F32 copy of p (F16 widened exactly) in a new allocation of `cat`: what
// code that updates a pair (training) starts from.
LoraPair widen_lora_pair(const LoraPair& p, Allocator& alloc, MemCategory cat = MemCategory::kAdapter);

class LoraAdapter {
 public:
  LoraAdapter() = default;
  LoraAdapter(const LoraAdapter&) = delete;
  LoraAdapter& operator=(const LoraAdapter&) = delete;

  std::string source;   // the file or directory it was read from
  std::string format;   // "gguf" or "peft"
  std::string arch;     // general.architecture (PEFT: the base model's)
  float alpha = 0;      // adapter.lora.alpha (PEFT: lora_alpha); 0: absent
  // FNV-1a over every tensor's name, shape, type and stored bytes, and alpha:
  // any byte change is another digest (so another adapter version).
  uint64_t digest = 0;
  std::vector<LoraPair> pairs;

  // The pair adapting (layer, target), or nullptr. layer is ignored for
  // kOutput and kTokenEmbd. Call index() after filling pairs.
  const LoraPair* find(int layer, LoraTarget t) const {
    const size_t i = slot(layer, t);
    return i < index_.size() && index_[i] >= 0 ? &pairs[static_cast<size_t>(index_[i])] : nullptr;
  }
  // Builds the look-up table of find() for a model of n_layers; throws
  // ebb::Error naming the tensor when two pairs adapt the same one.
  void index(int n_layers);
  // Bytes of A and B in memory (F32 or F16).
  uint64_t bytes() const;
  int64_t max_rank() const;
  // Which targets the adapter has ("q k v o gate up down"), for listings.
  std::string targets_summary() const;

 private:
  size_t slot(int layer, LoraTarget t) const {
    const int tt = static_cast<int>(t);
    if (tt >= kLoraLayerTargets) return static_cast<size_t>(n_layers_) * kLoraLayerTargets + (tt - kLoraLayerTargets);
    if (layer < 0 || layer >= n_layers_) return index_.size();
    return static_cast<size_t>(layer) * kLoraLayerTargets + static_cast<size_t>(tt);
  }
  int n_layers_ = 0;
  std::vector<int32_t> index_;
};

// Reads an adapter for the model described by `config`: a GGUF file, or a
// directory holding a PEFT checkpoint (adapter_config.json and
// adapter_model.safetensors). Throws ebb::Error naming the file, the tensor
// and what is wrong when the adapter does not fit the model.
std::unique_ptr<LoraAdapter> load_lora(const std::string& path, const ModelConfig& config, Allocator& alloc);
std::unique_ptr<LoraAdapter> load_lora_gguf(const std::string& path, const ModelConfig& config, Allocator& alloc);
std::unique_ptr<LoraAdapter> load_lora_peft(const std::string& dir, const ModelConfig& config, Allocator& alloc);

// Writes an adapter in llama.cpp's GGUF adapter format (F32 tensors,
// adapter.lora.alpha chosen so that alpha / rank is each pair's scale; a
// file whose pairs have different scale·rank products cannot be written and
// throws, and so does scale 0, which the format cannot hold: alpha 0 means
// scale 1 there). `type`: F32 or F16 tensors. Throws ebb::Error naming the
// path on an I/O failure.
void write_lora_gguf(const LoraAdapter& adapter, const std::string& path, DType type = DType::kF32);

// Random A (normal, std 1/sqrt(n_in)) and B (normal, std `b_std`; 0 gives
// LoRA's usual B = 0 start) for the given targets of every layer: the
// adapter `ebb adapter synth` writes and training starts from.
struct LoraInitOptions {
  int64_t rank = 8;
  float alpha = 16;
  std::vector<LoraTarget> targets;  // empty: q k v o gate up down
  float b_std = 0.0f;
  uint64_t seed = 1;
};
std::unique_ptr<LoraAdapter> init_lora(const ModelConfig& config, const LoraInitOptions& opts, Allocator& alloc);

// The (n_in, n_out) a model expects for a target (n_in of kTokenEmbd is
// n_vocab, its n_out n_embd).
void lora_expected_shape(const ModelConfig& config, LoraTarget t, int64_t* n_in, int64_t* n_out);

}  // namespace ebb
