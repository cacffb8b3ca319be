// ebb inspect on every valid GGUF: the file type by name, the parameter
// count, the tensor types, and files ebb cannot run (tensor types without
// kernels) inspected all the same, exit 0.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "support.h"

namespace ebb {
namespace {

using test::run_cli;

// The parameter count inspect must print: every tensor's elements.
uint64_t param_count(const std::string& path) {
  auto f = GgufFile::open(path);
  uint64_t n = 0;
  for (const GgufTensorInfo& t : f->tensors()) n += t.n_elements;
  return n;
}

TEST(CliInspect, NamesTheFileTypeAndCountsParameters) {
  struct Case {
    const char* file;
    const char* type;
  };
  for (const Case& c : {Case{"tiny-qwen2-q4_k_m.gguf", "MOSTLY_Q4_K_M (15)"}, Case{"tiny-llama-q3_k_m.gguf", "MOSTLY_Q3_K_M (12)"},
                        Case{"tiny-qwen3-iq4_xs.gguf", "MOSTLY_IQ4_XS (30)"}, Case{"tiny-llama-q5_1.gguf", "MOSTLY_Q5_1 (9)"}}) {
    const std::string path = test::model_path(c.file);
    const auto r = run_cli("inspect " + path);
    ASSERT_EQ(r.status, 0) << c.file << ": " << r.err;
    EXPECT_NE(r.out.find(std::string("file type: ") + c.type), std::string::npos) << c.file << "\n" << r.out;
    EXPECT_NE(r.out.find("parameters: " + std::to_string(param_count(path)) + " "), std::string::npos) << c.file;
    // Every type is computable now: no "cannot" line, and the model section.
    EXPECT_EQ(r.out.find("cannot"), std::string::npos) << c.file << "\n" << r.out;
    EXPECT_NE(r.out.find("KV per 1k tokens"), std::string::npos) << c.file;
  }
  // The Qwen2.5-shaped file: its fallback types are counted.
  const auto r = run_cli("inspect --no-tensors " + test::model_path("tiny-qwen2-q4_k_m.gguf"));
  EXPECT_NE(r.out.find("Q5_0 x 24"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Q8_0 x 5"), std::string::npos) << r.out;
}

// A valid file holding a tensor type ebb has no kernels for (IQ2_XXS, as
// llama.cpp's IQ2 mixes write): inspected, the type listed as one ebb cannot
// compute with, the reason it cannot run printed, exit 0.
TEST(CliInspect, ListsTypesEbbCannotComputeWith) {
  test::TempDir dir("ebb-inspect");
  const std::string path = dir.file("iq2.gguf");
  size_t written_iq2 = 0;
  {
    auto src = GgufFile::open(test::model_path("tiny-qwen3-q4_0.gguf"));
    GgufWriter w;
    for (const auto& [key, value] : src->metadata()) w.set(key, value);
    std::vector<const GgufTensorInfo*> infos;
    for (const GgufTensorInfo& t : src->tensors()) {
      // The FFN up matrices (256 columns) as IQ2_XXS.
      const bool iq2 = t.name.find("ffn_up") != std::string::npos && t.dims[0] % 256 == 0;
      w.add_tensor(t.name, t.dims, iq2 ? DType::kIQ2_XXS : t.type);
      written_iq2 += iq2;
      infos.push_back(&t);
    }
    w.write(path, [&](size_t i, uint8_t* dst) {
      const GgufTensorInfo& t = *infos[i];
      const bool iq2 = t.name.find("ffn_up") != std::string::npos && t.dims[0] % 256 == 0;
      if (iq2) {
        std::memset(dst, 0, row_bytes(DType::kIQ2_XXS, t.dims[0]) * (t.n_elements / t.dims[0]));
      } else {
        src->read(t.file_offset, dst, t.n_bytes);
      }
    });
  }
  auto f = GgufFile::open(path);
  size_t n_iq2 = 0;
  for (const GgufTensorInfo& t : f->tensors()) n_iq2 += t.type == DType::kIQ2_XXS;
  ASSERT_GT(written_iq2, 0u);  // one per layer
  ASSERT_EQ(n_iq2, written_iq2);
  const auto r = run_cli("inspect " + path);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("IQ2_XXS x " + std::to_string(n_iq2)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("types ebb cannot compute with: IQ2_XXS (" + std::to_string(n_iq2) + " tensors)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ebb cannot run this model:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("which ebb cannot compute with"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters: " + std::to_string(param_count(path)) + " "), std::string::npos) << r.out;
  // And running it is a clear error, not a crash.
  const auto run = run_cli("run -m " + path + " -p hi -n 1");
  EXPECT_EQ(run.status, 1) << run.err;
  EXPECT_NE(run.err.find("IQ2_XXS"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace ebb
