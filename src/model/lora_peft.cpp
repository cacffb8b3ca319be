// PEFT LoRA checkpoints (Hugging Face peft's save_pretrained): a directory
// with adapter_config.json and adapter_model.safetensors, whose tensors are
// named after the PyTorch modules they adapt:
//   base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight  [r, n_in]
//   base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight  [n_out, r]
//   base_model.model.lm_head.lora_A.weight / .lora_B.weight
//   base_model.model.model.embed_tokens.lora_embedding_A            [r, n_vocab]
//   base_model.model.model.embed_tokens.lora_embedding_B            [n_embd, r]
// (shapes row-major, outermost first). Each is mapped to the GGUF base
// tensor it adapts (q_proj -> blk.3.attn_q.weight, ...) and to the rows
// make_lora_pair takes: lora_A.weight is [rank rows of n_in] and lora_B.weight
// [n_out rows of rank] already; lora_embedding_A is transposed to ebb's
// token_embd convention [n_vocab rows of rank].
//
// For llama, GGUF conversion permutes the rows of attn_q and attn_k (the
// rotary halves of each head interleaved), so the rows of those lora_B are
// permuted the same way here; qwen2/qwen3 keep HF's order.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "model/lora_internal.h"
#include "model/safetensors.h"
#include "platform/error.h"
#include "platform/hash.h"

namespace ebb {
namespace {

using Json = nlohmann::ordered_json;  // ordered: rank_pattern / alpha_pattern keys keep the file's order

constexpr uint64_t kMaxConfigBytes = 16ull << 20;
constexpr int64_t kMaxRank = 65536;

std::string shape_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// adapter_config.json, the fields that change what the adapter computes.
struct PeftConfig {
  int64_t r = 0;
  double alpha = 0;
  bool rslora = false;
  // target_modules: a list of names (a module is targeted when its name is
  // one of them or ends in "." + one), or one regular expression the whole
  // module name must match, or "all-linear" (every projection but lm_head).
  std::vector<std::string> targets;
  std::optional<std::regex> target_regex;
  std::string target_text;  // for messages
  bool all_linear = false;
  // rank_pattern and alpha_pattern in file order: a module's r (alpha) is
  // that of the first key naming it, as PEFT's get_pattern_key finds it.
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
};

std::string read_text_file(const std::string& path, const std::string& dir) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    throw Error(path + ": cannot open: " + std::strerror(errno) + " ('" + dir +
                "' is not a PEFT adapter directory: it holds adapter_config.json and adapter_model.safetensors)");
  }
  const std::streamoff size = in.tellg();
  if (size < 0) throw Error(path + ": cannot read its size");
  if (static_cast<uint64_t>(size) > kMaxConfigBytes) {
    throw Error(path + ": " + std::to_string(size) + " bytes, more than the " + std::to_string(kMaxConfigBytes) +
                " an adapter config may have");
  }
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) throw Error(path + ": cannot read: " + std::strerror(errno));
  return text;
}

// An integer rank field in 1..kMaxRank.
int64_t rank_value(const Json& v, const std::string& path, const std::string& field) {
  if (!v.is_number_integer()) {
    throw Error(path + ": " + field + " is " + std::string(v.type_name()) + ", expected an integer rank");
  }
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= static_cast<uint64_t>(kMaxRank)
                                          : v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxRank;
  if (!ok) throw Error(path + ": " + field + " is " + v.dump() + ", expected 1 to " + std::to_string(kMaxRank));
  return v.get<int64_t>();
}

double alpha_value(const Json& v, const std::string& path, const std::string& field) {
  if (!v.is_number()) throw Error(path + ": " + field + " is " + std::string(v.type_name()) + ", expected a number");
  const double a = v.get<double>();
  if (!std::isfinite(a)) throw Error(path + ": " + field + " is not a finite number");
  return a;
}

