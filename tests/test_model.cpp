// Loading models: an unsupported architecture, a missing or misshapen
// tensor, or a tensor format without kernels is an error that names it.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <functional>

#include "model/config.h"
#include "model/gguf.h"
#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

struct Edit {
  std::function<void(GgufWriter&)> metadata;  // applied after copying the metadata
  std::string drop_tensor;                    // omitted from the copy
  std::string retype_tensor;                  // written with `new_type` instead
  DType new_type = DType::kF32;
  std::string reshape_tensor;                 // written with its two dims swapped
  std::vector<float> rope_freqs;              // appended as rope_freqs.weight (F32) when not empty
  std::vector<int64_t> rope_freqs_dims;       // its dims (default: {rope_freqs.size()})
};

// Copies a shared model into `out`, applying the edit.
void rewrite(const std::string& model, const std::string& out, const Edit& e) {
  auto src = GgufFile::open(test::model_path(model));
  GgufWriter w;
  for (const auto& [k, v] : src->metadata()) w.set(k, v);
  if (e.metadata) e.metadata(w);
  std::vector<const GgufTensorInfo*> kept;
  for (const GgufTensorInfo& t : src->tensors()) {
    if (t.name == e.drop_tensor) continue;
    std::vector<int64_t> dims = t.dims;
    DType type = t.type;
    if (t.name == e.retype_tensor) type = e.new_type;
    if (t.name == e.reshape_tensor) std::swap(dims[0], dims[1]);
    w.add_tensor(t.name, dims, type);
    kept.push_back(&t);
  }
  if (!e.rope_freqs.empty()) {
    w.add_tensor("rope_freqs.weight",
                 e.rope_freqs_dims.empty() ? std::vector<int64_t>{static_cast<int64_t>(e.rope_freqs.size())} : e.rope_freqs_dims,
                 DType::kF32);
  }
  w.write(out, [&](size_t i, uint8_t* dst) {
    if (i == kept.size()) {  // rope_freqs.weight
      std::memcpy(dst, e.rope_freqs.data(), e.rope_freqs.size() * sizeof(float));
      return;
    }
    const GgufTensorInfo& t = *kept[i];
    uint64_t n = t.n_bytes;
    if (t.name == e.retype_tensor) n = std::min<uint64_t>(n, t.n_elements / type_info(e.new_type).block_size *
                                                              type_info(e.new_type).block_bytes);
    std::vector<uint8_t> buf(t.n_bytes);
    src->read(t.file_offset, buf.data(), t.n_bytes);
    std::memset(dst, 0, n);
    std::memcpy(dst, buf.data(), std::min<uint64_t>(n, t.n_bytes));
  });
}

class ModelLoad : public testing::Test {
 protected:
  void SetUp() override { dir = test::make_temp_dir("ebb-model"); }
  void TearDown() override { std::filesystem::remove_all(dir); }

  // Loads the edited model and returns the error message ("" when it loads).
  std::string load_error(const std::string& model, const Edit& e) {
    const std::string path = dir + "/m.gguf";
    rewrite(model, path, e);
    try {
      EngineOptions o;
      o.model_path = path;
      o.n_threads = 1;
      Engine engine(o);
      return "";
    } catch (const Error& err) {
      return err.what();
    }
  }
  std::string dir;
};

TEST_F(ModelLoad, UnmodifiedCopyLoads) { EXPECT_EQ(load_error("tiny-qwen3-q4_k_m.gguf", {}), ""); }

TEST_F(ModelLoad, UnsupportedArchitectureIsNamed) {
  Edit e;
  e.metadata = [](GgufWriter& w) { w.set_string("general.architecture", "mamba"); };
  const std::string msg = load_error("stories260K.gguf", e);
  EXPECT_NE(msg.find("unsupported architecture 'mamba'"), std::string::npos) << msg;
}

TEST_F(ModelLoad, MissingTensorIsNamed) {
  Edit e;
  e.drop_tensor = "blk.2.ffn_up.weight";
  const std::string msg = load_error("stories260K.gguf", e);
  EXPECT_NE(msg.find("missing tensor 'blk.2.ffn_up.weight'"), std::string::npos) << msg;
}

TEST_F(ModelLoad, MissingQkNormInQwen3IsNamed) {
  Edit e;
  e.drop_tensor = "blk.0.attn_q_norm.weight";
  const std::string msg = load_error("tiny-qwen3-f16.gguf", e);
  EXPECT_NE(msg.find("blk.0.attn_q_norm.weight"), std::string::npos) << msg;
}

