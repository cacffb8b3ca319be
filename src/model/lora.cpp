#include "model/lora.h"

#include <sys/stat.h>

#include <algorithm>

#include "platform/error.h"
#include "platform/fp16.h"

namespace ebb {

std::string_view lora_target_name(LoraTarget t) {
  switch (t) {
    case LoraTarget::kQ: return "attn_q";
    case LoraTarget::kK: return "attn_k";
    case LoraTarget::kV: return "attn_v";
    case LoraTarget::kO: return "attn_output";
    case LoraTarget::kGate: return "ffn_gate";
    case LoraTarget::kUp: return "ffn_up";
    case LoraTarget::kDown: return "ffn_down";
    case LoraTarget::kOutput: return "output";
    case LoraTarget::kTokenEmbd: return "token_embd";
  }
  return "?";
}

std::vector<LoraTarget> parse_lora_targets(std::string_view csv) {
  static constexpr std::pair<std::string_view, LoraTarget> kNames[] = {
      {"q", LoraTarget::kQ},       {"k", LoraTarget::kK},   {"v", LoraTarget::kV},       {"o", LoraTarget::kO},
      {"gate", LoraTarget::kGate}, {"up", LoraTarget::kUp}, {"down", LoraTarget::kDown}};
  std::vector<LoraTarget> out;
  for (size_t i = 0; i <= csv.size();) {
    const size_t comma = std::min(csv.find(',', i), csv.size());
    const std::string_view w = csv.substr(i, comma - i);
    const auto* it = std::find_if(std::begin(kNames), std::end(kNames), [&](const auto& n) { return n.first == w; });
    if (it == std::end(kNames)) {
      throw Error("'" + std::string(w) + "' is not a LoRA target (q, k, v, o, gate, up, down)");
    }
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
    i = comma + 1;
  }
  return out;
}

std::string lora_base_tensor_name(int layer, LoraTarget t) {
  const std::string part(lora_target_name(t));
  if (static_cast<int>(t) >= kLoraLayerTargets) return part + ".weight";
  return "blk." + std::to_string(layer) + "." + part + ".weight";
}

void lora_expected_shape(const ModelConfig& c, LoraTarget t, int64_t* n_in, int64_t* n_out) {
  switch (t) {
    case LoraTarget::kQ: *n_in = c.n_embd, *n_out = c.q_dim(); return;
    case LoraTarget::kK:
    case LoraTarget::kV: *n_in = c.n_embd, *n_out = c.kv_dim(); return;
    case LoraTarget::kO: *n_in = c.q_dim(), *n_out = c.n_embd; return;
    case LoraTarget::kGate:
    case LoraTarget::kUp: *n_in = c.n_embd, *n_out = c.n_ff; return;
    case LoraTarget::kDown: *n_in = c.n_ff, *n_out = c.n_embd; return;
    case LoraTarget::kOutput: *n_in = c.n_embd, *n_out = c.n_vocab; return;
    case LoraTarget::kTokenEmbd: *n_in = c.n_vocab, *n_out = c.n_embd; return;
  }
}

void LoraAdapter::index(int n_layers) {
  n_layers_ = n_layers;
  index_.assign(static_cast<size_t>(n_layers) * kLoraLayerTargets + (kLoraTargets - kLoraLayerTargets), -1);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const LoraPair& p = pairs[i];
    const size_t s = slot(p.layer, p.target);
    if (s >= index_.size()) {
      throw Error(source + ": tensor '" + lora_base_tensor_name(p.layer, p.target) + "': layer " +
                  std::to_string(p.layer) + " is outside the model's " + std::to_string(n_layers) + " layers");
    }
    if (index_[s] >= 0) {
      throw Error(source + ": tensor '" + lora_base_tensor_name(p.layer, p.target) + "' is adapted twice");
    }
    index_[s] = static_cast<int32_t>(i);
  }
}

float LoraPair::a_at(int64_t i) const {
  return dtype == DType::kF16 ? fp16_to_fp32(a.as<const uint16_t>()[i]) : a.as<const float>()[i];
}
float LoraPair::bt_at(int64_t i) const {
  return dtype == DType::kF16 ? fp16_to_fp32(bt.as<const uint16_t>()[i]) : bt.as<const float>()[i];
}

LoraPair widen_lora_pair(const LoraPair& p, Allocator& alloc, MemCategory cat) {
  LoraPair q;
  q.layer = p.layer;
  q.target = p.target;
  q.rank = p.rank;
  q.n_in = p.n_in;
  q.n_out = p.n_out;
  q.scale = p.scale;
  q.dtype = DType::kF32;
  const int64_t na = p.rank * p.n_in, nb = p.rank * p.n_out;
  q.a = alloc.allocate(static_cast<size_t>(na) * sizeof(float), cat);
  q.bt = alloc.allocate(static_cast<size_t>(nb) * sizeof(float), cat);
  float* a = q.a.as<float>();
  float* bt = q.bt.as<float>();
  for (int64_t i = 0; i < na; ++i) a[i] = p.a_at(i);
  for (int64_t i = 0; i < nb; ++i) bt[i] = p.bt_at(i);
  return q;
}

uint64_t LoraAdapter::bytes() const {
  uint64_t b = 0;
  for (const LoraPair& p : pairs) b += p.a.size() + p.bt.size();
  return b;
}

int64_t LoraAdapter::max_rank() const {
  int64_t r = 0;
  for (const LoraPair& p : pairs) r = std::max(r, p.rank);
  return r;
}

std::string LoraAdapter::targets_summary() const {
  static constexpr const char* kShort[kLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down", "output",
                                                       "token_embd"};
  bool seen[kLoraTargets] = {};
  for (const LoraPair& p : pairs) seen[static_cast<int>(p.target)] = true;
  std::string s;
  for (int t = 0; t < kLoraTargets; ++t) {
    if (!seen[t]) continue;
    if (!s.empty()) s += ' ';
    s += kShort[t];
  }
  return s;
}

std::unique_ptr<LoraAdapter> load_lora(const std::string& path, const ModelConfig& config, Allocator& alloc) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error("adapter '" + path + "' does not exist");
  if (S_ISDIR(st.st_mode)) return load_lora_peft(path, config, alloc);
  if (!S_ISREG(st.st_mode)) throw Error("adapter '" + path + "' is neither a GGUF file nor a PEFT directory");
  return load_lora_gguf(path, config, alloc);
}

}  // namespace ebb
