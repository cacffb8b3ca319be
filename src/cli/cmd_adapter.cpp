// ebb adapter inspect|convert: LoRA adapters in llama.cpp's GGUF format or
// as PEFT checkpoint directories.
//
//   inspect FILE|DIR [-m BASE.gguf]   what the adapter holds, as stored (each
//       adapted tensor with its rank, types, shapes and bytes), then, once
//       loaded, its digest and scales. With -m it is loaded against that
//       model (every shape checked); without, a GGUF adapter is loaded
//       against the shapes it stores itself (its halves checked against each
//       other), and a PEFT one is only listed (its architecture, the llama
//       q/k row order and the digest need the base model).
//   convert PEFT_DIR -m BASE.gguf -o OUT.gguf   a PEFT checkpoint to
//       llama.cpp's GGUF adapter format (F32), which llama.cpp loads too.
//   synth -m BASE.gguf -o OUT.gguf [--rank R] [--type f16|f32] ...   an
//       adapter with random weights (benchmarks, tests).
#include <sys/stat.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "cli/options.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/lora_internal.h"
#include "model/safetensors.h"
#include "platform/allocator.h"
#include "platform/error.h"

namespace ebb::cli {
namespace {

struct InspectArgs {
  std::string path;
  std::string base;
};

struct SynthArgs {
  std::string base;
  std::string out;
  int64_t rank = 16;
  float alpha = 32;
  std::string targets = "q,k,v,o,gate,up,down";
  std::string type = "f16";
  float b_std = 0.02f;
  uint64_t seed = 1;
};

struct ConvertArgs {
  std::string dir;
  std::string base;
  std::string out;
};

// One adapted tensor as the file stores it: its two halves.
struct StoredPair {
  std::string name;        // GGUF: the base tensor; PEFT: the module
  std::string a_shape, b_shape;  // "" for a missing half
  std::set<std::string> types;
  int64_t rank = 0;        // 0: unknown (a half is missing)
  uint64_t bytes = 0;      // stored
  uint64_t elements = 0;
  int tensors = 0;
};

struct Stored {
  std::vector<StoredPair> pairs;  // in file order
  std::vector<std::string> header;  // "key: value" lines
};

bool is_directory(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error("adapter '" + path + "' does not exist");
  if (S_ISDIR(st.st_mode)) return true;
  if (!S_ISREG(st.st_mode)) throw Error("adapter '" + path + "' is neither a GGUF file nor a PEFT directory");
  return false;
}

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? " x " : "") + std::to_string(d[i]);
  return s;
}

StoredPair& pair_named(Stored& s, std::map<std::string, size_t>& index, const std::string& name) {
  auto [it, fresh] = index.emplace(name, s.pairs.size());
  if (fresh) {
    s.pairs.emplace_back();
    s.pairs.back().name = name;
  }
  return s.pairs[it->second];
}

// GGUF: NAME.lora_a (ggml [n_in, r]; token_embd [r, n_vocab]) and NAME.lora_b
// ([r, n_out]); shapes printed ne0 first, as `ebb inspect` does.
Stored stored_gguf(const GgufFile& f) {
  Stored s;
  s.header.push_back("format: gguf (llama.cpp LoRA adapter)");
  s.header.push_back("architecture: " + f.get_string("general.architecture").value_or("(not set)"));
  const std::optional<double> alpha = f.get_float("adapter.lora.alpha");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", alpha.value_or(0));
  s.header.push_back(std::string("alpha: ") + (alpha && *alpha != 0 ? buf : "absent or 0 (scale 1)"));
  std::map<std::string, size_t> index;
  for (const GgufTensorInfo& t : f.tensors()) {
    const bool a = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_a") == 0;
    const bool b = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_b") == 0;
    StoredPair& p = pair_named(s, index, a || b ? t.name.substr(0, t.name.size() - 7) : t.name);
    (a ? p.a_shape : p.b_shape) = dims_str(t.dims);
    if (b && !t.dims.empty()) p.rank = t.dims[0];
    p.types.insert(std::string(dtype_name(t.type)));
    p.bytes += t.n_bytes;
    p.elements += t.n_elements;
    ++p.tensors;
  }
  for (StoredPair& p : s.pairs)
    if (p.a_shape.empty()) p.rank = 0;
  return s;
}

