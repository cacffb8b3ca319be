// Step-by-step sessions and batched decode: several conversations in one
// forward pass give each the logits it gets alone; a generation advanced step
// by step equals generate(); cancelling between steps loses nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "runtime/batch.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

std::unique_ptr<Engine> engine_for(const std::string& model, Isa isa = best_isa()) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 2;
  o.isa = isa;
  o.kv_chunk_size = 16;
  o.prefill_batch = 16;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

GenerateOptions greedy(int64_t n) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampling.temperature = 0;
  go.stop_at_eog = false;
  return go;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max<double>(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(Batch, OneStepOverSeveralSessionsGivesEachItsOwnLogits) {
  for (Isa isa : supported_isas()) {
    if (isa == Isa::kRefEngine) continue;
    auto e = engine_for("tiny-qwen3-f16.gguf", isa);
    const int64_t nv = e->config().n_vocab;
    // Three conversations of different lengths (different chunk counts).
    std::vector<std::vector<TokenId>> prompts = {random_tokens(5, nv, 1), random_tokens(23, nv, 2),
                                                 random_tokens(40, nv, 3)};
    std::vector<std::unique_ptr<Session>> batched, pair, alone;
    for (auto& p : prompts) {
      batched.push_back(std::make_unique<Session>(*e));
      batched.back()->feed(p);
      pair.push_back(std::make_unique<Session>(*e));
      pair.back()->feed(p);
      alone.push_back(std::make_unique<Session>(*e));
      alone.back()->feed(p);
    }
    const std::vector<TokenId> next = {7, 11, 13};
    for (size_t i = 0; i < 3; ++i) {
      batched[i]->append({&next[i], 1});
      pair[i]->append({&next[i], 1});
    }
    Session* all3[] = {batched[0].get(), batched[1].get(), batched[2].get()};
    EXPECT_EQ(run_step(*e, all3), 3);
    Session* two[] = {pair[0].get(), pair[2].get()};
    EXPECT_EQ(run_step(*e, two), 2);
    Session* one[] = {pair[1].get()};
    EXPECT_EQ(run_step(*e, one), 1);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(batched[i]->n_pending(), 0);
      const std::span<const float> solo = alone[i]->feed({&next[i], 1});
      const std::span<const float> got = batched[i]->last_logits();
      // A row's arithmetic does not depend on the other rows of the step.
      if (i != 1) {
        EXPECT_EQ(std::memcmp(got.data(), pair[i]->last_logits().data(), got.size_bytes()), 0)
            << "row " << i << " on " << isa_name(isa);
      }
      // Alone, a one-token step sums in another order (and F16 weights meet
      // activations rounded per batch): within rounding, same argmax.
      EXPECT_LT(max_abs_diff(got, solo), 1e-2) << "row " << i << " on " << isa_name(isa);
      EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
                std::max_element(solo.begin(), solo.end()) - solo.begin());
    }
  }
}

TEST(Batch, BatchedGenerationsMatchEachAlone) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab;
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t i = 0; i < 4; ++i) prompts.push_back(random_tokens(3 + 9 * i, nv, 30 + i));
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::unique_ptr<Generation>> gens;
  for (auto& p : prompts) {
    sessions.push_back(std::make_unique<Session>(*e));
    gens.push_back(std::make_unique<Generation>(*sessions.back(), p, greedy(12), nullptr));
  }
  std::vector<Generation*> ptrs;
  for (auto& g : gens) ptrs.push_back(g.get());
  int steps = 0;
  while (step_generations(*e, ptrs) > 0) ASSERT_LT(++steps, 100);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Session s(*e);
    const GenerateStats want = generate(s, prompts[i], greedy(12), nullptr);
    EXPECT_EQ(gens[i]->stats().tokens, want.tokens) << "stream " << i;
    EXPECT_EQ(gens[i]->stats().prompt_tokens, static_cast<int64_t>(prompts[i].size()));
  }
}

TEST(Batch, APrefillSharesTheStepWithDecodeTokens) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab;
  Session decode(*e), prefill(*e);
  decode.feed(random_tokens(10, nv, 40));
  const std::vector<TokenId> one = {5};
  decode.append(one);
  prefill.append(random_tokens(50, nv, 41));
  Session* both[] = {&decode, &prefill};
  EXPECT_EQ(run_step(*e, both), 16);  // the prefill batch: 1 decode row + 15 prefill rows
  EXPECT_EQ(decode.n_pending(), 0);
  EXPECT_EQ(prefill.n_pending(), 35);
}

TEST(Batch, SteppingEqualsGenerateAndCancellingKeepsTheSession) {
  auto e = engine_for("stories260K.gguf");
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time");
  Session a(*e);
  const GenerateStats want = generate(a, prompt, greedy(20), nullptr);

  Session b(*e);
  Generation g(b, prompt, greedy(20), nullptr);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(g.step());
  g.cancel();
  EXPECT_FALSE(g.step());
  EXPECT_EQ(g.stats().stop, StopReason::kCancelled);
  // Consistent: every token recorded, at most the last one pending.
  const int64_t got = g.stats().generated_tokens;
  EXPECT_EQ(static_cast<int64_t>(b.tokens().size()), static_cast<int64_t>(prompt.size()) + got);
  EXPECT_LE(b.n_pending(), 1);
  EXPECT_TRUE(std::equal(g.stats().tokens.begin(), g.stats().tokens.end(), want.tokens.begin()));
  // The conversation goes on where it stopped.
  const GenerateStats rest = generate(b, {}, greedy(20 - got), nullptr);
  std::vector<TokenId> joined = g.stats().tokens;
  joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(joined, want.tokens);
}

}  // namespace
}  // namespace ebb
