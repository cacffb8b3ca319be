// The forward pass against the reference engine's outputs in
// ../shared/golden/models, on every kernel target this machine can run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

struct Param {
  std::string model;
  Isa isa;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  std::string s = p.param.model + "_" + std::string(isa_name(p.param.isa));
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::unique_ptr<Engine> make_engine(const std::string& model, Isa isa, int64_t batch = 64) {
  EngineOptions o;
  o.model_path = test::model_path(model + ".gguf");
  o.n_threads = 2;
  o.isa = isa;
  o.prefill_batch = batch;
  return std::make_unique<Engine>(o);
}

// Logits after every token of prompt + greedy continuation, computed the way
// the reference produced them: the prompt as one prefill, then each
// continuation token as a decode step.
std::vector<float> all_logits(Engine& e, const test::GoldenCase& c, SessionOptions so = {}) {
  Session s(e, so);
  std::vector<float> out, step;
  s.feed(c.prompt_tokens, &out);
  for (TokenId t : c.greedy_tokens) {
    const TokenId one[1] = {t};
    s.feed(one, &step);
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

int argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

std::vector<Param> stories_params() {
  std::vector<Param> p;
  for (Isa isa : supported_isas())
    for (const char* m : {"stories260K", "stories260K-f16"}) p.push_back({m, isa});
  return p;
}

class GoldenStories : public testing::TestWithParam<Param> {};

// Largest logit difference at every position within 1e-3 x the largest
// absolute golden logit, and greedy generation reproduces the golden tokens.
TEST_P(GoldenStories, LogitsAndGreedyTokensMatch) {
  auto engine = make_engine(GetParam().model, GetParam().isa);
  const int64_t V = engine->config().n_vocab;
  for (const test::GoldenCase& c : test::load_golden(GetParam().model)) {
    SCOPED_TRACE(c.prompt);
    EXPECT_EQ(engine->tokenizer().encode(c.prompt), c.prompt_tokens);
    const std::vector<float> got = all_logits(*engine, c);
    ASSERT_EQ(got.size(), c.logits.size() * V);
    for (size_t pos = 0; pos < c.logits.size(); ++pos) {
      const std::vector<float>& ref = c.logits[pos];
      ASSERT_EQ(static_cast<int64_t>(ref.size()), V);
      float max_ref = 0, max_diff = 0;
      for (int64_t i = 0; i < V; ++i) {
        max_ref = std::max(max_ref, std::fabs(ref[i]));
        max_diff = std::max(max_diff, std::fabs(ref[i] - got[pos * V + i]));
      }
      EXPECT_LE(max_diff, 1e-3f * max_ref) << "position " << pos;
    }
    // Real greedy generation, token by token.
    Session s(*engine);
    GenerateOptions go;
    go.max_tokens = static_cast<int64_t>(c.greedy_tokens.size());
    go.sampling.temperature = 0;
    go.stop_at_eog = false;
    const GenerateStats st = generate(s, c.prompt_tokens, go, nullptr);
    EXPECT_EQ(st.tokens, c.greedy_tokens);
    EXPECT_EQ(st.text, c.greedy_text);
  }
}
INSTANTIATE_TEST_SUITE_P(Golden, GoldenStories, testing::ValuesIn(stories_params()), param_name);

std::vector<Param> tiny_params() {
  std::vector<Param> p;
  for (Isa isa : supported_isas())
    for (const char* arch : {"tiny-llama", "tiny-qwen3"})
      for (const char* f : {"f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"})
        p.push_back({std::string(arch) + "-" + f, isa});
  return p;
}

class GoldenTiny : public testing::TestWithParam<Param> {};

// Normalised error per position and top-1 agreement against the reference.
TEST_P(GoldenTiny, LogitsMatchByNormalisedError) {
  auto engine = make_engine(GetParam().model, GetParam().isa);
  const bool exact_format = GetParam().model.ends_with("f16");  // f16 and bf16
  const double max_nmse = exact_format ? 1e-5 : 1e-3;
  const int64_t V = engine->config().n_vocab;
  int agree = 0, total = 0;
  double worst = 0;
  for (const test::GoldenCase& c : test::load_golden(GetParam().model)) {
    const std::vector<float> got = all_logits(*engine, c);
    ASSERT_EQ(got.size(), c.logits.size() * V);
    for (size_t pos = 0; pos < c.logits.size(); ++pos) {
      const std::vector<float>& ref = c.logits[pos];
      double err = 0, norm = 0;
      for (int64_t i = 0; i < V; ++i) {
        const double d = double(got[pos * V + i]) - ref[i];
        err += d * d;
        norm += double(ref[i]) * ref[i];
      }
      const double nmse = err / std::max(norm, 1e-30);
      worst = std::max(worst, nmse);
      EXPECT_LE(nmse, max_nmse) << c.prompt << " position " << pos;
      agree += argmax(&got[pos * V], V) == argmax(ref.data(), V);
      ++total;
    }
  }
  RecordProperty("worst_nmse", std::to_string(worst));
  EXPECT_GE(agree, 0.98 * total) << agree << " of " << total << " positions agree on the top token";
}
INSTANTIATE_TEST_SUITE_P(Golden, GoldenTiny, testing::ValuesIn(tiny_params()), param_name);

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// Attention across chunk boundaries is exact: chunk size 4 and 256 agree.
TEST(GoldenKv, ChunkSizeDoesNotChangeLogits) {
  for (const char* m : {"stories260K", "tiny-qwen3-q8_0"}) {
    auto engine = make_engine(m, best_isa());
    const auto cases = test::load_golden(m);
    SessionOptions small;
    small.kv_chunk_size = 4;
    SessionOptions big;
    big.kv_chunk_size = 256;
    EXPECT_LE(max_rel_diff(all_logits(*engine, cases[1], small), all_logits(*engine, cases[1], big)), 1e-5) << m;
  }
}

// F32 KV also matches the reference within tolerance.
TEST(GoldenKv, F32KvMatchesReference) {
  auto engine = make_engine("stories260K", best_isa());
  const auto c = test::load_golden("stories260K")[0];
  SessionOptions so;
  so.kv_type = DType::kF32;
  const std::vector<float> got = all_logits(*engine, c, so);
  const int64_t V = engine->config().n_vocab;
  for (size_t pos = 0; pos < c.logits.size(); ++pos) {
    float max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < V; ++i) {
      max_ref = std::max(max_ref, std::fabs(c.logits[pos][i]));
      max_diff = std::max(max_diff, std::fabs(c.logits[pos][i] - got[pos * V + i]));
    }
    EXPECT_LE(max_diff, 1e-3f * max_ref) << "position " << pos;
  }
}

// A prompt fed in two turns (and in micro-batches of 3) gives the logits of one turn.
TEST(GoldenKv, TwoTurnsEqualOneTurn) {
  auto engine = make_engine("tiny-llama-q4_k_m", best_isa(), /*batch=*/3);
  const auto c = test::load_golden("tiny-llama-q4_k_m")[1];
  const int64_t V = engine->config().n_vocab;
  std::vector<float> one;
  {
    Session s(*engine);
    s.feed(c.prompt_tokens, &one);
  }
  Session s(*engine);
  const size_t half = c.prompt_tokens.size() / 2;
  std::vector<float> a, b;
  s.feed(std::span(c.prompt_tokens).first(half), &a);
  s.feed(std::span(c.prompt_tokens).subspan(half), &b);
  a.insert(a.end(), b.begin(), b.end());
  ASSERT_EQ(a.size(), c.prompt_tokens.size() * V);
  EXPECT_LE(max_rel_diff(a, one), 1e-5);
  EXPECT_EQ(s.n_processed(), static_cast<int64_t>(c.prompt_tokens.size()));
}

}  // namespace
}  // namespace ebb