// PEFT: MODULE.lora_A.weight [r, n_in] and MODULE.lora_B.weight [n_out, r]
// (embeddings: lora_embedding_A / _B), shapes outermost first as stored.
Stored stored_peft(const std::string& dir, const SafetensorsFile& f) {
  Stored s;
  s.header.push_back("format: peft (Hugging Face PEFT checkpoint)");
  const std::string cfg_path = dir + "/adapter_config.json";
  std::ifstream in(cfg_path);
  if (!in) throw Error(cfg_path + ": cannot open (a PEFT adapter directory holds adapter_config.json)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cfg_path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(cfg_path + ": expected a JSON object");
  auto show = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end()) return std::string("(not set)");
    return it->is_string() ? it->get<std::string>() : it->dump();
  };
  s.header.push_back("base model (adapter_config.json): " + show("base_model_name_or_path"));
  s.header.push_back("r: " + show("r") + ", lora_alpha: " + show("lora_alpha") + ", use_rslora: " + show("use_rslora"));
  s.header.push_back("target_modules: " + show("target_modules"));
  for (const char* k : {"rank_pattern", "alpha_pattern"}) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null() && !it->empty()) s.header.push_back(std::string(k) + ": " + it->dump());
  }
  std::map<std::string, size_t> index;
  for (const SafetensorsTensorInfo& t : f.tensors()) {
    std::string module = t.name;
    int half = -1;  // 0: A, 1: B
    for (const auto& [suffix, h] : {std::pair{".lora_A.weight", 0}, {".lora_B.weight", 1}, {".lora_embedding_A", 0},
                                    {".lora_embedding_B", 1}}) {
      const std::string sfx = suffix;
      if (module.size() > sfx.size() && module.compare(module.size() - sfx.size(), sfx.size(), sfx) == 0) {
        module.resize(module.size() - sfx.size());
        half = h;
        break;
      }
    }
    StoredPair& p = pair_named(s, index, module);
    std::string shape = "[" + dims_str(t.shape) + "]";
    for (size_t at; (at = shape.find(" x ")) != std::string::npos;) shape.replace(at, 3, ", ");
    (half == 0 ? p.a_shape : p.b_shape) = shape;
    if (half == 0 && !t.shape.empty()) p.rank = t.shape[0];
    p.types.insert(t.dtype);
    p.bytes += t.n_bytes;
    p.elements += t.n_elements;
    ++p.tensors;
  }
  for (StoredPair& p : s.pairs)
    if (p.b_shape.empty()) p.rank = 0;
  return s;
}

// The model a GGUF adapter fits, from the shapes it stores (for inspecting
// without a base model): each dimension from the first pair that shows it;
// a pair that disagrees then fails to load, naming both shapes.
ModelConfig config_from_gguf_adapter(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture").value_or("");
  int64_t q = 0, kv = 0;
  auto set = [](int64_t& field, int64_t v) {
    if (field == 0) field = v;
  };
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name.size() <= 7 || t.name.compare(t.name.size() - 7, 7, ".lora_b") != 0 || t.dims.size() != 2) continue;
    const std::string base = t.name.substr(0, t.name.size() - 7);
    const GgufTensorInfo* a = f.find_tensor(base + ".lora_a");
    int layer = -1;
    LoraTarget target{};
    if (!a || a->dims.size() != 2 || !detail::parse_lora_base_name(base, &layer, &target)) continue;
    const bool embd = target == LoraTarget::kTokenEmbd;
    const int64_t n_in = embd ? a->dims[1] : a->dims[0], n_out = t.dims[1];
    c.n_layer = std::max<int64_t>(c.n_layer, layer + 1);
    switch (target) {
      case LoraTarget::kQ: set(c.n_embd, n_in), set(q, n_out); break;
      case LoraTarget::kK:
      case LoraTarget::kV: set(c.n_embd, n_in), set(kv, n_out); break;
      case LoraTarget::kO: set(q, n_in), set(c.n_embd, n_out); break;
      case LoraTarget::kGate:
      case LoraTarget::kUp: set(c.n_embd, n_in), set(c.n_ff, n_out); break;
      case LoraTarget::kDown: set(c.n_ff, n_in), set(c.n_embd, n_out); break;
      case LoraTarget::kOutput: set(c.n_embd, n_in), set(c.n_vocab, n_out); break;
      case LoraTarget::kTokenEmbd: set(c.n_vocab, n_in), set(c.n_embd, n_out); break;
    }
  }
  // q_dim = n_head · head_dim and kv_dim = n_head_kv · head_dim: any common
  // divisor serves as head_dim for checking shapes.
  c.head_dim = q && kv ? std::gcd(q, kv) : std::max<int64_t>(std::max(q, kv), 1);
  c.n_head = std::max<int64_t>(q / c.head_dim, 1);
  c.n_head_kv = std::max<int64_t>(kv / c.head_dim, 1);
  return c;
}