PeftConfig read_peft_config(const std::string& path, const std::string& dir) {
  const std::string text = read_text_file(path, dir);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(path + ": is " + std::string(j.type_name()) + ", expected a JSON object");
  auto field = [&](const char* name) -> const Json* {
    auto it = j.find(name);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  auto flag = [&](const char* name) {
    const Json* v = field(name);
    if (!v) return false;
    if (!v->is_boolean()) {
      throw Error(path + ": " + name + " is " + std::string(v->type_name()) + ", expected true or false");
    }
    return v->get<bool>();
  };
  PeftConfig c;
  if (const Json* t = field("peft_type")) {
    if (!t->is_string() || t->get<std::string>() != "LORA") {
      throw Error(path + ": peft_type is " + t->dump() + ", expected \"LORA\" (ebb reads LoRA adapters)");
    }
  }
  const Json* r = field("r");
  if (!r) throw Error(path + ": has no r (the adapter's rank)");
  c.r = rank_value(*r, path, "r");
  const Json* alpha = field("lora_alpha");
  if (!alpha) throw Error(path + ": has no lora_alpha");
  c.alpha = alpha_value(*alpha, path, "lora_alpha");
  c.rslora = flag("use_rslora");
  if (flag("use_dora")) throw Error(path + ": use_dora is true; ebb applies plain LoRA, not DoRA");
  if (flag("fan_in_fan_out")) {
    throw Error(path + ": fan_in_fan_out is true (weights stored [in, out], as for GPT-2's Conv1D); the models "
                "ebb runs store [out, in]");
  }
  if (const Json* b = field("base_model_name_or_path"); b && !b->is_string()) {
    throw Error(path + ": base_model_name_or_path is " + std::string(b->type_name()) + ", expected a string");
  }

  const Json* tm = field("target_modules");
  if (!tm) throw Error(path + ": has no target_modules");
  if (tm->is_string()) {
    c.target_text = tm->get<std::string>();
    if (c.target_text == "all-linear") {
      c.all_linear = true;
    } else {
      if (c.target_text.size() > 4096) throw Error(path + ": target_modules is a pattern of more than 4096 characters");
      try {
        c.target_regex.emplace(c.target_text, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        throw Error(path + ": target_modules '" + c.target_text + "' is not a valid regular expression: " + e.what());
      }
    }
  } else if (tm->is_array()) {
    for (const Json& t : *tm) {
      if (!t.is_string()) {
        throw Error(path + ": target_modules holds " + std::string(t.type_name()) + ", expected module names");
      }
      c.targets.push_back(t.get<std::string>());
      c.target_text += (c.target_text.empty() ? "" : ", ") + c.targets.back();
    }
  } else {
    throw Error(path + ": target_modules is " + std::string(tm->type_name()) +
                ", expected a list of module names or a pattern");
  }

  for (const char* pname : {"rank_pattern", "alpha_pattern"}) {
    const Json* p = field(pname);
    if (!p) continue;
    if (!p->is_object()) {
      throw Error(path + ": " + pname + " is " + std::string(p->type_name()) + ", expected an object");
    }
    const bool is_rank = pname[0] == 'r';
    for (const auto& [key, v] : p->items()) {
      const std::string f = std::string(pname) + "['" + key + "']";
      if (is_rank) {
        c.rank_pattern.emplace_back(key, rank_value(v, path, f));
      } else {
        c.alpha_pattern.emplace_back(key, alpha_value(v, path, f));
      }
    }
  }
  return c;
}

// A module is named by its key when its name is the key or ends in "." + key.
bool names_module(std::string_view module, std::string_view key) {
  return module == key || (module.size() > key.size() && ends_with(module, key) &&
                           module[module.size() - key.size() - 1] == '.');
}

bool targeted(const PeftConfig& c, const std::string& module, LoraTarget t) {
  if (c.all_linear) return t != LoraTarget::kOutput && t != LoraTarget::kTokenEmbd;
  if (c.target_regex) return std::regex_match(module, *c.target_regex);
  for (const std::string& k : c.targets)
    if (names_module(module, k)) return true;
  return false;
}

// A tensor's place: the module it adapts and which half it is.
struct PeftName {
  int layer = -1;
  LoraTarget target = LoraTarget::kQ;
  bool is_a = false;
  std::string module;  // "model.layers.3.self_attn.q_proj" (without base_model.model.)
};

// Parses a PEFT tensor name; returns "" or why it is not one ebb can use.
std::string parse_peft_name(std::string_view name, PeftName* out) {
  static constexpr std::string_view kPrefix = "base_model.model.";
  if (name.rfind(kPrefix, 0) == 0) name.remove_prefix(kPrefix.size());
  struct Suffix {
    std::string_view text;
    bool is_a, embedding;
  };
  static constexpr Suffix kSuffixes[] = {{".lora_A.weight", true, false},
                                         {".lora_B.weight", false, false},
                                         {".lora_embedding_A", true, true},
                                         {".lora_embedding_B", false, true}};
  const Suffix* suffix = nullptr;
  for (const Suffix& s : kSuffixes)
    if (ends_with(name, s.text)) suffix = &s;
  if (!suffix) {
    return "is not a LoRA tensor (its name must end in .lora_A.weight, .lora_B.weight, .lora_embedding_A or "
           ".lora_embedding_B; full weights such as modules_to_save, biases and DoRA magnitudes are not supported)";
  }
  name.remove_suffix(suffix->text.size());
  out->module = std::string(name);
  out->is_a = suffix->is_a;
  out->layer = -1;
  const bool embd = names_module(name, "embed_tokens");
  const bool head = names_module(name, "lm_head");
  if (embd || head) {
    if (embd != suffix->embedding) {
      return embd ? "adapts embed_tokens, whose LoRA halves are named lora_embedding_A and lora_embedding_B"
                  : "adapts lm_head, whose LoRA halves are named lora_A.weight and lora_B.weight";
    }
    out->target = embd ? LoraTarget::kTokenEmbd : LoraTarget::kOutput;
    return "";
  }
  if (suffix->embedding) return "is an embedding LoRA of a module that is not embed_tokens";
  // "[...]layers.N.self_attn.q_proj" and the like.
  size_t at = name.find("layers.");
  while (at != std::string_view::npos && at != 0 && name[at - 1] != '.') at = name.find("layers.", at + 1);
  const std::string_view kWhat =
      "is not in a module ebb can adapt (model.layers.N.self_attn.{q,k,v,o}_proj, "
      "model.layers.N.mlp.{gate,up,down}_proj, lm_head, model.embed_tokens)";
  if (at == std::string_view::npos) return std::string(kWhat);
  std::string_view rest = name.substr(at + 7);
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 6) return std::string(kWhat);
  int layer = 0;
  for (char ch : rest.substr(0, dot)) {
    if (ch < '0' || ch > '9') return std::string(kWhat);
    layer = layer * 10 + (ch - '0');
  }
  rest.remove_prefix(dot + 1);
  static constexpr std::pair<std::string_view, LoraTarget> kModules[] = {
      {"self_attn.q_proj", LoraTarget::kQ},  {"self_attn.k_proj", LoraTarget::kK}, {"self_attn.v_proj", LoraTarget::kV},
      {"self_attn.o_proj", LoraTarget::kO},  {"mlp.gate_proj", LoraTarget::kGate}, {"mlp.up_proj", LoraTarget::kUp},
      {"mlp.down_proj", LoraTarget::kDown}};
  for (const auto& [hf, t] : kModules) {
    if (rest == hf) {
      out->layer = layer;
      out->target = t;
      return "";
    }
  }
  return std::string(kWhat);
}

// llama.cpp's convert_hf_to_gguf.py `permute` of llama's q and k rows:
//   w.reshape(n_head, 2, rows / n_head / 2, ...).swapaxes(1, 2).reshape(w.shape)
// i.e. GGUF row h*hd + 2i + j holds HF row h*hd + j*(hd/2) + i (hd the head
// dimension, i < hd/2, j < 2). src, dst: [n_rows, row_bytes].
void permute_rows_llama(const uint8_t* src, uint8_t* dst, int64_t n_rows, size_t row_bytes, int64_t n_head) {
  const int64_t hd = n_rows / n_head;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t to = h * hd + 2 * i + j, from = h * hd + j * (hd / 2) + i;
        std::memcpy(dst + static_cast<size_t>(to) * row_bytes, src + static_cast<size_t>(from) * row_bytes, row_bytes);
      }
}

