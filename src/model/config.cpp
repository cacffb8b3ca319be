#include "model/config.h"

#include <cmath>

#include <filesystem>

#include "model/gguf.h"
#include "platform/error.h"

namespace ebb {
namespace {

std::string file_name(const GgufFile& f) { return std::filesystem::path(f.path()).filename().string(); }

int64_t required_int(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const auto v = f.get_int(key);
  if (!v) throw Error(file_name(f) + ": missing required metadata key '" + key + "'");
  if (*v < lo || *v > hi) {
    throw Error(file_name(f) + ": metadata '" + key + "' = " + std::to_string(*v) + " is outside [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return *v;
}

int64_t optional_int(const GgufFile& f, const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  if (!f.find(key)) return def;
  return required_int(f, key, lo, hi);
}

}  // namespace

ModelConfig read_model_config(const GgufFile& f) {
  ModelConfig c;
  const auto arch = f.get_string("general.architecture");
  if (!arch) throw Error(file_name(f) + ": missing required metadata key 'general.architecture'");
  c.arch_name = *arch;
  if (c.arch_name == "llama") {
    c.arch = Arch::kLlama;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::kQwen2;
  } else if (c.arch_name == "qwen3") {
    c.arch = Arch::kQwen3;
  } else {
    throw Error(file_name(f) + ": unsupported architecture '" + c.arch_name +
                "' (supported: llama, qwen2, qwen3)");
  }
  c.name = f.get_string("general.name").value_or(c.arch_name);
  const std::string p = c.arch_name + ".";
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  c.n_layer = required_int(f, p + "block_count", 1, 4096);
  c.n_embd = required_int(f, p + "embedding_length", 1, kMaxDim);
  c.n_head = required_int(f, p + "attention.head_count", 1, 4096);
  c.n_head_kv = optional_int(f, p + "attention.head_count_kv", c.n_head, 1, c.n_head);
  if (c.n_head % c.n_head_kv != 0) {
    throw Error(file_name(f) + ": attention.head_count " + std::to_string(c.n_head) +
                " is not a multiple of head_count_kv " + std::to_string(c.n_head_kv));
  }
  c.head_dim = optional_int(f, p + "attention.key_length", c.n_embd / c.n_head, 1, 4096);
  const int64_t v_len = optional_int(f, p + "attention.value_length", c.head_dim, 1, 4096);
  if (v_len != c.head_dim) {
    throw Error(file_name(f) + ": attention.value_length " + std::to_string(v_len) +
                " differs from key_length " + std::to_string(c.head_dim) + " (not supported)");
  }
  if (c.head_dim % 2 != 0) throw Error(file_name(f) + ": head dimension must be even for RoPE");
  c.n_ff = required_int(f, p + "feed_forward_length", 1, kMaxDim);
  c.n_ctx_train = optional_int(f, p + "context_length", 2048, 1, int64_t{1} << 24);
  c.rope_dim = optional_int(f, p + "rope.dimension_count", c.head_dim, 2, c.head_dim);
  if (c.rope_dim % 2 != 0) throw Error(file_name(f) + ": rope.dimension_count must be even");
  c.rope_base = static_cast<float>(f.get_float(p + "rope.freq_base").value_or(c.arch == Arch::kLlama ? 10000.0 : 1000000.0));
  if (!(c.rope_base > 1.0f)) throw Error(file_name(f) + ": rope.freq_base must be > 1");
  // Linear RoPE scaling: either rope.scaling.factor with type "linear", or
  // the older rope.scale_linear key.
  double scale = f.get_float(p + "rope.scale_linear").value_or(1.0);
  if (auto type = f.get_string(p + "rope.scaling.type")) {
    if (*type == "linear") {
      scale = f.get_float(p + "rope.scaling.factor").value_or(1.0);
    } else if (*type != "none") {
      throw Error(file_name(f) + ": unsupported rope.scaling.type '" + *type + "' (supported: none, linear)");
    }
  }
  if (!(scale >= 1.0 && scale < 1e6)) throw Error(file_name(f) + ": RoPE scaling factor must be >= 1");
  c.rope_freq_scale = static_cast<float>(1.0 / scale);
  c.rope_style = c.arch == Arch::kLlama ? RopeStyle::kNorm : RopeStyle::kNeox;
  if (const GgufTensorInfo* t = f.find_tensor("rope_freqs.weight")) {
    const std::string where = file_name(f) + ": tensor 'rope_freqs.weight'";
    if (t->type != DType::kF32 || t->dims != std::vector<int64_t>{c.rope_dim / 2}) {
      throw Error(where + " must be F32 [" + std::to_string(c.rope_dim / 2) + "] (rope_dim / 2)");
    }
    c.rope_freq_factors.resize(static_cast<size_t>(c.rope_dim / 2));
    f.read(t->file_offset, c.rope_freq_factors.data(), c.rope_freq_factors.size() * sizeof(float));
    for (float v : c.rope_freq_factors) {
      if (!(std::isfinite(v) && v > 0.0f)) throw Error(where + " holds " + std::to_string(v) + "; factors must be > 0");
    }
  }
  c.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f)) throw Error(file_name(f) + ": layer_norm_rms_epsilon must be in (0, 1)");
  c.qk_norm = c.arch == Arch::kQwen3;

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) throw Error(file_name(f) + ": missing tensor 'token_embd.weight'");
  if (embd->dims.size() != 2 || embd->dims[0] != c.n_embd) {
    throw Error(file_name(f) + ": tensor 'token_embd.weight' must be [" + std::to_string(c.n_embd) +
                ", n_vocab]");
  }
  c.n_vocab = embd->dims[1];
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace ebb