std::string ranks_str(const std::set<int64_t>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  bool first = true;
  for (int64_t r : ranks) s += (first ? "" : ", ") + std::to_string(r), first = false;
  return s;
}

int inspect(const InspectArgs& a) {
  const bool peft = is_directory(a.path);
  std::string dir = a.path;
  while (peft && dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<SafetensorsFile> st;
  Stored s;
  if (peft) {
    st = SafetensorsFile::open(dir + "/adapter_model.safetensors");
    s = stored_peft(dir, *st);
  } else {
    gguf = GgufFile::open(a.path);
    s = stored_gguf(*gguf);
  }

  std::printf("adapter: %s\n", a.path.c_str());
  for (const std::string& line : s.header) std::printf("%s\n", line.c_str());
  std::printf("\ntargets (as stored%s):\n", peft ? ", shapes outermost first" : ", shapes ne0 first");
  std::set<int64_t> ranks;
  uint64_t stored = 0, elements = 0;
  int tensors = 0;
  int width = 20;
  for (const StoredPair& p : s.pairs) width = std::max(width, static_cast<int>(p.name.size()));
  for (const StoredPair& p : s.pairs) {
    std::string types;
    for (const std::string& t : p.types) types += (types.empty() ? "" : "/") + t;
    const std::string rank = p.rank > 0 ? "rank " + std::to_string(p.rank) : "rank ?";
    const std::string shapes = "A " + (p.a_shape.empty() ? "(missing)" : p.a_shape) + "  B " +
                               (p.b_shape.empty() ? "(missing)" : p.b_shape);
    std::printf("  %-*s  %-9s %-5s %-28s %10s\n", width, p.name.c_str(), rank.c_str(), types.c_str(), shapes.c_str(),
                format_bytes(p.bytes).c_str());
    if (p.rank > 0) ranks.insert(p.rank);
    stored += p.bytes;
    elements += p.elements;
    tensors += p.tensors;
  }
  std::printf("\ntotal: %s, %zu targets (%d tensors), %s stored, %s in memory (F32)\n", ranks_str(ranks).c_str(),
              s.pairs.size(), tensors, format_bytes(stored).c_str(), format_bytes(elements * 4).c_str());
  std::fflush(stdout);

  // Loaded: checked against the base model, or (GGUF) against itself.
  ModelConfig config;
  std::string against;
  if (!a.base.empty()) {
    config = read_model_config(*GgufFile::open(a.base));
    against = a.base + " (" + config.arch_name + ", " + std::to_string(config.n_layer) + " layers)";
  } else if (!peft) {
    config = config_from_gguf_adapter(*gguf);
    against = "its own shapes (no base model given: -m BASE.gguf checks it against a model)";
  } else {
    std::printf("\nno base model given: the architecture, llama's q/k row order and the digest need one "
                "(-m BASE.gguf)\n");
    return 0;
  }
  Ledger ledger;
  Allocator alloc(&ledger);
  const std::unique_ptr<LoraAdapter> ad = load_lora(a.path, config, alloc);
  std::set<float> scales;
  for (const LoraPair& p : ad->pairs) scales.insert(p.scale);
  std::string scale_str;
  for (float k : scales) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", k);
    scale_str += (scale_str.empty() ? "" : ", ") + std::string(buf);
  }
  std::printf("\nchecked against %s\n", against.c_str());
  if (peft) std::printf("architecture: %s (the base model's)\n", ad->arch.c_str());
  std::printf("digest: %016" PRIx64 "\nscale%s: %s (%zu pairs: %s)\n", ad->digest, scales.size() == 1 ? "" : "s",
              scale_str.c_str(), ad->pairs.size(), ad->targets_summary().c_str());
  return 0;
}

int convert(const ConvertArgs& a) {
  if (!is_directory(a.dir)) {
    throw Error("'" + a.dir + "' is not a directory: convert reads a PEFT checkpoint (adapter_config.json and "
                "adapter_model.safetensors); a GGUF adapter needs no conversion");
  }
  const ModelConfig config = read_model_config(*GgufFile::open(a.base));
  Ledger ledger;
  Allocator alloc(&ledger);
  const std::unique_ptr<LoraAdapter> ad = load_lora_peft(a.dir, config, alloc);
  for (const LoraPair& p : ad->pairs) {
    if (p.scale == 0) {
      throw Error("cannot convert '" + a.dir + "': '" + lora_base_tensor_name(p.layer, p.target) +
                  "' has scale 0 (lora_alpha 0), which llama.cpp's format cannot hold (alpha 0 there means scale 1)");
    }
  }
  write_lora_gguf(*ad, a.out);
  std::printf("wrote %s: %zu pairs (%s), max rank %lld, scale %g, %s, for %s (%s)\n", a.out.c_str(), ad->pairs.size(),
              ad->targets_summary().c_str(), static_cast<long long>(ad->max_rank()), ad->pairs[0].scale,
              format_bytes(ad->bytes()).c_str(), a.base.c_str(), config.arch_name.c_str());
  return 0;
}