TEST_F(ModelLoad, WrongShapeIsNamed) {
  Edit e;
  e.reshape_tensor = "blk.1.ffn_gate.weight";
  const std::string msg = load_error("stories260K.gguf", e);
  EXPECT_NE(msg.find("blk.1.ffn_gate.weight' has shape [172, 64], expected [64, 172]"), std::string::npos) << msg;
}

TEST_F(ModelLoad, FormatWithoutKernelsIsNamed) {
  Edit e;
  e.retype_tensor = "blk.0.attn_q.weight";
  e.new_type = DType::kMXFP4;
  const std::string msg = load_error("tiny-llama-q8_0.gguf", e);
  EXPECT_NE(msg.find("blk.0.attn_q.weight' has type MXFP4"), std::string::npos) << msg;
}

TEST_F(ModelLoad, MissingRequiredKeyIsNamed) {
  auto src = GgufFile::open(test::model_path("stories260K.gguf"));
  GgufWriter w;
  for (const auto& [k, v] : src->metadata())
    if (k != "llama.embedding_length") w.set(k, v);
  const std::string path = dir + "/m.gguf";
  w.write(path, [](size_t, uint8_t*) {});
  auto f = GgufFile::open(path);
  try {
    read_model_config(*f);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("llama.embedding_length"), std::string::npos) << err.what();
  }
}

TEST_F(ModelLoad, ImpossibleHeadCountIsAnError) {
  Edit e;
  e.metadata = [](GgufWriter& w) { w.set_uint32("llama.attention.head_count_kv", 3); };
  const std::string msg = load_error("stories260K.gguf", e);
  EXPECT_NE(msg.find("head_count"), std::string::npos) << msg;
}

// Llama 3.1+ files carry rope_freqs.weight: its factors reach the config and
// change the RoPE angles; all-ones factors leave the logits bit for bit as
// without the tensor; a misshapen or non-positive one is an error naming it.
TEST_F(ModelLoad, RopeFreqsTensorScalesRope) {
  const std::string model = "tiny-llama-f16.gguf";
  auto src = GgufFile::open(test::model_path(model));
  const int64_t half = read_model_config(*src).rope_dim / 2;
  auto logits = [&](const Edit& e) {
    const std::string path = dir + "/rf.gguf";
    rewrite(model, path, e);
    EngineOptions o;
    o.model_path = path;
    o.n_threads = 1;
    Engine engine(o);
    Session s(engine);
    std::vector<float> all;
    const TokenId prompt[] = {1, 403, 407, 261, 378, 290};
    s.feed(prompt, &all);
    return std::make_pair(all, engine.config().rope_freq_factors);
  };
  const auto [plain, none] = logits({});
  EXPECT_TRUE(none.empty());
  Edit ones;
  ones.rope_freqs.assign(half, 1.0f);
  const auto [same, f1] = logits(ones);
  EXPECT_EQ(f1, ones.rope_freqs);
  EXPECT_EQ(same, plain);
  Edit scaled;
  for (int64_t i = 0; i < half; ++i) scaled.rope_freqs.push_back(1.0f + 7.0f * static_cast<float>(i) / half);
  const auto [other, f2] = logits(scaled);
  EXPECT_EQ(f2, scaled.rope_freqs);
  EXPECT_NE(other, plain);

  Edit bad_shape;
  bad_shape.rope_freqs.assign(half + 2, 1.0f);
  EXPECT_NE(load_error(model, bad_shape).find("rope_freqs.weight' must be F32 [" + std::to_string(half) + "]"),
            std::string::npos);
  Edit zero = ones;
  zero.rope_freqs[3] = 0.0f;
  EXPECT_NE(load_error(model, zero).find("factors must be > 0"), std::string::npos) << load_error(model, zero);
}

TEST_F(ModelLoad, ConfigReadsQwen3Features) {
  auto f = GgufFile::open(test::model_path("tiny-qwen3-q8_0.gguf"));
  const ModelConfig c = read_model_config(*f);
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tied_output);
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_FLOAT_EQ(c.rope_base, 1e6f);
  auto g = GgufFile::open(test::model_path("stories260K.gguf"));
  const ModelConfig s = read_model_config(*g);
  EXPECT_EQ(s.rope_style, RopeStyle::kNorm);
  EXPECT_FALSE(s.tied_output);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.rope_dim, 8);
}

}  // namespace
}  // namespace ebb
