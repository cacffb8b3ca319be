// Hyper-parameters of a transformer, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace ebb {

class GgufFile;

enum class Arch { kLlama, kQwen2, kQwen3 };

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // "llama", "qwen2", "qwen3"
  std::string name;       // general.name
  int64_t n_layer = 0;
  int64_t n_embd = 0;      // model width
  int64_t n_head = 0;      // query heads
  int64_t n_head_kv = 0;   // key/value heads (GQA)
  int64_t head_dim = 0;    // key_length (defaults to n_embd / n_head)
  int64_t n_ff = 0;        // FFN hidden width
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;  // context_length the model was trained for
  int64_t rope_dim = 0;     // rotated dimensions per head
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / linear scaling factor
  // Per-frequency divisors of the RoPE angles ([rope_dim / 2]) from the
  // optional F32 tensor rope_freqs.weight (Llama 3.1+ frequency scaling);
  // empty: none.
  std::vector<float> rope_freq_factors;
  RopeStyle rope_style = RopeStyle::kNorm;
  float rms_eps = 1e-5f;
  bool qk_norm = false;      // per-head RMSNorm of Q and K (qwen3)
  bool tied_output = false;  // output head shares token_embd

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// Throws ebb::Error naming the file and the key when a required key is
// missing, has the wrong type, or holds an impossible value, and naming the
// architecture when it is not supported.
ModelConfig read_model_config(const GgufFile& file);

}  // namespace ebb
