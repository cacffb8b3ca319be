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

void PrintTo(const Param& p, std::ostream* os) { *os << p.model << " on " << isa_name(p.isa); }

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

SessionOptions reference_attention() {
  SessionOptions so;
  so.f16_attention = true;
  return so;
}

// Logits after every token of prompt + greedy continuation, computed the way
// the reference produced them: the prompt as one prefill, then each
// continuation token as a decode step.
// With F16 KV the attention runs the reference's half-precision arithmetic
// (SessionOptions::f16_attention) unless the caller turns it off.
std::vector<float> all_logits(Engine& e, const test::GoldenCase& c, SessionOptions so = reference_attention()) {
  Session s(e, so);
  std::vector<float> out, step;
  s.feed(c.prompt_tokens, &out);
  // The reference stops recording after an end-of-generation token, so the
  // golden file may hold one row fewer than prompt + continuation.
  const size_t steps = c.logits.size() - c.prompt_tokens.size();
  for (size_t i = 0; i < steps && i < c.greedy_tokens.size(); ++i) {
    const TokenId one[1] = {c.greedy_tokens[i]};
    s.feed(one, &step);
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

int argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// Normalised squared error of one position's logits against the golden row.
double nmse(const float* got, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    err += d * d;
    norm += double(ref[i]) * ref[i];
  }
  return err / std::max(norm, 1e-30);
}

std::vector<Param> stories_params() {
  std::vector<Param> p;
  for (Isa isa : supported_isas())
    for (const char* m : {"stories260K", "stories260K-f16"}) p.push_back({m, isa});
  return p;
}

class GoldenStories : public testing::TestWithParam<Param> {};

// Largest logit difference at every position within 1e-3 x the largest
// absolute golden logit (the F16 file on the fast targets 1.5e-3, see below),
// and greedy generation reproduces the golden tokens and text.
//
// Why 1.5e-3 for the F16 file on the fast targets: the reference rounds
// activations to F16 for F16 weights and does its F16-KV attention in half
// precision; ebb does the same, but its sums run in a different order, and a
// last-bit difference before an F16 rounding becomes a one-ulp (5e-4
// relative) difference after it. The measured worst case over all 324
// positions is 1.26e-3. The ref-engine target sums in the reference's order:
// the F16 file is reproduced to the golden file's printed digits (NMSE about
// 1e-11 at every position) and the F32 one to NMSE 3e-8 (an F32 sum whose
// order is not reproduced exactly yet), so there it is held to NMSE 1e-7.
TEST_P(GoldenStories, LogitsAndGreedyTokensMatch) {
  auto engine = make_engine(GetParam().model, GetParam().isa);
  const bool ref_engine = GetParam().isa == Isa::kRefEngine;
  const float tol = GetParam().model == "stories260K" || ref_engine ? 1e-3f : 1.5e-3f;
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
      EXPECT_LE(max_diff, tol * max_ref) << "position " << pos;
      if (ref_engine) {
        EXPECT_LE(nmse(&got[pos * V], ref), 1e-7) << "position " << pos;
      }
    }
    // Real greedy generation, token by token, in both attention arithmetics
    // (the default F32 one and the reference's).
    for (bool f16_attention : {false, true}) {
      SCOPED_TRACE(f16_attention ? "f16 attention" : "f32 attention");
      SessionOptions so;
      so.f16_attention = f16_attention;
      Session s(*engine, so);
      GenerateOptions go;
      go.max_tokens = static_cast<int64_t>(c.greedy_tokens.size());
      go.sampling.temperature = 0;
      go.stop_at_eog = false;
      const GenerateStats st = generate(s, c.prompt_tokens, go, nullptr);
      ASSERT_EQ(st.tokens.size(), c.greedy_tokens.size());
      size_t first_diff = 0;
      while (first_diff < st.tokens.size() && st.tokens[first_diff] == c.greedy_tokens[first_diff]) ++first_diff;
      if (first_diff == st.tokens.size()) {
        EXPECT_EQ(st.text, c.greedy_text);
      } else {
        // Greedy decoding may only part ways at a near-tie: where the golden's
        // top two logits are closer than the logit tolerance, either token is
        // right within the reference's own precision.
        const std::vector<float>& row = c.logits[c.prompt_tokens.size() - 1 + first_diff];
        std::vector<float> sorted = row;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        float max_ref = 0;
        for (float v : row) max_ref = std::max(max_ref, std::fabs(v));
        EXPECT_LT(sorted[0] - sorted[1], tol * max_ref) << "greedy tokens differ at " << first_diff;
        EXPECT_EQ(row[st.tokens[first_diff]], sorted[1]) << "ebb chose a token that is not the golden runner-up";
        RecordProperty("near_tie_at", static_cast<int>(first_diff));
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Golden, GoldenStories, testing::ValuesIn(stories_params()), param_name);

std::vector<Param> tiny_params() {
  std::vector<Param> p;
  for (Isa isa : supported_isas())
    for (const char* arch : {"tiny-llama", "tiny-qwen3"})
      for (const char* f : {"f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "q4_1", "q5_0", "q5_1", "q2_k",
                            "q3_k_m", "iq4_nl", "iq4_xs"})
        p.push_back({std::string(arch) + "-" + f, isa});
  // Widths 320 and 896: its Q4_K_M file is all fallbacks (Q5_0, Q8_0), as
  // real Qwen2.5-0.5B files are.
  for (Isa isa : supported_isas())
    for (const char* f : {"f16", "q4_k_m"}) p.push_back({std::string("tiny-qwen2-") + f, isa});
  return p;
}

class GoldenTiny : public testing::TestWithParam<Param> {};


// Normalised error per position and top-1 agreement against the reference.
//
// Position 0 runs every kernel (embedding, norms, every matmul format with
// its activation quantization, RoPE, the output head) but attention over a
// single position, so it must agree almost exactly: measured NMSE about
// 2e-12 on tiny-llama Q4_0, Q4_K_M, F16 and BF16 and tiny-qwen3 Q6_K, and
// 1.4e-5 on tiny-llama Q8_0.
//
// Later positions: these models have random weights, which makes them
// chaotic: a one-ulp difference in an F16 attention accumulator, or one
// 8-bit activation landing on the other side of a rounding step, moves the
// logits by up to 3% RMS.
//
// The ref-engine target rounds where and as the reference does (its sums in
// its order, its exp, its RoPE angles, its fused multiply-adds), and
// reproduces every position of all fourteen files to the golden file's
// printed digits (NMSE below 3e-12), every top token included: it is held to
// NMSE 1e-9 and full agreement, well inside the bounds (1e-3 for the
// quantized formats, 1e-5 for F16 and BF16, 98% top-1). A change to any of
// those roundings breaks it.
//
// The fast targets sum in their own orders, so their logits part from the
// reference's at the first activation that rounds the other way; their bounds
// are the measured noise floor with margin (worst seen: F16 2e-6, BF16
// 5.1e-5, quantized 2.5e-3 NMSE; top-1 agreement 94% at worst).
TEST_P(GoldenTiny, LogitsMatchByNormalisedError) {
  auto engine = make_engine(GetParam().model, GetParam().isa);
  const std::string& m = GetParam().model;
  const bool bf16 = m.ends_with("bf16"), f16 = !bf16 && m.ends_with("f16");
  // Q2_K and IQ4_NL: the ref-engine target sums as the reference's one-row
  // kernels do, but its logits still part from the golden ones after a few
  // positions (NMSE 3e-4 to 5e-4 from there on, as a fast target's), so that
  // engine computes these two formats in another order somewhere (a packed
  // layout, probably) that is not reproduced yet: the fast targets' bounds.
  const bool ref_order_unknown = m.ends_with("q2_k") || m.ends_with("iq4_nl");
  const bool ref_engine = GetParam().isa == Isa::kRefEngine && !ref_order_unknown;
  const double max_nmse = ref_engine ? 1e-9 : f16 ? 1e-5 : bf16 ? 1e-4 : 4e-3;
  const double min_top1 = ref_engine ? 1.0 : f16 || bf16 ? 0.98 : 0.90;
  // Position 0 on tiny-qwen2-q4_k_m (width 896, every matrix Q5_0 or Q8_0, so
  // every product's input is rounded to 8 bits): on the fast targets one
  // activation byte rounds the other way (an exp or a sum in the last bit)
  // and moves the logits by 1.3% RMS; measured NMSE 1.67e-4 on scalar and
  // AVX2 (the ref-engine target: below 1e-11).
  const double max_nmse0 = m == "tiny-qwen2-q4_k_m" && GetParam().isa != Isa::kRefEngine ? 5e-4 : 2e-5;
  const int64_t V = engine->config().n_vocab;
  int agree = 0, total = 0;
  double worst = 0;
  for (const test::GoldenCase& c : test::load_golden(m)) {
    const std::vector<float> got = all_logits(*engine, c);
    ASSERT_EQ(got.size(), c.logits.size() * V);
    EXPECT_LE(nmse(&got[0], c.logits[0]), max_nmse0) << c.prompt << " position 0";
    for (size_t pos = 0; pos < c.logits.size(); ++pos) {
      const double e = nmse(&got[pos * V], c.logits[pos]);
      worst = std::max(worst, e);
      EXPECT_LE(e, max_nmse) << c.prompt << " position " << pos;
      agree += argmax(&got[pos * V], V) == argmax(c.logits[pos].data(), V);
      ++total;
    }
  }
  RecordProperty("worst_nmse", std::to_string(worst));
  EXPECT_GE(agree, min_top1 * total) << agree << " of " << total << " positions agree on the top token";
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

// Attention across chunk boundaries is exact: chunk size 4 and 256 give the
// same logits, bit for bit in the half-precision arithmetic (position by
// position) and to float rounding in the F32 one.
TEST(GoldenKv, ChunkSizeDoesNotChangeLogits) {
  for (const char* m : {"stories260K", "tiny-qwen3-q8_0"}) {
    auto engine = make_engine(m, best_isa());
    const auto cases = test::load_golden(m);
    SessionOptions small = reference_attention();
    small.kv_chunk_size = 4;
    SessionOptions big = reference_attention();
    big.kv_chunk_size = 256;
    EXPECT_EQ(all_logits(*engine, cases[1], small), all_logits(*engine, cases[1], big)) << m;
    // F16 KV in the F32 arithmetic: the softmax blocks end at chunk ends, so
    // sums round differently. On the 8-bit model a last-bit change can move
    // an activation across a quantization step (a few % of the logits), so
    // only the F32 model is held to a bound here.
    small.f16_attention = big.f16_attention = false;
    if (std::string(m) == "stories260K") {
      EXPECT_LE(max_rel_diff(all_logits(*engine, cases[1], small), all_logits(*engine, cases[1], big)), 1e-4) << m;
    }
    small.kv_type = big.kv_type = DType::kF32;
    EXPECT_LE(max_rel_diff(all_logits(*engine, cases[1], small), all_logits(*engine, cases[1], big)), 1e-5) << m;
  }
}

// F32 KV runs attention in full precision, so it differs from the F16-KV
// reference by the reference's own half-precision rounding (measured 1.3e-3
// of the largest logit at worst), and greedy decoding is unchanged.
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
    EXPECT_LE(max_diff, 2e-3f * max_ref) << "position " << pos;
    if (pos + 1 >= c.prompt_tokens.size() && pos + 1 - c.prompt_tokens.size() < c.greedy_tokens.size()) {
      EXPECT_EQ(argmax(&got[pos * V], V), c.greedy_tokens[pos + 1 - c.prompt_tokens.size()]) << "position " << pos;
    }
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
