// Synthetic models (src/model/synth.h): every type loads and runs, the
// tokenizer round-trips, seeds are reproducible, the mixes pick the
// documented per-tensor types, and the qwen3-0.6b shape is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include "kernels/matmul.h"
#include "kernels/quantize.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

class SynthTest : public testing::Test {
 protected:
  void SetUp() override { dir = test::make_temp_dir("ebb-synth"); }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string write(const SynthShape& shape, std::string_view type, uint64_t seed = 1, int threads = 2,
                    std::string name = "") {
    SynthOptions o;
    o.shape = shape;
    o.type = *parse_synth_type(type);
    o.seed = seed;
    o.n_threads = threads;
    if (name.empty()) name = shape.name + "-" + std::string(type) + "-" + std::to_string(seed) + ".gguf";
    const std::string path = dir + "/" + name;
    write_synth_model(o, path);
    return path;
  }
  std::string dir;
};

const SynthShape& shape(std::string_view name) {
  const SynthShape* s = find_synth_shape(name);
  EBB_CHECK(s != nullptr);
  return *s;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

EngineOptions engine_options(const std::string& path) {
  EngineOptions o;
  o.model_path = path;
  o.n_threads = 2;
  return o;
}

bool more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int layer_of(const std::string& name) {
  return name.rfind("blk.", 0) == 0 ? std::stoi(name.substr(4)) : -1;
}

TEST(SynthShapes, BuiltinShapesHaveTheRealModelsDimensions) {
  const SynthShape& q = shape("qwen3-0.6b");
  EXPECT_EQ(q.arch, "qwen3");
  EXPECT_EQ(q.n_layer, 28);
  EXPECT_EQ(q.n_embd, 1024);
  EXPECT_EQ(q.n_head, 16);
  EXPECT_EQ(q.n_head_kv, 8);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.n_ff, 3072);
  EXPECT_EQ(q.n_vocab, 151936);
  EXPECT_TRUE(q.tied);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.rope_base, 1e6f);
  EXPECT_EQ(q.n_ctx, 40960);
  const SynthShape& q17 = shape("qwen3-1.7b");
  EXPECT_EQ(q17.n_embd, 2048);
  EXPECT_EQ(q17.n_ff, 6144);
  const SynthShape& l = shape("llama3.2-1b");
  EXPECT_EQ(l.n_layer, 16);
  EXPECT_EQ(l.n_head, 32);
  EXPECT_EQ(l.head_dim, 64);
  EXPECT_EQ(l.n_ff, 8192);
  EXPECT_EQ(l.n_vocab, 128256);
  EXPECT_TRUE(l.tied);
  EXPECT_EQ(l.rope_base, 5e5f);
  EXPECT_EQ(l.n_ctx, 131072);
  const SynthShape& t = shape("tinyllama-1.1b");
  EXPECT_EQ(t.n_layer, 22);
  EXPECT_EQ(t.n_head_kv, 4);
  EXPECT_EQ(t.n_ff, 5632);
  EXPECT_EQ(t.n_vocab, 32000);
  EXPECT_FALSE(t.tied);
  EXPECT_EQ(t.n_ctx, 2048);
  // Published parameter counts: 0.6B (0.44B without embeddings), 1.7B, 1.24B, 1.1B.
  EXPECT_NEAR(q.n_params() / 1e9, 0.596, 0.002);
  EXPECT_NEAR(q17.n_params() / 1e9, 1.72, 0.01);
  EXPECT_NEAR(l.n_params() / 1e9, 1.236, 0.002);
  EXPECT_NEAR(t.n_params() / 1e9, 1.100, 0.002);
  EXPECT_EQ(find_synth_shape("gpt-5"), nullptr);
  const std::vector<std::string> names = synth_shape_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).count("tiny"), 1u);
}