int synth(const SynthArgs& a) {
  const ModelConfig config = read_model_config(*GgufFile::open(a.base));
  LoraInitOptions o;
  o.rank = a.rank;
  o.alpha = a.alpha;
  o.b_std = a.b_std;
  o.seed = a.seed;
  try {
    o.targets = parse_lora_targets(a.targets);
  } catch (const Error& e) {
    throw UsageError(std::string("--targets: ") + e.what());
  }
  DType type;
  if (a.type == "f16") {
    type = DType::kF16;
  } else if (a.type == "f32") {
    type = DType::kF32;
  } else {
    throw UsageError("--type '" + a.type + "' is not one of f16, f32");
  }
  Ledger ledger;
  Allocator alloc(&ledger);
  const std::unique_ptr<LoraAdapter> ad = init_lora(config, o, alloc);
  ad->arch = config.arch_name;
  write_lora_gguf(*ad, a.out, type);
  std::printf("wrote %s: %zu pairs (%s), rank %lld, alpha %g, %s, for %s (%s): random weights\n", a.out.c_str(),
              ad->pairs.size(), ad->targets_summary().c_str(), static_cast<long long>(a.rank), a.alpha,
              std::string(dtype_name(type)).c_str(), a.base.c_str(), config.arch_name.c_str());
  return 0;
}

}  // namespace

void add_adapter_command(CLI::App& app, int* rc) {
  CLI::App* adapter = app.add_subcommand("adapter", "LoRA adapters: inspect (what one holds), convert (PEFT to GGUF), synth (random weights)");
  // Without a subcommand main names them (CLI11 would only say one is required).

  auto ia = std::make_shared<InspectArgs>();
  CLI::App* inspect_cmd =
      adapter->add_subcommand("inspect", "Show a LoRA adapter's targets, ranks, sizes, scales and digest");
  inspect_cmd->add_option("adapter", ia->path, "GGUF adapter file or PEFT checkpoint directory")->required();
  inspect_cmd->add_option("-m,--base", ia->base, "Base model (GGUF) to check the adapter against");
  inspect_cmd->callback([ia, rc] { *rc = inspect(*ia); });

  auto ca = std::make_shared<ConvertArgs>();
  CLI::App* convert_cmd =
      adapter->add_subcommand("convert", "Convert a PEFT checkpoint to llama.cpp's GGUF adapter format");
  convert_cmd->add_option("peft_dir", ca->dir, "PEFT checkpoint directory (adapter_config.json, "
                                               "adapter_model.safetensors)")->required();
  convert_cmd->add_option("-m,--base", ca->base, "Base model (GGUF) the adapter was trained on")->required();
  convert_cmd->add_option("-o,--output", ca->out, "GGUF adapter file to write")->required();
  convert_cmd->callback([ca, rc] { *rc = convert(*ca); });

  auto sa = std::make_shared<SynthArgs>();
  CLI::App* synth_cmd = adapter->add_subcommand(
      "synth", "Write a LoRA adapter with random weights for a base model (for benchmarks and tests)");
  synth_cmd->add_option("-m,--base", sa->base, "Base model (GGUF)")->required();
  synth_cmd->add_option("-o,--output", sa->out, "GGUF adapter file to write")->required();
  synth_cmd->add_option("--rank", sa->rank, "Rank")->capture_default_str();
  synth_cmd->add_option("--alpha", sa->alpha, "adapter.lora.alpha (the scale is alpha / rank)")->capture_default_str();
  synth_cmd->add_option("--targets", sa->targets, "Projections, comma-separated")->capture_default_str();
  synth_cmd->add_option("--type", sa->type, "Tensor type: f16 or f32")->capture_default_str();
  synth_cmd->add_option("--b-std", sa->b_std, "Standard deviation of B (0: B = 0, as training starts)")
      ->capture_default_str();
  synth_cmd->add_option("--seed", sa->seed, "Random seed")->capture_default_str();
  synth_cmd->callback([sa, rc] { *rc = synth(*sa); });
}

}  // namespace ebb::cli
