// PEFT checkpoints against the GGUF adapters they convert to: each golden
// GGUF adapter is written back as the PEFT directory it came from (HF names
// and layouts, llama's q/k rows in HF order), and load_lora_peft must give
// exactly the pairs load_lora_gguf gives. Then rsLoRA and rank/alpha
// patterns, the embedding and lm_head layouts, the errors, and
// `ebb adapter inspect` / `ebb adapter convert`.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "support.h"

namespace ebb {
namespace {

#define EXPECT_HAS(msg, part) EXPECT_NE(std::string(msg).find(part), std::string::npos) << (msg)

const std::string kLlamaBase = "tiny-llama-f16.gguf";
const std::string kQwenBase = "tiny-qwen3-f16.gguf";

std::string golden(const std::string& name) { return test::shared_path("golden/lora/" + name); }

ModelConfig config_of(const std::string& base) { return read_model_config(*GgufFile::open(test::model_path(base))); }

// The HF module a pair adapts.
std::string hf_module(int layer, LoraTarget t) {
  const std::string l = "model.layers." + std::to_string(layer) + ".";
  switch (t) {
    case LoraTarget::kQ: return l + "self_attn.q_proj";
    case LoraTarget::kK: return l + "self_attn.k_proj";
    case LoraTarget::kV: return l + "self_attn.v_proj";
    case LoraTarget::kO: return l + "self_attn.o_proj";
    case LoraTarget::kGate: return l + "mlp.gate_proj";
    case LoraTarget::kUp: return l + "mlp.up_proj";
    case LoraTarget::kDown: return l + "mlp.down_proj";
    case LoraTarget::kOutput: return "lm_head";
    case LoraTarget::kTokenEmbd: return "model.embed_tokens";
  }
  return "";
}

std::string short_name(const std::string& module) { return module.substr(module.rfind('.') + 1); }

// llama.cpp's convert_hf_to_gguf.py permute, written as its numpy reads:
//   w.reshape(n_head, 2, D, ...).swapaxes(1, 2).reshape(w.shape)   (D = rows / n_head / 2)
// out[h, d, s] = w[h, s, d]: GGUF row (h*D + d)*2 + s is HF row (h*2 + s)*D + d.
std::vector<int64_t> gguf_row_sources(int64_t rows, int64_t n_head) {
  const int64_t D = rows / n_head / 2;
  std::vector<int64_t> src(static_cast<size_t>(rows));
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t s = 0; s < 2; ++s) src[static_cast<size_t>((h * D + d) * 2 + s)] = (h * 2 + s) * D + d;
  return src;
}

// One HF tensor: F32 values, outermost first.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The PEFT tensors an adapter was converted from (names with the
// base_model.model. prefix when `prefix`).
std::vector<HfTensor> peft_tensors(const LoraAdapter& ad, const ModelConfig& c, bool prefix = true) {
  std::vector<HfTensor> out;
  for (const LoraPair& p : ad.pairs) {
    const std::string module = (prefix ? "base_model.model." : "") + hf_module(p.layer, p.target);
    const bool embd = p.target == LoraTarget::kTokenEmbd;
    HfTensor a{module + (embd ? ".lora_embedding_A" : ".lora_A.weight"), {p.rank, p.n_in}, {}};
    a.values.resize(static_cast<size_t>(p.rank * p.n_in));
    for (int64_t j = 0; j < p.rank; ++j)
      for (int64_t i = 0; i < p.n_in; ++i) {
        // ebb: [rank, n_in]; token_embd [n_vocab, rank]. PEFT: [r, n_in] for both.
        a.values[static_cast<size_t>(j * p.n_in + i)] =
            embd ? p.a_at(i * p.rank + j) : p.a_at(j * p.n_in + i);
      }
    HfTensor b{module + (embd ? ".lora_embedding_B" : ".lora_B.weight"), {p.n_out, p.rank}, {}};
    b.values.resize(static_cast<size_t>(p.n_out * p.rank));
    std::vector<int64_t> hf_row(static_cast<size_t>(p.n_out));
    for (int64_t o = 0; o < p.n_out; ++o) hf_row[static_cast<size_t>(o)] = o;
    if (c.arch == Arch::kLlama && (p.target == LoraTarget::kQ || p.target == LoraTarget::kK)) {
      hf_row = gguf_row_sources(p.n_out, p.target == LoraTarget::kQ ? c.n_head : c.n_head_kv);
    }
    for (int64_t o = 0; o < p.n_out; ++o)  // GGUF row o is HF row hf_row[o]
      for (int64_t j = 0; j < p.rank; ++j)
        b.values[static_cast<size_t>(hf_row[static_cast<size_t>(o)] * p.rank + j)] = p.bt_at(j * p.n_out + o);
    out.push_back(std::move(a));
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<uint8_t> encode(const std::vector<float>& v, const std::string& dtype) {
  std::vector<uint8_t> out;
  if (dtype == "F32") {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    out.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = dtype == "F16" ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

nlohmann::json peft_config(const LoraAdapter& ad, const std::vector<HfTensor>& ts) {
  std::set<std::string> modules;
  for (const HfTensor& t : ts) {
    const std::string m = t.name.substr(0, t.name.find(".lora_"));
    modules.insert(short_name(m));
  }
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"r", ad.max_rank()},
          {"lora_alpha", ad.alpha},
          {"use_rslora", false},
          {"lora_dropout", 0.05},
          {"bias", "none"},
          {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
          {"base_model_name_or_path", "ebb-tests/tiny"}};
}

void write_peft(const std::string& dir, const std::vector<HfTensor>& ts, const nlohmann::json& config,
                const std::string& dtype = "F32") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json") << config.dump(2);
  std::vector<std::vector<uint8_t>> bytes;
  for (const HfTensor& t : ts) bytes.push_back(encode(t.values, dtype));
  std::vector<SafetensorsTensor> out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back({ts[i].name, dtype, ts[i].shape, bytes[i]});
  write_safetensors(dir + "/adapter_model.safetensors", out, {{"format", "pt"}});
}

// Every pair of `want` in `got` with the same rank, shapes, scale and bits.
void expect_same_pairs(const LoraAdapter& want, const LoraAdapter& got, float scale_factor = 1.0f) {
  ASSERT_EQ(got.pairs.size(), want.pairs.size());
  for (const LoraPair& w : want.pairs) {
    const std::string name = lora_base_tensor_name(w.layer, w.target);
    const LoraPair* g = got.find(w.layer, w.target);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_EQ(g->rank, w.rank) << name;
    EXPECT_EQ(g->n_in, w.n_in) << name;
    EXPECT_EQ(g->n_out, w.n_out) << name;
    EXPECT_EQ(g->scale, w.scale * scale_factor) << name;
    // The values, bit for bit, whether each side holds them as F16 or F32
    // (an F16 adapter written as F32 GGUF comes back F32).
    bool a_same = true, b_same = true;
    for (int64_t i = 0; i < w.rank * w.n_in && a_same; ++i) {
      const float x = g->a_at(i), y = w.a_at(i);
      a_same = std::memcmp(&x, &y, sizeof x) == 0;
    }
    for (int64_t i = 0; i < w.rank * w.n_out && b_same; ++i) {
      const float x = g->bt_at(i), y = w.bt_at(i);
      b_same = std::memcmp(&x, &y, sizeof x) == 0;
    }
    EXPECT_TRUE(a_same) << name << ": A differs";
    EXPECT_TRUE(b_same) << name << ": B differs";
  }
}

struct Fixture {
  Ledger ledger;
  Allocator alloc{&ledger};
  test::TempDir tmp{"ebb-peft"};
};

std::string load_error(const std::string& dir, const ModelConfig& c, Allocator& alloc) {
  try {
    load_lora_peft(dir, c, alloc);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoraPeft, LlamaPermutationIsNotTheIdentity) {
  const std::vector<int64_t> src = gguf_row_sources(8, 2);  // 2 heads of 4: rows 0 2 1 3 | 4 6 5 7
  EXPECT_EQ(src, (std::vector<int64_t>{0, 2, 1, 3, 4, 6, 5, 7}));
}

TEST(LoraPeft, LlamaF32EqualsTheGgufAdapter) {
  Fixture f;
  const ModelConfig c = config_of(kLlamaBase);
  ASSERT_EQ(c.arch, Arch::kLlama);
  const auto ref = load_lora_gguf(golden("tiny-llama.lora-r8.gguf"), c, f.alloc);
  const std::vector<HfTensor> ts = peft_tensors(*ref, c);
  write_peft(f.tmp.file("p"), ts, peft_config(*ref, ts));
  const auto got = load_lora_peft(f.tmp.file("p"), c, f.alloc);
  EXPECT_EQ(got->format, "peft");
  EXPECT_EQ(got->arch, "llama");
  EXPECT_EQ(got->alpha, 16.0f);
  EXPECT_EQ(got->source, f.tmp.file("p"));
  EXPECT_EQ(got->targets_summary(), ref->targets_summary());
  expect_same_pairs(*ref, *got);
  EXPECT_EQ(ref->pairs[0].scale, 2.0f);

  // The same rows, not permuted, as for a qwen model, differ for q and k.
  ModelConfig as_qwen = c;
  as_qwen.arch = Arch::kQwen2;
  as_qwen.arch_name = "qwen2";
  const auto unpermuted = load_lora_peft(f.tmp.file("p"), as_qwen, f.alloc);
  const LoraPair* q = unpermuted->find(0, LoraTarget::kQ);
  const LoraPair* v = unpermuted->find(0, LoraTarget::kV);
  EXPECT_NE(std::memcmp(q->bt.data(), ref->find(0, LoraTarget::kQ)->bt.data(), q->bt.size()), 0);
  EXPECT_EQ(std::memcmp(v->bt.data(), ref->find(0, LoraTarget::kV)->bt.data(), v->bt.size()), 0);
}

TEST(LoraPeft, Qwen3F16EqualsTheGgufAdapter) {
  Fixture f;
  const ModelConfig c = config_of(kQwenBase);
  const auto ref = load_lora_gguf(golden("tiny-qwen3.lora-r8-f16.gguf"), c, f.alloc);
  // The GGUF stores F16, so its values survive an F16 safetensors exactly.
  for (bool prefix : {true, false}) {
    const std::string dir = f.tmp.file(prefix ? "with" : "without");
    const std::vector<HfTensor> ts = peft_tensors(*ref, c, prefix);
    write_peft(dir, ts, peft_config(*ref, ts), "F16");
    const auto got = load_lora_peft(dir, c, f.alloc);
    EXPECT_EQ(got->arch, "qwen3");
    expect_same_pairs(*ref, *got);
  }
}

TEST(LoraPeft, DigestFollowsEveryByteAndTheScale) {
  Fixture f;
  const ModelConfig c = config_of(kQwenBase);
  const auto ref = load_lora_gguf(golden("tiny-qwen3.lora-r4-qv.gguf"), c, f.alloc);
  std::vector<HfTensor> ts = peft_tensors(*ref, c);
  const nlohmann::json cfg = peft_config(*ref, ts);
  write_peft(f.tmp.file("a"), ts, cfg);
  write_peft(f.tmp.file("b"), ts, cfg);
  nlohmann::json cfg2 = cfg;
  cfg2["lora_alpha"] = 5;
  write_peft(f.tmp.file("alpha"), ts, cfg2);
  nlohmann::json cfg3 = cfg;
  cfg3["alpha_pattern"] = {{"model.layers.2.self_attn.v_proj", 4.5}};
  write_peft(f.tmp.file("pattern"), ts, cfg3);
  ts[3].values[7] += 1.0f;
  write_peft(f.tmp.file("byte"), ts, cfg);
  const uint64_t d = load_lora_peft(f.tmp.file("a"), c, f.alloc)->digest;
  EXPECT_EQ(load_lora_peft(f.tmp.file("b"), c, f.alloc)->digest, d);
  for (const char* other : {"alpha", "pattern", "byte"})
    EXPECT_NE(load_lora_peft(f.tmp.file(other), c, f.alloc)->digest, d) << other;
}

TEST(LoraPeft, RsLoraScalesByTheSquareRootOfTheRank) {
  Fixture f;
  const ModelConfig c = config_of(kLlamaBase);
  const auto ref = load_lora_gguf(golden("tiny-llama.lora-r8.gguf"), c, f.alloc);
  const std::vector<HfTensor> ts = peft_tensors(*ref, c);
  nlohmann::json cfg = peft_config(*ref, ts);
  cfg["use_rslora"] = true;
  write_peft(f.tmp.file("p"), ts, cfg);
  const auto got = load_lora_peft(f.tmp.file("p"), c, f.alloc);
  // alpha / sqrt(r) = 16 / sqrt(8) against alpha / r = 2: sqrt(8) times the GGUF's.
  const float want = static_cast<float>(16.0 / std::sqrt(8.0));
  for (const LoraPair& p : got->pairs) EXPECT_EQ(p.scale, want);
  expect_same_pairs(*ref, *got, want / 2.0f);
}

TEST(LoraPeft, RankAndAlphaPatternsApplyPerModule) {
  Fixture f;
  const ModelConfig c = config_of(kQwenBase);
  const auto ref = load_lora_gguf(golden("tiny-qwen3.lora-r4-qv.gguf"), c, f.alloc);  // r 4, alpha 4
  const std::vector<HfTensor> ts = peft_tensors(*ref, c);
  nlohmann::json cfg = peft_config(*ref, ts);
  cfg["r"] = 16;  // every module's rank comes from the pattern
  cfg["rank_pattern"] = {{"q_proj", 4}, {"self_attn.v_proj", 4}};
  cfg["alpha_pattern"] = {{"model.layers.1.self_attn.v_proj", 2}, {"q_proj", 8}};
  write_peft(f.tmp.file("p"), ts, cfg);
  const auto got = load_lora_peft(f.tmp.file("p"), c, f.alloc);
  ASSERT_EQ(got->pairs.size(), 8u);
  for (const LoraPair& p : got->pairs) {
    const float want = p.target == LoraTarget::kQ ? 8.0f / 4 : p.layer == 1 ? 2.0f / 4 : 4.0f / 4;
    EXPECT_EQ(p.scale, want) << lora_base_tensor_name(p.layer, p.target);
    EXPECT_EQ(p.rank, 4);
  }
  // Without the rank pattern, r 16 does not fit the tensors.
  cfg.erase("rank_pattern");
  write_peft(f.tmp.file("q"), ts, cfg);
  const std::string e = load_error(f.tmp.file("q"), c, f.alloc);
  EXPECT_HAS(e, "has shape [4, 256], expected [16, 256]");
  EXPECT_HAS(e, "r in ");
}

TEST(LoraPeft, EmbeddingAndLmHeadLayouts) {
  Fixture f;
  const ModelConfig c = config_of(kQwenBase);
  const int64_t r = 2, V = c.n_vocab, E = c.n_embd;
  auto value = [](int64_t k, int64_t salt) { return static_cast<float>((k * 7 + salt) % 23) / 16.0f - 0.5f; };
  HfTensor ea{"base_model.model.model.embed_tokens.lora_embedding_A", {r, V}, {}};  // [r, n_vocab]
  HfTensor eb{"base_model.model.model.embed_tokens.lora_embedding_B", {E, r}, {}};  // [n_embd, r]
  HfTensor ha{"base_model.model.lm_head.lora_A.weight", {r, E}, {}};                // [r, n_embd]
  HfTensor hb{"base_model.model.lm_head.lora_B.weight", {V, r}, {}};                // [n_vocab, r]
  for (HfTensor* t : {&ea, &eb, &ha, &hb}) {
    t->values.resize(static_cast<size_t>(t->shape[0] * t->shape[1]));
    for (size_t k = 0; k < t->values.size(); ++k) t->values[k] = value(static_cast<int64_t>(k), t->shape[0]);
  }
  const std::vector<HfTensor> ts = {ea, eb, ha, hb};
  nlohmann::json cfg = {{"r", r}, {"lora_alpha", 4}, {"target_modules", {"embed_tokens", "lm_head"}}};
  write_peft(f.tmp.file("p"), ts, cfg);
  const auto got = load_lora_peft(f.tmp.file("p"), c, f.alloc);
  EXPECT_EQ(got->targets_summary(), "output token_embd");
  const LoraPair* e = got->find(-1, LoraTarget::kTokenEmbd);
  const LoraPair* h = got->find(-1, LoraTarget::kOutput);
  ASSERT_TRUE(e && h);
  EXPECT_EQ(e->scale, 2.0f);
  EXPECT_EQ(e->n_in, V);
  EXPECT_EQ(e->n_out, E);
  // token t's intermediate is a[t, :] = lora_embedding_A[:, t]; bt = B^T.
  for (int64_t t = 0; t < V; t += 37)
    for (int64_t j = 0; j < r; ++j) ASSERT_EQ(e->a_at(t * r + j), ea.values[static_cast<size_t>(j * V + t)]);
  for (int64_t o = 0; o < E; ++o)
    for (int64_t j = 0; j < r; ++j) ASSERT_EQ(e->bt_at(j * E + o), eb.values[static_cast<size_t>(o * r + j)]);
  for (int64_t j = 0; j < r; ++j)
    for (int64_t i = 0; i < E; ++i) ASSERT_EQ(h->a_at(j * E + i), ha.values[static_cast<size_t>(j * E + i)]);
  for (int64_t o = 0; o < V; o += 11)
    for (int64_t j = 0; j < r; ++j) ASSERT_EQ(h->bt_at(j * V + o), hb.values[static_cast<size_t>(o * r + j)]);

  // And through llama.cpp's format: token_embd's swapped halves round-trip.
  write_lora_gguf(*got, f.tmp.file("e.gguf"));
  expect_same_pairs(*got, *load_lora_gguf(f.tmp.file("e.gguf"), c, f.alloc));
}

TEST(LoraPeft, WriteGgufThenLoadGgufIsTheSameAdapter) {
  Fixture f;
  for (const auto& [adapter, base] : {std::pair{"tiny-llama.lora-r8.gguf", kLlamaBase},
                                      std::pair{"tiny-qwen3.lora-r8-f16.gguf", kQwenBase}}) {
    const ModelConfig c = config_of(base);
    const auto ref = load_lora_gguf(golden(adapter), c, f.alloc);
    const std::vector<HfTensor> ts = peft_tensors(*ref, c);
    write_peft(f.tmp.file(base), ts, peft_config(*ref, ts));
    const auto peft = load_lora_peft(f.tmp.file(base), c, f.alloc);
    const std::string out = f.tmp.file(std::string(adapter) + ".out.gguf");
    write_lora_gguf(*peft, out);
    const auto back = load_lora_gguf(out, c, f.alloc);
    EXPECT_EQ(back->format, "gguf");
    EXPECT_EQ(back->arch, c.arch_name);
    expect_same_pairs(*ref, *back);
  }
}

class LoraPeftErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = config_of(kQwenBase);
    ref_ = load_lora_gguf(golden("tiny-qwen3.lora-r4-qv.gguf"), c_, f_.alloc);
    ts_ = peft_tensors(*ref_, c_);
    cfg_ = peft_config(*ref_, ts_);
  }
  std::string error_with(const std::vector<HfTensor>& ts, const nlohmann::json& cfg) {
    const std::string dir = f_.tmp.file("case" + std::to_string(n_++));
    write_peft(dir, ts, cfg);
    return load_error(dir, c_, f_.alloc);
  }
  std::string st(int n) { return f_.tmp.file("case" + std::to_string(n)) + "/adapter_model.safetensors"; }
  Fixture f_;
  ModelConfig c_;
  std::unique_ptr<LoraAdapter> ref_;
  std::vector<HfTensor> ts_;
  nlohmann::json cfg_;
  int n_ = 0;
};

TEST_F(LoraPeftErrors, MissingConfig) {
  std::filesystem::create_directories(f_.tmp.file("empty"));
  const std::string e = load_error(f_.tmp.file("empty"), c_, f_.alloc);
  EXPECT_HAS(e, f_.tmp.file("empty") + "/adapter_config.json: cannot open");
  EXPECT_HAS(e, "adapter_model.safetensors");
  // adapter_model.bin (a pickle) alone is named as such.
  std::ofstream(f_.tmp.file("empty") + "/adapter_config.json") << cfg_.dump();
  std::ofstream(f_.tmp.file("empty") + "/adapter_model.bin") << "pickle";
  EXPECT_HAS(load_error(f_.tmp.file("empty"), c_, f_.alloc), "safe_serialization=True");
}

TEST_F(LoraPeftErrors, MissingHalf) {
  std::vector<HfTensor> ts = ts_;
  ASSERT_EQ(ts[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  ts.erase(ts.begin() + 1);
  const std::string e = error_with(ts, cfg_);
  EXPECT_HAS(e, st(0));
  EXPECT_HAS(e, "the LoRA of 'model.layers.0.self_attn.q_proj' has no lora_B.weight");
  EXPECT_HAS(e, "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight', is there");
}

TEST_F(LoraPeftErrors, WrongShapeNamesExpectedAndFound) {
  std::vector<HfTensor> ts = ts_;
  ts[2].shape = {4, 255};  // layer 0 v_proj A: [4, 256] expected
  ts[2].values.resize(4 * 255);
  std::string e = error_with(ts, cfg_);
  EXPECT_HAS(e, st(0) + ": tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' has shape "
                "[4, 255], expected [4, 256] for base tensor 'blk.0.attn_v.weight' (rank 4");
  // A rank the config does not give.
  nlohmann::json cfg = cfg_;
  cfg["r"] = 8;
  e = error_with(ts_, cfg);
  EXPECT_HAS(e, "has shape [4, 256], expected [8, 256]");
  // A 1-D tensor.
  ts = ts_;
  ts[0].shape = {4 * 256};
  EXPECT_HAS(error_with(ts, cfg_), "has shape [1024], expected 2 dimensions");
}

TEST_F(LoraPeftErrors, UnknownNames) {
  struct Case {
    std::string name;
    std::string want;
  };
  for (const Case& k : {Case{"base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight", "not in a module ebb can adapt"},
                        Case{"base_model.model.lm_head.weight", "is not a LoRA tensor"},
                        Case{"base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", "is not a LoRA tensor"},
                        Case{"base_model.model.model.layers.0.mlp.shared_expert.gate_proj.lora_A.weight", "not in a module"},
                        Case{"base_model.model.model.embed_tokens.lora_A.weight", "lora_embedding_A"}}) {
    std::vector<HfTensor> ts = ts_;
    ts.push_back({k.name, {4, 256}, std::vector<float>(4 * 256)});
    const std::string e = error_with(ts, cfg_);
    EXPECT_HAS(e, "tensor '" + k.name + "'");
    EXPECT_HAS(e, k.want);
  }
}

TEST_F(LoraPeftErrors, ConfigFields) {
  struct Case {
    const char* key;
    nlohmann::json value;
    std::string want;
  };
  for (const Case& k : {Case{"peft_type", "IA3", "peft_type is \"IA3\", expected \"LORA\""},
                        Case{"r", "4", "r is string, expected an integer rank"},
                        Case{"r", 0, "r is 0, expected 1 to 65536"},
                        Case{"lora_alpha", nullptr, "has no lora_alpha"},
                        Case{"use_rslora", "yes", "use_rslora is string, expected true or false"},
                        Case{"use_dora", true, "DoRA"},
                        Case{"target_modules", {"k_proj"}, "which " },
                        Case{"target_modules", 3, "target_modules is number"},
                        Case{"rank_pattern", {{"q_proj", 2.5}}, "rank_pattern['q_proj'] is number"}}) {
    nlohmann::json cfg = cfg_;
    if (k.value.is_null()) cfg.erase(k.key);
    else cfg[k.key] = k.value;
    const std::string e = error_with(ts_, cfg);
    EXPECT_HAS(e, k.want) << k.key;
    EXPECT_HAS(e, f_.tmp.file("case" + std::to_string(n_ - 1))) << k.key;
  }
  // target_modules as a pattern, and all-linear.
  nlohmann::json cfg = cfg_;
  cfg["target_modules"] = R"(.*\.(q_proj|v_proj))";
  EXPECT_EQ(error_with(ts_, cfg), "");
  cfg["target_modules"] = R"(.*\.k_proj)";
  EXPECT_HAS(error_with(ts_, cfg), "does not name");
  cfg["target_modules"] = "all-linear";
  EXPECT_EQ(error_with(ts_, cfg), "");
  // Not JSON.
  std::filesystem::create_directories(f_.tmp.file("bad"));
  std::ofstream(f_.tmp.file("bad") + "/adapter_config.json") << "{\"r\": 4,";
  EXPECT_HAS(load_error(f_.tmp.file("bad"), c_, f_.alloc), "adapter_config.json: not valid JSON");
}

TEST_F(LoraPeftErrors, LayerOutsideTheModel) {
  std::vector<HfTensor> ts = ts_;
  for (HfTensor& t : ts) {
    const size_t at = t.name.find("layers.3.");
    if (at != std::string::npos) t.name.replace(at, 9, "layers.7.");
  }
  EXPECT_HAS(error_with(ts, cfg_), "is in layer 7, the model has 4");
}

TEST_F(LoraPeftErrors, WrongDtype) {
  const std::string dir = f_.tmp.file("i32");
  write_peft(dir, ts_, cfg_);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<SafetensorsTensor> out;
  for (const HfTensor& t : ts_) bytes.push_back(encode(t.values, "F32"));
  for (size_t i = 0; i < ts_.size(); ++i) out.push_back({ts_[i].name, i == 0 ? "I32" : "F32", ts_[i].shape, bytes[i]});
  write_safetensors(dir + "/adapter_model.safetensors", out);
  EXPECT_HAS(load_error(dir, c_, f_.alloc), "has dtype I32 (adapters may be F32, F16 or BF16)");
}

// ---- the command line ----

using test::run_cli;

std::string hex_digest(uint64_t d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, d);
  return buf;
}

TEST(AdapterCli, InspectGgufWithoutAndWithABase) {
  Ledger ledger;
  Allocator alloc(&ledger);
  const std::string path = golden("tiny-qwen3.lora-r4-qv.gguf");
  const auto ref = load_lora_gguf(path, config_of(kQwenBase), alloc);
  for (const std::string& extra : {std::string(), " -m " + test::model_path(kQwenBase)}) {
    const auto r = run_cli("adapter inspect " + path + extra);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_HAS(r.out, "format: gguf");
    EXPECT_HAS(r.out, "architecture: qwen3");
    EXPECT_HAS(r.out, "alpha: 4\n");
    EXPECT_HAS(r.out, "blk.3.attn_v.weight");
    EXPECT_HAS(r.out, "rank 4");
    EXPECT_HAS(r.out, "total: rank 4, 8 targets (16 tensors), 56.0 KiB stored, 56.0 KiB in memory (F32)");
    EXPECT_HAS(r.out, "digest: " + hex_digest(ref->digest));
    EXPECT_HAS(r.out, "scale: 1 (8 pairs: q v)");
    EXPECT_HAS(r.out, extra.empty() ? "checked against its own shapes" : "checked against " + test::model_path(kQwenBase));
  }
  // Against a model it does not fit: the listing, then the error.
  const auto r = run_cli("adapter inspect " + path + " -m " + test::model_path(kLlamaBase));
  EXPECT_EQ(r.status, 1);
  EXPECT_HAS(r.out, "blk.0.attn_q.weight");
  EXPECT_HAS(r.err, "ebb: error: ");
  EXPECT_HAS(r.err, "'qwen3', the model is 'llama'");
}

TEST(AdapterCli, InspectAndConvertPeft) {
  Fixture f;
  const ModelConfig c = config_of(kLlamaBase);
  const auto ref = load_lora_gguf(golden("tiny-llama.lora-r8.gguf"), c, f.alloc);
  const std::vector<HfTensor> ts = peft_tensors(*ref, c);
  const std::string dir = f.tmp.file("peft");
  write_peft(dir, ts, peft_config(*ref, ts), "BF16");
  const auto peft = load_lora_peft(dir, c, f.alloc);

  auto r = run_cli("adapter inspect " + dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_HAS(r.out, "format: peft");
  EXPECT_HAS(r.out, "base model (adapter_config.json): ebb-tests/tiny");
  EXPECT_HAS(r.out, "r: 8, lora_alpha: 16");
  EXPECT_HAS(r.out, "base_model.model.model.layers.0.self_attn.q_proj");
  EXPECT_HAS(r.out, "rank 8    BF16");
  EXPECT_HAS(r.out, "total: rank 8, 28 targets (56 tensors)");
  EXPECT_HAS(r.out, "no base model given");
  EXPECT_EQ(r.out.find("digest:"), std::string::npos);

  r = run_cli("adapter inspect " + dir + " -m " + test::model_path(kLlamaBase));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_HAS(r.out, "architecture: llama (the base model's)");
  EXPECT_HAS(r.out, "digest: " + hex_digest(peft->digest));
  EXPECT_HAS(r.out, "scale: 2 (28 pairs: q k v o gate up down)");

  const std::string out = f.tmp.file("out.gguf");
  r = run_cli("adapter convert " + dir + " --base " + test::model_path(kLlamaBase) + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_HAS(r.out, "wrote " + out + ": 28 pairs");
  expect_same_pairs(*peft, *load_lora_gguf(out, c, f.alloc));

  // Errors: no base (usage), a directory that is not PEFT, a base it does not fit.
  r = run_cli("adapter convert " + dir + " -o " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_HAS(r.err, "--base");
  r = run_cli("adapter convert " + golden("tiny-llama.lora-r8.gguf") + " -m " + test::model_path(kLlamaBase) +
              " -o " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_HAS(r.err, "ebb: error: ");
  EXPECT_HAS(r.err, "is not a directory");
  r = run_cli("adapter convert " + dir + " -m " + test::model_path("stories260K.gguf") + " -o " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_HAS(r.err, "expected [");
  r = run_cli("adapter inspect " + f.tmp.file("nothing"));
  EXPECT_EQ(r.status, 1);
  EXPECT_HAS(r.err, "does not exist");
}

}  // namespace
}  // namespace ebb