TEST(SynthShapes, TypesParseAndMapToLlamaFileTypes) {
  EXPECT_EQ(synth_type_names().size(), 17u);
  for (const std::string& n : synth_type_names()) {
    const auto t = parse_synth_type(n);
    ASSERT_TRUE(t) << n;
    EXPECT_EQ(synth_type_name(*t), n);
  }
  EXPECT_EQ(parse_synth_type("Q4_K_M")->mix, SynthType::Mix::kQ4_K_M);
  EXPECT_FALSE(parse_synth_type("iq2_xxs"));
  EXPECT_EQ(synth_file_type(*parse_synth_type("f32")), 0u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("f16")), 1u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("q4_0")), 2u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("q8_0")), 7u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("q4_k_m")), 15u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("q5_k_m")), 17u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("q6_k")), 18u);
  EXPECT_EQ(synth_file_type(*parse_synth_type("bf16")), 32u);
}

TEST_F(SynthTest, EveryTypeLoadsAndGenerates) {
  for (const char* sname : {"tiny", "tiny-llama"}) {
    const SynthShape& s = shape(sname);
    for (const std::string& type : synth_type_names()) {
      SCOPED_TRACE(std::string(sname) + " " + type);
      const std::string path = write(s, type);
      EXPECT_EQ(std::filesystem::file_size(path), plan_synth_model(s, *parse_synth_type(type)).file_bytes);
      Engine engine(engine_options(path));
      const ModelConfig& c = engine.config();
      EXPECT_EQ(c.arch_name, s.arch);
      EXPECT_EQ(c.n_layer, s.n_layer);
      EXPECT_EQ(c.n_vocab, s.n_vocab);
      EXPECT_EQ(c.tied_output, s.tied);
      Session session(engine);
      const std::vector<TokenId> prompt = engine.tokenizer().encode("Hello world");
      GenerateOptions go;
      go.max_tokens = 4;
      go.sampling.temperature = 0;
      go.stop_at_eog = false;
      const GenerateStats st = generate(session, prompt, go, nullptr);
      ASSERT_EQ(st.tokens.size(), 4u);
      for (TokenId t : st.tokens) EXPECT_TRUE(t >= 0 && t < s.n_vocab);
      std::filesystem::remove(path);
    }
  }
}

TEST_F(SynthTest, MetadataMatchesTheShape) {
  const SynthShape& s = shape("tiny");
  const auto file = GgufFile::open(write(s, "q4_k_m"));
  const ModelConfig c = read_model_config(*file);
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_EQ(c.n_layer, s.n_layer);
  EXPECT_EQ(c.n_embd, s.n_embd);
  EXPECT_EQ(c.n_head, s.n_head);
  EXPECT_EQ(c.n_head_kv, s.n_head_kv);
  EXPECT_EQ(c.head_dim, s.head_dim);
  EXPECT_EQ(c.n_ff, s.n_ff);
  EXPECT_EQ(c.n_vocab, s.n_vocab);
  EXPECT_EQ(c.n_ctx_train, s.n_ctx);
  EXPECT_EQ(c.rope_dim, s.head_dim);
  EXPECT_FLOAT_EQ(c.rope_base, s.rope_base);
  EXPECT_FLOAT_EQ(c.rms_eps, s.rms_eps);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tied_output);
  EXPECT_EQ(file->get_uint("general.file_type"), 15u);
  EXPECT_EQ(file->get_uint("general.quantization_version"), 2u);
  EXPECT_EQ(file->get_string("tokenizer.ggml.model"), "llama");
  const auto* tokens = file->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens);
  ASSERT_EQ(tokens->size(), 1024u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ((*tokens)[3 + 0x0A], "<0x0A>");
  EXPECT_EQ((*tokens)[258], "<0xFF>");
  EXPECT_EQ(std::set<std::string>(tokens->begin(), tokens->end()).size(), tokens->size()) << "duplicate tokens";
  const auto types = file->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types);
  EXPECT_EQ((*types)[0], 2);
  EXPECT_EQ((*types)[1], 3);
  EXPECT_EQ((*types)[3], 6);
  EXPECT_EQ((*types)[300], 1);
  EXPECT_EQ(file->get_float_array("tokenizer.ggml.scores")->size(), 1024u);
  EXPECT_EQ(file->get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(file->get_uint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(file->get_bool("tokenizer.ggml.add_bos_token"), true);
  // Without Q/K norm for llama, with an output head when untied.
  const auto llama = GgufFile::open(write(shape("tiny-llama"), "f16"));
  EXPECT_TRUE(llama->find_tensor("output.weight"));
  EXPECT_FALSE(llama->find_tensor("blk.0.attn_q_norm.weight"));
  EXPECT_EQ(llama->get_uint("general.file_type"), 1u);
  EXPECT_FALSE(llama->find("general.quantization_version"));
}

TEST_F(SynthTest, TokenizerRoundTripsText) {
  for (const char* sname : {"tiny", "tiny-llama"}) {
    SCOPED_TRACE(sname);
    const auto file = GgufFile::open(write(shape(sname), "q8_0"));
    const auto tok = Tokenizer::from_gguf(*file);
    EXPECT_EQ(tok->model_name(), "llama");
    EXPECT_EQ(tok->bos(), 1);
    EXPECT_EQ(tok->eos(), 2);
    for (const std::string text : {"Hello world", "the cat sat on the mat.", "x = 42; y = [1, 2, 3]!",
                                   "two  spaces\nand a newline", "na\xC3\xAFve caf\xC3\xA9 \xE2\x9C\x93"}) {
      const std::vector<TokenId> ids = tok->encode(text);
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids[0], 1) << "BOS first";
      for (TokenId id : ids) EXPECT_TRUE(id >= 0 && id < tok->n_vocab());
      EXPECT_EQ(tok->decode(ids), text);
    }
  }
  // Pieces are used: " hello" is four pieces ("▁h", "el", "l", "o"), not six symbols.
  const auto file = GgufFile::open(write(shape("tiny"), "q8_0"));
  const auto tok = Tokenizer::from_gguf(*file);
  const std::vector<TokenId> ids = tok->encode("hello", {.add_bos = false});
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(tok->token_text(ids[0]), "\xE2\x96\x81h");
  EXPECT_EQ(tok->encode("bad", {.add_bos = false}).size(), 2u);  // "▁ba", "d"
}