// [rows, cols] of esize-byte elements -> [cols, rows].
std::vector<uint8_t> transpose(const std::vector<uint8_t>& src, int64_t rows, int64_t cols, size_t esize) {
  std::vector<uint8_t> dst(src.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(&dst[static_cast<size_t>(c * rows + r) * esize], &src[static_cast<size_t>(r * cols + c) * esize],
                  esize);
  return dst;
}

}  // namespace

std::unique_ptr<LoraAdapter> load_lora_peft(const std::string& dir_in, const ModelConfig& config, Allocator& alloc) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string cfg_path = dir + "/adapter_config.json";
  const std::string st_path = dir + "/adapter_model.safetensors";
  const PeftConfig cfg = read_peft_config(cfg_path, dir);
  {
    std::ifstream probe(st_path);
    if (!probe && std::ifstream(dir + "/adapter_model.bin")) {
      throw Error(st_path + ": missing; the directory holds adapter_model.bin (a PyTorch pickle), which ebb does "
                  "not read: save the adapter with safe_serialization=True");
    }
  }
  const std::unique_ptr<SafetensorsFile> f = SafetensorsFile::open(st_path);

  auto ad = std::make_unique<LoraAdapter>();
  ad->source = dir_in;
  ad->format = "peft";
  ad->arch = config.arch_name;
  ad->alpha = static_cast<float>(cfg.alpha);

  struct Halves {
    const SafetensorsTensorInfo* a = nullptr;
    const SafetensorsTensorInfo* b = nullptr;
    std::string module;
  };
  // (layer, target), the globals (layer -1) last.
  std::map<std::pair<int, int>, Halves> pairs;
  for (const SafetensorsTensorInfo& t : f->tensors()) {
    PeftName pn;
    const std::string why = parse_peft_name(t.name, &pn);
    if (!why.empty()) throw Error(st_path + ": tensor '" + t.name + "' " + why);
    Halves& hv = pairs[{pn.layer < 0 ? INT32_MAX : pn.layer, static_cast<int>(pn.target)}];
    const SafetensorsTensorInfo*& slot = pn.is_a ? hv.a : hv.b;
    if (slot) {
      throw Error(st_path + ": tensors '" + slot->name + "' and '" + t.name + "' are the same half of the LoRA of '" +
                  lora_base_tensor_name(pn.layer, pn.target) + "'");
    }
    slot = &t;
    hv.module = pn.module;
  }
  if (pairs.empty()) throw Error(st_path + ": the adapter has no tensors");

  uint64_t h = kFnv1a64Offset;
  const float alpha_f = ad->alpha;
  const uint8_t rslora = cfg.rslora ? 1 : 0;
  h = fnv1a64(&alpha_f, sizeof alpha_f, h);
  h = fnv1a64(&rslora, sizeof rslora, h);
  for (const auto& [key, hv] : pairs) {
    const int layer = key.first == INT32_MAX ? -1 : key.first;
    const auto target = static_cast<LoraTarget>(key.second);
    const std::string base = lora_base_tensor_name(layer, target);
    const bool embd = target == LoraTarget::kTokenEmbd;
    const char* a_suffix = embd ? ".lora_embedding_A" : ".lora_A.weight";
    const char* b_suffix = embd ? ".lora_embedding_B" : ".lora_B.weight";
    if (!hv.a || !hv.b) {
      const SafetensorsTensorInfo* have = hv.a ? hv.a : hv.b;
      throw Error(st_path + ": the LoRA of '" + hv.module + "' has no " + (hv.a ? b_suffix + 1 : a_suffix + 1) +
                  " (the other half, '" + have->name + "', is there)");
    }
    if (layer >= config.n_layer) {
      throw Error(st_path + ": tensor '" + hv.a->name + "' is in layer " + std::to_string(layer) +
                  ", the model has " + std::to_string(config.n_layer));
    }
    if (!targeted(cfg, hv.module, target)) {
      throw Error(st_path + ": tensor '" + hv.a->name + "' adapts '" + hv.module + "', which " + cfg_path +
                  "'s target_modules (" + cfg.target_text + ") does not name");
    }
    // PEFT's rank_pattern / alpha_pattern: the first key naming the module.
    int64_t rank = cfg.r;
    double alpha = cfg.alpha;
    std::string rank_from = "r in " + cfg_path;
    for (const auto& [k, v] : cfg.rank_pattern) {
      if (!names_module(hv.module, k)) continue;
      rank = v;
      rank_from = "rank_pattern['" + k + "'] in " + cfg_path;
      break;
    }
    for (const auto& [k, v] : cfg.alpha_pattern) {
      if (!names_module(hv.module, k)) continue;
      alpha = v;
      break;
    }
    for (const SafetensorsTensorInfo* t : {hv.a, hv.b}) {
      if (!t->type) {
        throw Error(st_path + ": tensor '" + t->name + "' has dtype " + t->dtype +
                    " (adapters may be F32, F16 or BF16)");
      }
      if (t->shape.size() != 2) {
        throw Error(st_path + ": tensor '" + t->name + "' has shape " + shape_str(t->shape) +
                    ", expected 2 dimensions");
      }
    }
    int64_t n_in = 0, n_out = 0;
    lora_expected_shape(config, target, &n_in, &n_out);
    // A [r, n_in] (embedding: [r, n_vocab], n_in being n_vocab), B [n_out, r].
    const std::vector<int64_t> want_a = {rank, n_in}, want_b = {n_out, rank};
    for (const auto& [t, want] : {std::pair{hv.a, want_a}, std::pair{hv.b, want_b}}) {
      if (t->shape != want) {
        throw Error(st_path + ": tensor '" + t->name + "' has shape " + shape_str(t->shape) + ", expected " +
                    shape_str(want) + " for base tensor '" + base + "' (rank " + std::to_string(rank) + " from " +
                    rank_from + ")");
      }
    }
    std::vector<uint8_t> a_raw = f->read(*hv.a), b_raw = f->read(*hv.b);
    for (const SafetensorsTensorInfo* t : {hv.a, hv.b}) {
      h = fnv1a64(t->name.data(), t->name.size(), h);
      for (int64_t d : t->shape) h = fnv1a64(&d, sizeof d, h);
      const uint32_t ty = static_cast<uint32_t>(*t->type);
      h = fnv1a64(&ty, sizeof ty, h);
    }
    h = fnv1a64(a_raw.data(), a_raw.size(), h);
    h = fnv1a64(b_raw.data(), b_raw.size(), h);
    const float scale = static_cast<float>(cfg.rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                                      : alpha / static_cast<double>(rank));
    h = fnv1a64(&scale, sizeof scale, h);  // alpha_pattern changes it without changing a byte of the tensors

    const size_t a_esize = safetensors_dtype_size(hv.a->dtype), b_esize = safetensors_dtype_size(hv.b->dtype);
    if (embd) a_raw = transpose(a_raw, rank, n_in, a_esize);  // -> [n_vocab, rank]
    if (config.arch == Arch::kLlama && (target == LoraTarget::kQ || target == LoraTarget::kK)) {
      const int64_t heads = target == LoraTarget::kQ ? config.n_head : config.n_head_kv;
      if (heads < 1 || n_out % heads != 0 || (n_out / heads) % 2 != 0) {
        throw Error(st_path + ": tensor '" + hv.b->name + "': its " + std::to_string(n_out) +
                    " rows cannot be permuted as llama's GGUF conversion does (" + std::to_string(heads) +
                    " heads of an even dimension)");
      }
      std::vector<uint8_t> permuted(b_raw.size());
      permute_rows_llama(b_raw.data(), permuted.data(), n_out, static_cast<size_t>(rank) * b_esize, heads);
      b_raw = std::move(permuted);
    }
    ad->pairs.push_back(detail::make_lora_pair(layer, target, rank, n_in, n_out, scale, *hv.a->type, a_raw.data(),
                                               *hv.b->type, b_raw.data(), alloc));
    if (const int bad = detail::lora_first_nonfinite(ad->pairs.back())) {
      throw Error(st_path + ": tensor '" + (bad == 1 ? hv.a : hv.b)->name + "' holds a NaN or infinite value");
    }
  }
  ad->digest = h;
  ad->index(static_cast<int>(config.n_layer));
  return ad;
}

}  // namespace ebb
