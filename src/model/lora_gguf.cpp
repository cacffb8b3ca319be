// llama.cpp's GGUF adapter format: general.type = adapter, adapter.type =
// lora, adapter.lora.alpha (f32, optional), and for each adapted base
// tensor NAME the pair NAME.lora_a (ggml [n_in, r]) and NAME.lora_b (ggml
// [r, n_out]); for token_embd A and B are swapped (A: [r, n_vocab], B:
// [r, n_embd]), as llama.cpp's embedding lookup reads them.
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "kernels/matmul.h"
#include "model/gguf.h"
#include "model/lora_internal.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/hash.h"

namespace ebb {
namespace detail {

bool parse_lora_base_name(std::string_view base, int* layer, LoraTarget* target) {
  static constexpr std::string_view kSuffix = ".weight";
  if (base.size() <= kSuffix.size() || base.substr(base.size() - kSuffix.size()) != kSuffix) return false;
  base.remove_suffix(kSuffix.size());
  *layer = -1;
  if (base.rfind("blk.", 0) == 0) {
    base.remove_prefix(4);
    const size_t dot = base.find('.');
    if (dot == 0 || dot == std::string_view::npos || dot > 6) return false;
    int l = 0;
    for (char c : base.substr(0, dot)) {
      if (c < '0' || c > '9') return false;
      l = l * 10 + (c - '0');
    }
    *layer = l;
    base.remove_prefix(dot + 1);
    for (int t = 0; t < kLoraLayerTargets; ++t) {
      if (base == lora_target_name(static_cast<LoraTarget>(t))) {
        *target = static_cast<LoraTarget>(t);
        return true;
      }
    }
    return false;
  }
  for (LoraTarget t : {LoraTarget::kOutput, LoraTarget::kTokenEmbd}) {
    if (base == lora_target_name(t)) {
      *target = t;
      return true;
    }
  }
  return false;
}

bool lora_type_supported(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0;
}

namespace {

// rows x cols of `type` to F32, row by row.
void to_f32(DType type, const uint8_t* src, int64_t rows, int64_t cols, float* dst) {
  const KernelSet& ks = kernel_set(Isa::kScalar);
  WeightView v;
  v.type = type;
  v.cols = cols;
  v.rows = rows;
  v.data = src;
  v.row_stride = row_bytes(type, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(ks, v, r, dst + r * cols);
}

}  // namespace

LoraPair make_lora_pair(int layer, LoraTarget target, int64_t rank, int64_t n_in, int64_t n_out, float scale,
                        DType a_type, const uint8_t* a_bytes, DType b_type, const uint8_t* b_bytes,
                        Allocator& alloc) {
  LoraPair p;
  p.layer = layer;
  p.target = target;
  p.rank = rank;
  p.n_in = n_in;
  p.n_out = n_out;
  p.scale = scale;
  const bool embd = target == LoraTarget::kTokenEmbd;
  std::vector<float> a(static_cast<size_t>(rank * n_in));  // [rank, n_in]; token_embd [n_vocab, rank]
  if (embd) {
    to_f32(a_type, a_bytes, n_in, rank, a.data());
  } else {
    to_f32(a_type, a_bytes, rank, n_in, a.data());
  }
  std::vector<float> b(static_cast<size_t>(n_out * rank));  // [n_out, rank]
  to_f32(b_type, b_bytes, n_out, rank, b.data());
  std::vector<float> bt(b.size());  // [rank, n_out]
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t j = 0; j < rank; ++j) bt[static_cast<size_t>(j * n_out + o)] = b[static_cast<size_t>(o * rank + j)];
  // F16 when neither tensor is stored as F32 and nothing is lost (F16 files
  // always; non-finite values stay F32, for the readers' checks to name them).
  auto f16_exact = [](const std::vector<float>& v) {
    for (float x : v)
      if (!std::isfinite(x) || fp16_to_fp32(fp32_to_fp16(x)) != x) return false;
    return true;
  };
  p.dtype = !embd && a_type != DType::kF32 && b_type != DType::kF32 && f16_exact(a) && f16_exact(bt) ? DType::kF16 : DType::kF32;
  for (auto [buf, v] : {std::pair{&p.a, &a}, std::pair{&p.bt, &bt}}) {
    if (p.dtype == DType::kF16) {
      *buf = alloc.allocate(v->size() * sizeof(uint16_t), MemCategory::kAdapter);
      uint16_t* h = buf->as<uint16_t>();
      for (size_t i = 0; i < v->size(); ++i) h[i] = fp32_to_fp16((*v)[i]);
    } else {
      *buf = alloc.allocate(v->size() * sizeof(float), MemCategory::kAdapter);
      std::memcpy(buf->data(), v->data(), v->size() * sizeof(float));
    }
  }
  return p;
}

int lora_first_nonfinite(const LoraPair& p) {
  if (p.dtype == DType::kF16) return 0;  // only exact, finite values are stored as F16
  for (int w = 1; w <= 2; ++w) {
    const Buffer& buf = w == 1 ? p.a : p.bt;
    const float* v = buf.as<const float>();
    for (size_t i = 0; i < buf.size() / sizeof(float); ++i)
      if (!std::isfinite(v[i])) return w;
  }
  return 0;
}

}  // namespace detail

namespace {

std::string shape_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

std::unique_ptr<LoraAdapter> load_lora_gguf(const std::string& path, const ModelConfig& config, Allocator& alloc) {
  std::unique_ptr<GgufFile> f = GgufFile::open(path);
  const std::optional<std::string> type = f->get_string("general.type");
  if (type != "adapter") {
    throw Error(path + ": not an adapter (general.type is " + (type ? "'" + *type + "'" : std::string("missing")) +
                ", expected 'adapter')");
  }
  const std::optional<std::string> atype = f->get_string("adapter.type");
  if (atype != "lora") {
    throw Error(path + ": adapter.type is " + (atype ? "'" + *atype + "'" : std::string("missing")) +
                ", expected 'lora' (ebb reads LoRA adapters)");
  }
  const std::optional<std::string> arch = f->get_string("general.architecture");
  if (arch != config.arch_name) {
    throw Error(path + ": the adapter is for architecture '" + arch.value_or("(missing)") +
                "', the model is '" + config.arch_name + "'");
  }
  auto ad = std::make_unique<LoraAdapter>();
  ad->source = path;
  ad->format = "gguf";
  ad->arch = *arch;
  const double alpha = f->get_float("adapter.lora.alpha").value_or(0.0);
  if (!std::isfinite(alpha)) throw Error(path + ": adapter.lora.alpha is not a finite number");
  ad->alpha = static_cast<float>(alpha);

  // Pair up NAME.lora_a and NAME.lora_b.
  struct Halves {
    const GgufTensorInfo* a = nullptr;
    const GgufTensorInfo* b = nullptr;
  };
  std::map<std::string, Halves> by_base;
  uint64_t h = kFnv1a64Offset;
  const float alpha_f = ad->alpha;
  h = fnv1a64(&alpha_f, sizeof alpha_f, h);
  for (const GgufTensorInfo& t : f->tensors()) {
    const bool is_a = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_a") == 0;
    const bool is_b = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_b") == 0;
    if (!is_a && !is_b) {
      throw Error(path + ": tensor '" + t.name + "' is not a LoRA tensor (its name must end in .lora_a or .lora_b)");
    }
    Halves& hv = by_base[t.name.substr(0, t.name.size() - 7)];
    (is_a ? hv.a : hv.b) = &t;
  }
  if (by_base.empty()) throw Error(path + ": the adapter has no tensors");

  std::vector<uint8_t> a_raw, b_raw;
  for (const auto& [base, hv] : by_base) {
    if (!hv.a || !hv.b) {
      throw Error(path + ": tensor '" + base + (hv.a ? ".lora_b" : ".lora_a") + "' is missing (the other half, '" +
                  base + (hv.a ? ".lora_a" : ".lora_b") + "', is there)");
    }
    int layer = -1;
    LoraTarget target{};
    if (!detail::parse_lora_base_name(base, &layer, &target)) {
      throw Error(path + ": tensor '" + base + "' is not a projection ebb can adapt (attn_q/k/v/output, "
                  "ffn_gate/up/down, output, token_embd)");
    }
    if (layer >= config.n_layer) {
      throw Error(path + ": tensor '" + base + "' is in layer " + std::to_string(layer) + ", the model has " +
                  std::to_string(config.n_layer));
    }
    for (const GgufTensorInfo* t : {hv.a, hv.b}) {
      if (!detail::lora_type_supported(t->type)) {
        throw Error(path + ": tensor '" + t->name + "' has type " + std::string(dtype_name(t->type)) +
                    " (adapters may be F32, F16, BF16 or Q8_0)");
      }
      if (t->dims.size() != 2) {
        throw Error(path + ": tensor '" + t->name + "' has shape " + shape_str(t->dims) + ", expected 2 dimensions");
      }
    }
    int64_t n_in = 0, n_out = 0;
    lora_expected_shape(config, target, &n_in, &n_out);
    const bool embd = target == LoraTarget::kTokenEmbd;
    // ggml shapes: A [n_in, r] and B [r, n_out]; token_embd: A [r, n_vocab], B [r, n_embd].
    const int64_t rank = hv.b->dims[0];
    const std::vector<int64_t> want_a = embd ? std::vector<int64_t>{rank, n_in} : std::vector<int64_t>{n_in, rank};
    const std::vector<int64_t> want_b = {rank, n_out};
    if (rank < 1 || rank > 65536) {
      throw Error(path + ": tensor '" + hv.b->name + "' has rank " + std::to_string(rank) + " (shape " +
                  shape_str(hv.b->dims) + "), expected 1 to 65536");
    }
    if (hv.b->dims != want_b) {
      throw Error(path + ": tensor '" + hv.b->name + "' has shape " + shape_str(hv.b->dims) + ", expected " +
                  shape_str(want_b) + " for base tensor '" + base + "' (rank " + std::to_string(rank) + ")");
    }
    if (hv.a->dims != want_a) {
      throw Error(path + ": tensor '" + hv.a->name + "' has shape " + shape_str(hv.a->dims) + ", expected " +
                  shape_str(want_a) + " for base tensor '" + base + "' (rank " + std::to_string(rank) +
                  (embd ? "; token_embd's A and B are swapped in this format" : "") + ")");
    }
    a_raw.resize(hv.a->n_bytes);
    b_raw.resize(hv.b->n_bytes);
    f->read(hv.a->file_offset, a_raw.data(), hv.a->n_bytes);
    f->read(hv.b->file_offset, b_raw.data(), hv.b->n_bytes);
    for (const auto* t : {hv.a, hv.b}) {
      h = fnv1a64(t->name.data(), t->name.size(), h);
      for (int64_t d : t->dims) h = fnv1a64(&d, sizeof d, h);
      const uint32_t ty = static_cast<uint32_t>(t->type);
      h = fnv1a64(&ty, sizeof ty, h);
    }
    h = fnv1a64(a_raw.data(), a_raw.size(), h);
    h = fnv1a64(b_raw.data(), b_raw.size(), h);
    const float scale = ad->alpha != 0 ? ad->alpha / static_cast<float>(rank) : 1.0f;
    ad->pairs.push_back(detail::make_lora_pair(layer, target, rank, n_in, n_out, scale, hv.a->type, a_raw.data(),
                                               hv.b->type, b_raw.data(), alloc));
    if (const int bad = detail::lora_first_nonfinite(ad->pairs.back())) {
      throw Error(path + ": tensor '" + base + (bad == 1 ? ".lora_a" : ".lora_b") + "' holds a NaN or infinite value");
    }
  }
  ad->digest = h;
  ad->index(static_cast<int>(config.n_layer));
  return ad;
}

void write_lora_gguf(const LoraAdapter& ad, const std::string& path, DType type) {
  if (ad.pairs.empty()) throw Error("cannot write '" + path + "': the adapter has no tensors");
  if (type != DType::kF32 && type != DType::kF16) {
    throw Error("cannot write '" + path + "': adapters are written as F32 or F16, not " + std::string(dtype_name(type)));
  }
  // One alpha for the file: alpha / rank must give every pair's scale.
  const float alpha = ad.pairs[0].scale * static_cast<float>(ad.pairs[0].rank);
  for (const LoraPair& p : ad.pairs) {
    const float a = p.scale * static_cast<float>(p.rank);
    if (std::fabs(a - alpha) > 1e-5f * std::max(1.0f, std::fabs(alpha))) {
      throw Error("cannot write '" + path + "' in llama.cpp's adapter format: its pairs' scales need different "
                  "alphas (" + std::to_string(alpha) + " for '" + lora_base_tensor_name(ad.pairs[0].layer, ad.pairs[0].target) +
                  "', " + std::to_string(a) + " for '" + lora_base_tensor_name(p.layer, p.target) + "')");
    }
  }
  if (alpha == 0.0f) {
    throw Error("cannot write '" + path + "' in llama.cpp's adapter format: its scale is 0 (alpha 0 means scale 1 "
                "there)");
  }
  GgufWriter w;
  w.set_string("general.type", "adapter");
  w.set_string("general.architecture", ad.arch);
  w.set_string("adapter.type", "lora");
  w.set_float32("adapter.lora.alpha", alpha);
  struct Out {
    const LoraPair* p;
    bool is_a;
  };
  std::vector<Out> outs;
  for (const LoraPair& p : ad.pairs) {
    const std::string base = lora_base_tensor_name(p.layer, p.target);
    const bool embd = p.target == LoraTarget::kTokenEmbd;
    w.add_tensor(base + ".lora_a", embd ? std::vector<int64_t>{p.rank, p.n_in} : std::vector<int64_t>{p.n_in, p.rank},
                 type);
    outs.push_back({&p, true});
    w.add_tensor(base + ".lora_b", {p.rank, p.n_out}, type);
    outs.push_back({&p, false});
  }
  std::vector<float> rows;
  w.write(path, [&](size_t i, uint8_t* dst) {
    const LoraPair& p = *outs[i].p;
    if (outs[i].is_a) {
      rows.resize(static_cast<size_t>(p.rank * p.n_in));
      for (size_t k = 0; k < rows.size(); ++k) rows[k] = p.a_at(static_cast<int64_t>(k));
    } else {
      rows.resize(static_cast<size_t>(p.n_out * p.rank));  // [n_out, rank]
      for (int64_t o = 0; o < p.n_out; ++o)
        for (int64_t j = 0; j < p.rank; ++j) rows[static_cast<size_t>(o * p.rank + j)] = p.bt_at(j * p.n_out + o);
    }
    if (type == DType::kF32) {
      std::memcpy(dst, rows.data(), rows.size() * sizeof(float));
    } else {
      auto* h = reinterpret_cast<uint16_t*>(dst);
      for (size_t k = 0; k < rows.size(); ++k) h[k] = fp32_to_fp16(rows[k]);
    }
  });
}

std::unique_ptr<LoraAdapter> init_lora(const ModelConfig& config, const LoraInitOptions& o, Allocator& alloc) {
  if (o.rank < 1 || o.rank > 65536) throw Error("LoRA rank must be 1 to 65536, got " + std::to_string(o.rank));
  std::vector<LoraTarget> targets = o.targets;
  if (targets.empty())
    for (int t = 0; t < kLoraLayerTargets; ++t) targets.push_back(static_cast<LoraTarget>(t));
  auto ad = std::make_unique<LoraAdapter>();
  ad->source = "(initialised)";
  ad->format = "gguf";
  ad->arch = config.arch_name;
  ad->alpha = o.alpha;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  uint64_t h = fnv1a64(&o.alpha, sizeof o.alpha);
  for (int layer = 0; layer < config.n_layer; ++layer) {
    for (LoraTarget t : targets) {
      if (static_cast<int>(t) >= kLoraLayerTargets) throw Error("init_lora: only layer projections can be initialised");
      LoraPair p;
      p.layer = layer;
      p.target = t;
      p.rank = o.rank;
      lora_expected_shape(config, t, &p.n_in, &p.n_out);
      p.scale = o.alpha / static_cast<float>(o.rank);
      p.a = alloc.allocate(static_cast<size_t>(p.rank * p.n_in) * sizeof(float), MemCategory::kAdapter);
      p.bt = alloc.allocate(static_cast<size_t>(p.rank * p.n_out) * sizeof(float), MemCategory::kAdapter);
      const float a_std = 1.0f / std::sqrt(static_cast<float>(p.n_in));
      float* a = p.a.as<float>();
      for (int64_t i = 0; i < p.rank * p.n_in; ++i) a[i] = a_std * normal(rng);
      float* bt = p.bt.as<float>();
      for (int64_t i = 0; i < p.rank * p.n_out; ++i) bt[i] = o.b_std == 0 ? 0.0f : o.b_std * normal(rng);
      h = fnv1a64(a, p.a.size(), h);
      h = fnv1a64(bt, p.bt.size(), h);
      ad->pairs.push_back(std::move(p));
    }
  }
  ad->digest = h;
  ad->index(static_cast<int>(config.n_layer));
  return ad;
}

}  // namespace ebb