TEST_F(SynthTest, SameSeedSameBytesDifferentSeedDiffers) {
  const SynthShape& s = shape("tiny");
  const std::string a = read_all(write(s, "q4_k_m", 7, 2, "a.gguf"));
  const std::string b = read_all(write(s, "q4_k_m", 7, 1, "b.gguf"));  // thread count does not matter
  const std::string c = read_all(write(s, "q4_k_m", 8, 2, "c.gguf"));
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b);
  ASSERT_EQ(a.size(), c.size());
  // The data differs, not only the metadata.
  const auto f = GgufFile::open(dir + "/a.gguf");
  const GgufTensorInfo* t = f->find_tensor("blk.1.ffn_up.weight");
  ASSERT_TRUE(t);
  EXPECT_NE(a.substr(t->file_offset, t->n_bytes), c.substr(t->file_offset, t->n_bytes));
}

TEST_F(SynthTest, WeightsAreNormalWithStd002AndNormsNearOne) {
  const auto file = GgufFile::open(write(shape("tiny"), "f32"));
  const GgufTensorInfo* e = file->find_tensor("token_embd.weight");
  std::vector<float> w(e->n_elements);
  file->read(e->file_offset, w.data(), e->n_bytes);
  double sum = 0, sq = 0, within1 = 0;
  for (float x : w) {
    sum += x;
    sq += double(x) * x;
    within1 += std::fabs(x) < 0.02f;
  }
  const double mean = sum / w.size(), sd = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 3e-4);
  EXPECT_NEAR(sd, 0.02, 3e-4);
  EXPECT_NEAR(within1 / w.size(), 0.6827, 0.01);  // a normal, not a uniform
  const GgufTensorInfo* n = file->find_tensor("blk.0.attn_norm.weight");
  std::vector<float> g(n->n_elements);
  file->read(n->file_offset, g.data(), n->n_bytes);
  for (float x : g) EXPECT_NEAR(x, 1.0f, 0.1f);
}

TEST(SynthEncode, FastEncodersMatchTheKernelsLayouts) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.02f);
  const int64_t n = 4096;
  std::vector<float> x(n), back(n);
  for (float& v : x) v = nd(rng);
  x[5] = 0.09f;  // an outlier
  const KernelSet& ks = kernel_set(Isa::kScalar);
  // RMS error bounds in units of the std (about step / sqrt(12) per format).
  const std::pair<DType, double> cases[] = {{DType::kF16, 1e-3}, {DType::kQ8_0, 0.01}, {DType::kQ4_0, 0.12},
                                            {DType::kQ4_K, 0.12}, {DType::kQ5_K, 0.06}, {DType::kQ6_K, 0.035},
                                            {DType::kBF16, 0.005}, {DType::kF32, 0.0}};
  for (const auto& [type, bound] : cases) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    std::vector<uint8_t> ours(row_bytes(type, n)), lib(row_bytes(type, n));
    synth_encode_row(type, x.data(), ours.data(), n);
    quantize_row(type, x.data(), lib.data(), n);
    const auto rms = [&](const std::vector<uint8_t>& q) {
      ks.format(type)->to_float(q.data(), back.data(), n);
      double e = 0;
      for (int64_t i = 0; i < n; ++i) e += double(back[i] - x[i]) * (back[i] - x[i]);
      return std::sqrt(e / n) / 0.02;
    };
    const double e_ours = rms(ours), e_lib = rms(lib);
    EXPECT_LE(e_ours, bound);
    EXPECT_LE(e_ours, 1.6 * e_lib + 1e-6) << "library " << e_lib;
  }
}

TEST_F(SynthTest, MixesAssignTheDocumentedTypes) {
  const SynthShape& s = shape("tiny");
  for (const char* mix : {"q4_k_m", "q5_k_m"}) {
    SCOPED_TRACE(mix);
    const DType base = std::string(mix) == "q4_k_m" ? DType::kQ4_K : DType::kQ5_K;
    const auto file = GgufFile::open(write(s, mix));
    int q6 = 0;
    for (const GgufTensorInfo& t : file->tensors()) {
      SCOPED_TRACE(t.name);
      DType want = base;
      const int l = layer_of(t.name);
      if (t.dims.size() == 1) {
        want = DType::kF32;
      } else if (t.name == "token_embd.weight") {
        want = DType::kQ6_K;  // tied: the embedding is the output head
      } else if (t.name.ends_with("ffn_down.weight")) {
        want = DType::kQ8_0;  // rows of 320: not a multiple of 256
      } else if (t.name.ends_with("attn_v.weight") && more_bits(l, s.n_layer)) {
        want = DType::kQ6_K;
      }
      EXPECT_EQ(t.type, want);
      q6 += t.type == DType::kQ6_K;
    }
    EXPECT_EQ(q6, 2);  // token_embd, blk.1.attn_v (2 layers: only the last is in the last eighth)
  }
  // The full 28-layer rule: 14 layers get Q6_K attn_v and ffn_down.
  const std::set<int> expect = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};
  const SynthPlan p = plan_synth_model(shape("qwen3-0.6b"), *parse_synth_type("q4_k_m"));
  for (const SynthTensor& t : p.tensors) {
    SCOPED_TRACE(t.name);
    const int l = layer_of(t.name);
    if (t.dims.size() == 1) {
      EXPECT_EQ(t.type, DType::kF32);
    } else if (t.name == "token_embd.weight") {
      EXPECT_EQ(t.type, DType::kQ6_K);
    } else if (t.name.ends_with("attn_v.weight") || t.name.ends_with("ffn_down.weight")) {
      EXPECT_EQ(t.type, expect.count(l) ? DType::kQ6_K : DType::kQ4_K);
    } else {
      EXPECT_EQ(t.type, DType::kQ4_K);
    }
  }
  // Untied: the output head is Q6_K, token_embd the base type.
  const SynthPlan u = plan_synth_model(shape("tinyllama-1.1b"), *parse_synth_type("q5_k_m"));
  int v6 = 0;
  for (const SynthTensor& t : u.tensors) {
    if (t.name == "output.weight") {
      EXPECT_EQ(t.type, DType::kQ6_K);
    }
    if (t.name == "token_embd.weight") {
      EXPECT_EQ(t.type, DType::kQ5_K);
    }
    if (t.name.ends_with("attn_v.weight")) v6 += t.type == DType::kQ6_K;
  }
  EXPECT_EQ(v6, 10);  // 22 layers: 0, 1, 4, 7, 10, 13, 16, 19, 20, 21
}

TEST_F(SynthTest, RowsThatDoNotFitFallBackToQ8_0OrF16) {
  SynthShape s = shape("tiny");
  s.name = "odd-ffn";
  s.n_ff = 328;  // not a multiple of 32
  for (const char* type : {"q4_k", "q4_0", "q8_0", "q6_k"}) {
    SCOPED_TRACE(type);
    const SynthPlan p = plan_synth_model(s, *parse_synth_type(type));
    for (const SynthTensor& t : p.tensors) {
      if (t.name.ends_with("ffn_down.weight")) {
        EXPECT_EQ(t.type, DType::kF16);
      }
      if (t.name.ends_with("ffn_up.weight")) {
        EXPECT_EQ(t.type, parse_synth_type(type)->base);  // rows of 256 fit every format
      }
    }
  }
  s.n_ff = 320;
  for (const SynthTensor& t : plan_synth_model(s, *parse_synth_type("q6_k")).tensors) {
    if (t.name.ends_with("ffn_down.weight")) {
      EXPECT_EQ(t.type, DType::kQ8_0);
    }
  }
  // A file with an F16 fallback tensor among K-quants still runs.
  s.n_ff = 328;
  const std::string path = write(s, "q4_k_m");
  Engine engine(engine_options(path));
  Session session(engine);
  GenerateOptions go;
  go.max_tokens = 3;
  go.sampling.temperature = 0;
  go.stop_at_eog = false;
  EXPECT_EQ(generate(session, engine.tokenizer().encode("abc"), go, nullptr).tokens.size(), 3u);
}

TEST_F(SynthTest, Qwen3_0_6bQ4_0HasTheExactTensorsAndSize) {
  const SynthShape& s = shape("qwen3-0.6b");
  std::vector<uint64_t> progress;
  SynthOptions o;
  o.shape = s;
  o.type = *parse_synth_type("q4_0");
  o.progress = [&](uint64_t done, uint64_t total) { progress.push_back(done);
    EXPECT_GT(total, 0u); };
  const std::string path = dir + "/qwen3-0.6b-q4_0.gguf";
  write_synth_model(o, path);
  const SynthPlan plan = plan_synth_model(s, o.type);
  auto file = GgufFile::open(path);
  EXPECT_EQ(file->file_size(), plan.file_bytes);
  EXPECT_GT(file->file_size(), 330'000'000u);
  EXPECT_LT(file->file_size(), 450'000'000u);
  ASSERT_FALSE(progress.empty());
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(progress.back(), plan.file_bytes);

  ASSERT_EQ(file->tensors().size(), 1u + 28u * 11u + 1u);  // tied: no output.weight
  EXPECT_FALSE(file->find_tensor("output.weight"));
  using D = std::vector<int64_t>;
  const auto expect = [&](const std::string& name, D dims, DType type) {
    const GgufTensorInfo* t = file->find_tensor(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(t->dims, dims) << name;
    EXPECT_EQ(t->type, type) << name;
  };
  expect("token_embd.weight", D{1024, 151936}, DType::kQ4_0);
  expect("output_norm.weight", D{1024}, DType::kF32);
  for (int l = 0; l < 28; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    expect(b + "attn_norm.weight", D{1024}, DType::kF32);
    expect(b + "attn_q.weight", D{1024, 2048}, DType::kQ4_0);
    expect(b + "attn_k.weight", D{1024, 1024}, DType::kQ4_0);
    expect(b + "attn_v.weight", D{1024, 1024}, DType::kQ4_0);
    expect(b + "attn_output.weight", D{2048, 1024}, DType::kQ4_0);
    expect(b + "attn_q_norm.weight", D{128}, DType::kF32);
    expect(b + "attn_k_norm.weight", D{128}, DType::kF32);
    expect(b + "ffn_norm.weight", D{1024}, DType::kF32);
    expect(b + "ffn_gate.weight", D{1024, 3072}, DType::kQ4_0);
    expect(b + "ffn_up.weight", D{1024, 3072}, DType::kQ4_0);
    expect(b + "ffn_down.weight", D{3072, 1024}, DType::kQ4_0);
  }
  uint64_t params = 0;
  for (const GgufTensorInfo& t : file->tensors()) params += t.n_elements;
  EXPECT_EQ(params, s.n_params());
  const auto types = file->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types);
  ASSERT_EQ(types->size(), 151936u);
  EXPECT_EQ(types->back(), 5);
  EXPECT_EQ(file->get_string_array("tokenizer.ggml.tokens")->back(), "[PAD151935]");
  const ModelConfig c = read_model_config(*file);
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  file.reset();
  std::filesystem::remove(path);
}

TEST_F(SynthTest, BadInputThrowsNamingTheProblem) {
  SynthShape s = shape("tiny");
  s.n_head_kv = 3;
  try {
    plan_synth_model(s, *parse_synth_type("f16"));
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_head_kv"), std::string::npos) << e.what();
  }
  s = shape("tiny");
  s.arch = "gpt2";
  EXPECT_THROW(plan_synth_model(s, *parse_synth_type("f16")), Error);
  s = shape("tiny");
  s.n_vocab = 100;
  EXPECT_THROW(plan_synth_model(s, *parse_synth_type("f16")), Error);
  SynthOptions o;
  o.shape = shape("tiny");
  o.type = *parse_synth_type("q8_0");
  const std::string bad = dir + "/no/such/dir/x.gguf";
  EXPECT_THROW(write_synth_model(o, bad), Error);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

std::string golden_template(const std::string& name) {
  return read_all(test::shared_path("golden/templates/" + name + ".jinja"));
}

TEST(SynthTemplate, SpecialTokensAreTheFamilysMarkers) {
  const std::vector<std::string> qwen = synth_special_tokens(golden_template("Qwen-Qwen3-0.6B"));
  for (const char* t : {"<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
                        "<tool_response>", "</tool_response>"})
    EXPECT_NE(std::find(qwen.begin(), qwen.end(), t), qwen.end()) << t;
  EXPECT_EQ(std::set<std::string>(qwen.begin(), qwen.end()).size(), qwen.size()) << "each once";
  const std::vector<std::string> llama = synth_special_tokens(golden_template("meta-llama-Llama-3.1-8B-Instruct"));
  for (const char* t : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"})
    EXPECT_NE(std::find(llama.begin(), llama.end(), t), llama.end()) << t;
  const std::vector<std::string> mistral =
      synth_special_tokens(golden_template("mistralai-Mistral-Nemo-Instruct-2407"));
  for (const char* t : {"[INST]", "[/INST]", "[TOOL_CALLS]"})
    EXPECT_NE(std::find(mistral.begin(), mistral.end(), t), mistral.end()) << t;
  // Jinja's own brackets are not markers.
  EXPECT_TRUE(synth_special_tokens("{{ messages[0]['content'] }}{% if x[-1] %}[a]{% endif %}").empty());
}

TEST_F(SynthTest, ChatTemplateIsStoredAndItsMarkersAreSingleTokens) {
  SynthOptions o;
  o.shape = shape("tiny");
  o.type = *parse_synth_type("q8_0");
  o.chat_template = golden_template("Qwen-Qwen3-0.6B");
  const std::string path = dir + "/chat.gguf";
  write_synth_model(o, path);
  EXPECT_EQ(std::filesystem::file_size(path), plan_synth_model(o.shape, o.type, o.chat_template).file_bytes);
  const auto file = GgufFile::open(path);
  const auto tok = Tokenizer::from_gguf(*file);
  const TokenId im_start = tok->encode("<|im_start|>", {.add_bos = false, .parse_special = true}).at(0);
  const std::vector<TokenId> ids =
      tok->encode("<|im_start|>user\nhi<|im_end|><tool_call>", {.add_bos = false, .parse_special = true});
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(tok->token_text(ids.front()), "<|im_start|>");
  EXPECT_EQ(tok->token_text(ids.back()), "<tool_call>") << "the tag is one token";
  EXPECT_EQ(tok->token_text(tok->eos()), "<|im_end|>") << "the template's end of turn ends generation";
  // (SentencePiece puts its space prefix after a special token, as llama.cpp does.)
  EXPECT_EQ(tok->decode(ids, /*special=*/true), "<|im_start|> user\nhi<|im_end|><tool_call>");
  Engine engine(engine_options(path));
  EXPECT_EQ(engine.model().chat_template(), o.chat_template);
  EXPECT_TRUE(tok->is_control(im_start));
  EXPECT_FALSE(tok->is_control(ids.back())) << "<tool_call> is text, as in Qwen's own files";
  // Without a template the vocabulary is as before: no marker tokens.
  const auto plain = Tokenizer::from_gguf(*GgufFile::open(write(shape("tiny"), "q8_0")));
  EXPECT_EQ(plain->eos(), 2);
  EXPECT_GT(plain->encode("<|im_start|>", {.add_bos = false, .parse_special = true}).size(), 1u);
}

// A control-token marker (Mistral's [TOOL_CALLS]) renders as nothing in
// generated text unless the generation shows it, as the server does for the
// chat format's preserved tokens so that its parser sees the call.
TEST_F(SynthTest, ShownSpecialTokensReachTheGeneratedText) {
  SynthOptions o;
  o.shape = shape("tiny");
  o.type = *parse_synth_type("q8_0");
  o.chat_template = golden_template("mistralai-Mistral-Nemo-Instruct-2407");
  const std::string path = dir + "/mistral.gguf";
  write_synth_model(o, path);
  Engine engine(engine_options(path));
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<TokenId> marker = tok.encode("[TOOL_CALLS]", {.add_bos = false, .parse_special = true});
  ASSERT_EQ(marker.size(), 1u);
  ASSERT_TRUE(tok.is_control(marker[0]));
  const auto run = [&](bool shown) {
    GenerateOptions go;
    go.max_tokens = 3;
    go.sampling.temperature = 0;
    go.sampling.logit_bias = {{marker[0], 100.0f}};  // the marker, every step
    if (shown) go.shown_special_tokens = marker;
    Session s(engine);
    std::string text;
    generate(s, tok.encode("Once"), go, [&](std::string_view piece) {
      text += piece;
      return true;
    });
    return text;
  };
  EXPECT_EQ(run(false), "");
  EXPECT_EQ(run(true), "[TOOL_CALLS][TOOL_CALLS][TOOL_CALLS]");
}

TEST_F(SynthTest, CommandLineWritesListsAndRejects) {
  const auto run = [&](const std::string& args) {
    return std::system((std::string(EBB_CLI_PATH) + " synth " + args + " >" + dir + "/out.txt 2>&1").c_str());
  };
  const std::string out = dir + "/cli.gguf";
  EXPECT_EQ(run("tiny --type q5_k_m -o " + out + " --seed 3 --threads 2"), 0);
  EXPECT_EQ(std::filesystem::file_size(out), plan_synth_model(shape("tiny"), *parse_synth_type("q5_k_m")).file_bytes);
  EXPECT_NE(read_all(dir + "/out.txt").find("wrote " + out), std::string::npos);
  EXPECT_EQ(run("--list"), 0);
  EXPECT_NE(read_all(dir + "/out.txt").find("qwen3-0.6b"), std::string::npos);
  EXPECT_NE(run("nope --type q8_0 -o " + out), 0);
  EXPECT_NE(read_all(dir + "/out.txt").find("unknown shape"), std::string::npos);
  EXPECT_NE(run("tiny --type iq2_xxs -o " + out), 0);
  EXPECT_NE(run("tiny --type q8_0"), 0);
  {
    std::ofstream bad(dir + "/bad.jinja");
    bad << "{% for m in messages %}{{ m.content }";
  }
  EXPECT_NE(run("tiny --type q8_0 -o " + out + " --chat-template " + dir + "/bad.jinja"), 0);
  EXPECT_NE(read_all(dir + "/out.txt").find("--chat-template"), std::string::npos) << read_all(dir + "/out.txt");
  EXPECT_EQ(run("tiny --type q8_0 -o " + out + " --chat-template " + test::shared_path("golden/templates/Qwen-Qwen3-0.6B.jinja")),
            0);
  EXPECT_TRUE(GgufFile::open(out)->get_string("tokenizer.chat_template").has_value());
}

}  // namespace
}  // namespace ebb
