#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "platform/error.h"

namespace ebb {
namespace {

// Logits whose softmax at temperature 1 is exactly `probs` (up to rounding).
std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return out;
}

std::vector<float> random_logits(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// Options with every filter and penalty off, temperature 1.
SamplerOptions plain_options(uint64_t seed = 1234) {
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = seed;
  return o;
}

std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int n_draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n_draws; ++i) ++counts.at(s.sample(logits));
  return counts;
}

// Pearson chi-square of observed counts against expected probabilities over
// the tokens with expected > 0; the caller checks zero-probability tokens.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expected, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) continue;
    const double e = expected[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

// Expects Sampler construction to throw ebb::Error mentioning `name`.
void expect_rejects(const SamplerOptions& o, const std::string& name) {
  try {
    Sampler s(o, 10);
    ADD_FAILURE() << "no error for bad " << name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(SamplerGreedy, PicksArgmaxAndLowestIdOnTies) {
  SamplerOptions o;
  o.temperature = 0.0f;
  Sampler s(o, 6);
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 5.0f, 4.9f, -INFINITY};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 3);
  const std::vector<float> tied = {1.0f, 7.0f, 3.0f, 7.0f, 7.0f, 0.0f};
  EXPECT_EQ(s.sample(tied), 1);
}

TEST(SamplerGreedy, DoesNotConsumeRandomness) {
  SamplerOptions o = plain_options(99);
  Sampler a(o, 50), b(o, 50);
  o.temperature = 0.0f;
  Sampler g(o, 50);
  const auto logits = random_logits(50, 7);
  // Interleaving greedy calls on another sampler must not matter; and a
  // greedy sampler gives the same token every call.
  const int32_t first = g.sample(logits);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(a.sample(logits), b.sample(logits));
    EXPECT_EQ(g.sample(logits), first);
  }
}

TEST(SamplerSeed, SameSeedSameTokensDifferentSeedDiffers) {
  SamplerOptions o;  // defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
  o.seed = 42;
  Sampler a(o, 1000), b(o, 1000);
  o.seed = 43;
  Sampler c(o, 1000);
  int differences = 0;
  for (int step = 0; step < 200; ++step) {
    const auto logits = random_logits(1000, step, 1.0f);
    const int32_t ta = a.sample(logits);
    EXPECT_EQ(ta, b.sample(logits)) << "step " << step;
    differences += ta != c.sample(logits);
  }
  EXPECT_GT(differences, 20);
  EXPECT_EQ(a.seed(), 42u);
}

TEST(SamplerSeed, RandomSeedIsReportedAndReproducible) {
  SamplerOptions o = plain_options(0);
  Sampler a(o, 100);
  EXPECT_NE(a.seed(), 0u);
  o.seed = a.seed();
  Sampler b(o, 100);
  const auto logits = random_logits(100, 5, 1.0f);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

TEST(SamplerSeed, ResetRestartsSequenceAndClearsHistory) {
  SamplerOptions o = plain_options(7);
  o.presence_penalty = 100.0f;  // a seen token becomes (nearly) impossible
  Sampler s(o, 64);
  const auto logits = random_logits(64, 3, 0.5f);
  std::vector<int32_t> first;
  for (int i = 0; i < 50; ++i) first.push_back(s.sample(logits));
  s.accept(first[0]);
  s.reset();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits), first[i]) << "draw " << i;
}

TEST(SamplerTopK, TopK1IsGreedyAtAnyTemperature) {
  for (float t : {0.1f, 1.0f, 5.0f, 100.0f}) {
    SamplerOptions o = plain_options(11);
    o.temperature = t;
    o.top_k = 1;
    Sampler s(o, 500);
    for (int step = 0; step < 50; ++step) {
      const auto logits = random_logits(500, 100 + step);
      const int32_t best = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(s.sample(logits), best) << "temperature " << t;
    }
  }
}

TEST(SamplerTopK, KeepsOnlyTheKLargestWithRenormalisedFrequencies) {
  const std::vector<double> probs = {0.05, 0.30, 0.10, 0.25, 0.20, 0.10};
  SamplerOptions o = plain_options();
  o.top_k = 3;  // keeps ids 1, 3, 4
  Sampler s(o, 6);
  const int n = 10000;
  const auto counts = histogram(s, logits_from_probs(probs), n);
  const std::vector<double> expected = {0, 0.30 / 0.75, 0, 0.25 / 0.75, 0.20 / 0.75, 0};
  for (int id : {0, 2, 5}) EXPECT_EQ(counts[id], 0) << "id " << id;
  // 2 degrees of freedom; 13.8 is the 0.1% critical value.
  EXPECT_LT(chi_square(counts, expected, n), 13.8);
}

TEST(SamplerTopP, ExcludesTailBeyondCumulativeP) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  SamplerOptions o = plain_options();
  o.top_p = 0.75f;  // 0.5 < 0.75 <= 0.5 + 0.3: keeps ids 1 and 3
  Sampler s(o, 4);
  const int n = 10000;
  const auto counts = histogram(s, logits_from_probs(probs), n);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  // 1 degree of freedom; 10.8 is the 0.1% critical value.
  EXPECT_LT(chi_square(counts, {0, 0.5 / 0.8, 0, 0.3 / 0.8}, n), 10.8);
}

TEST(SamplerTopP, MatchesReferenceSetOnLargeFlatVocabulary) {
  // A flat distribution needs hundreds of tokens to reach top_p, so the
  // sampler has to grow its sorted prefix several times.
  const int n_vocab = 2000;
  const auto logits = random_logits(n_vocab, 77, 0.3f);
  SamplerOptions o = plain_options(5);
  o.top_p = 0.5f;
  Sampler s(o, n_vocab);

  // Reference: sort everything, take the smallest prefix reaching p.
  std::vector<int> order(n_vocab);
  for (int i = 0; i < n_vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double sum = 0;
  for (float l : logits) sum += std::exp(l);
  std::vector<bool> allowed(n_vocab, false);
  double cum = 0;
  size_t n_allowed = 0;
  for (int id : order) {
    allowed[id] = true;
    ++n_allowed;
    cum += std::exp(logits[id]);
    if (cum >= 0.5 * sum) break;
  }
  ASSERT_GT(n_allowed, 200u);  // several doublings past the first 64

  std::vector<bool> seen(n_vocab, false);
  for (int i = 0; i < 5000; ++i) {
    const int32_t t = s.sample(logits);
    ASSERT_TRUE(allowed[t]) << "token " << t << " is outside the top-p set";
    seen[t] = true;
  }
  // Most of the set gets drawn, so it is not cut short either.
  EXPECT_GT(std::count(seen.begin(), seen.end(), true), static_cast<long>(n_allowed * 7 / 10));
}

TEST(SamplerMinP, DropsTokensBelowFractionOfMax) {
  const std::vector<double> probs = {0.06, 0.4, 0.04, 0.3, 0.2};
  SamplerOptions o = plain_options();
  o.min_p = 0.2f;  // threshold 0.08: keeps ids 1, 3, 4
  Sampler s(o, 5);
  const int n = 10000;
  const auto counts = histogram(s, logits_from_probs(probs), n);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  EXPECT_LT(chi_square(counts, {0, 0.4 / 0.9, 0, 0.3 / 0.9, 0.2 / 0.9}, n), 13.8);
}

TEST(SamplerMinP, AppliesAfterTopP) {
  // top-p 0.9 keeps {0.5, 0.3, 0.12}; min-p 0.3 of 0.5 = 0.15 then drops 0.12.
  const std::vector<double> probs = {0.5, 0.3, 0.12, 0.08};
  SamplerOptions o = plain_options();
  o.top_p = 0.9f;
  o.min_p = 0.3f;
  Sampler s(o, 4);
  const auto counts = histogram(s, logits_from_probs(probs), 5000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_GT(counts[1], 1000);
}

TEST(SamplerTemperature, ReshapesOnlyTheSurvivors) {
  // top-k 2 at temperature 2: the two survivors are drawn with
  // softmax(logit / 2) = {e^1, e^0.5} / sum; nothing else appears.
  const std::vector<float> logits = {2.0f, 1.0f, 0.9f, -3.0f};
  SamplerOptions o = plain_options();
  o.top_k = 2;
  o.temperature = 2.0f;
  Sampler s(o, 4);
  const int n = 10000;
  const auto counts = histogram(s, logits, n);
  EXPECT_EQ(counts[2] + counts[3], 0);
  const double a = std::exp(1.0), b = std::exp(0.5);
  EXPECT_LT(chi_square(counts, {a / (a + b), b / (a + b), 0, 0}, n), 10.8);
}

TEST(SamplerPenalty, RepetitionDividesPositiveAndMultipliesNegative) {
  SamplerOptions o;
  o.temperature = 0.0f;
  o.repeat_penalty = 1.2f;
  Sampler s(o, 4);
  // Positive: 2.0 / 1.2 = 1.67 < 1.9.
  const std::vector<float> pos = {2.0f, 1.9f, 0.0f, -5.0f};
  EXPECT_EQ(s.sample(pos), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(pos), 1);
  // Negative: -1.0 * 1.2 = -1.2 < -1.1.
  s.reset();
  const std::vector<float> neg = {-1.0f, -1.1f, -9.0f, -9.0f};
  EXPECT_EQ(s.sample(neg), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(neg), 1);
}

TEST(SamplerPenalty, FrequencyScalesWithCountPresenceDoesNot) {
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  SamplerOptions o;
  o.temperature = 0.0f;
  o.frequency_penalty = 0.3f;
  Sampler freq(o, 3);
  freq.accept(0);  // 3.0 - 0.3 = 2.7 > 2.5
  EXPECT_EQ(freq.sample(logits), 0);
  freq.accept(0);  // 3.0 - 0.6 = 2.4 < 2.5
  EXPECT_EQ(freq.sample(logits), 1);

  o.frequency_penalty = 0.0f;
  o.presence_penalty = 0.4f;
  Sampler pres(o, 3);
  pres.accept(0);  // 3.0 - 0.4 = 2.6 > 2.5
  EXPECT_EQ(pres.sample(logits), 0);
  pres.accept(0);  // still 2.6: presence counts once
  pres.accept(0);
  EXPECT_EQ(pres.sample(logits), 0);
}

TEST(SamplerPenalty, OnlyTheLastNTokensCount) {
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f, 0.0f};
  SamplerOptions o;
  o.temperature = 0.0f;
  o.repeat_penalty = 1.5f;
  o.penalty_last_n = 2;
  Sampler s(o, 4);
  s.accept(0);
  EXPECT_EQ(s.sample(logits), 1);
  s.accept(2);
  EXPECT_EQ(s.sample(logits), 1);  // 0 is still in the window
  s.accept(3);
  EXPECT_EQ(s.sample(logits), 0);  // 0 has left the window

  o.penalty_last_n = 0;  // penalties off
  Sampler off(o, 4);
  off.accept(0);
  EXPECT_EQ(off.sample(logits), 0);
}

TEST(SamplerValidate, InvalidValuesThrowNamingTheOption) {
  auto with = [](auto set) {
    SamplerOptions o;
    set(o);
    return o;
  };
  expect_rejects(with([](SamplerOptions& o) { o.temperature = -0.1f; }), "temperature");
  expect_rejects(with([](SamplerOptions& o) { o.temperature = NAN; }), "temperature");
  expect_rejects(with([](SamplerOptions& o) { o.top_k = -1; }), "top_k");
  expect_rejects(with([](SamplerOptions& o) { o.top_p = 0.0f; }), "top_p");
  expect_rejects(with([](SamplerOptions& o) { o.top_p = 1.5f; }), "top_p");
  expect_rejects(with([](SamplerOptions& o) { o.min_p = -0.01f; }), "min_p");
  expect_rejects(with([](SamplerOptions& o) { o.min_p = 1.01f; }), "min_p");
  expect_rejects(with([](SamplerOptions& o) { o.repeat_penalty = 0.0f; }), "repeat_penalty");
  expect_rejects(with([](SamplerOptions& o) { o.frequency_penalty = -1.0f; }), "frequency_penalty");
  expect_rejects(with([](SamplerOptions& o) { o.presence_penalty = -1.0f; }), "presence_penalty");
  expect_rejects(with([](SamplerOptions& o) { o.penalty_last_n = -1; }), "penalty_last_n");
  EXPECT_THROW(Sampler(SamplerOptions{}, 0), Error);

  // The message also names the valid range.
  try {
    Sampler s(with([](SamplerOptions& o) { o.top_p = 2.0f; }), 10);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(0, 1]"), std::string::npos) << e.what();
  }
  // Boundary values are accepted.
  EXPECT_NO_THROW(Sampler(with([](SamplerOptions& o) {
                            o.temperature = 0;
                            o.top_k = 0;
                            o.top_p = 1;
                            o.min_p = 1;
                            o.penalty_last_n = 0;
                          }),
                          10));
}

// NaN or infinite logits come from the model's data (a damaged file), not a
// bug: they are an ebb::Error naming the cause, and the sampler stays usable.
TEST(SamplerBadLogits, NanAndInfiniteAreErrorsNotAborts) {
  for (float temp : {0.0f, 0.8f}) {
    SamplerOptions o = plain_options();
    o.temperature = temp;
    Sampler s(o, 8);
    std::vector<float> logits = {0, 1, 2, NAN, 4, NAN, 6, 7};
    try {
      s.sample(logits);
      ADD_FAILURE() << "no error for NaN logits";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NaN logits (2 of 8)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model file"), std::string::npos) << e.what();
    }
    std::vector<float> inf = {0, 1, INFINITY, 3, 4, 5, 6, 7};
    EXPECT_THROW(s.sample(inf), Error);
    std::vector<float> none(8, -INFINITY);
    try {
      s.sample(none);
      ADD_FAILURE() << "no error for a row with no finite logit";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no finite logit"), std::string::npos) << e.what();
    }
    // Still usable: a good row samples normally (greedy: the argmax).
    std::vector<float> good = {0, 1, 2, 3, 9, 5, 6, 7};
    if (temp == 0.0f) EXPECT_EQ(s.sample(good), 4);
    else EXPECT_GE(s.sample(good), 0);
  }
}

TEST(SamplerSpeed, LargeVocabularyTopK40) {
  const int n_vocab = 152064;  // Qwen2
  const auto logits = random_logits(n_vocab, 9);
  SamplerOptions o;  // defaults: top_k 40
  o.seed = 3;
  o.repeat_penalty = 1.1f;
  Sampler s(o, n_vocab);
  for (int i = 0; i < 64; ++i) s.accept(i * 1000);
  s.sample(logits);  // warm the caches
  const int iters = 100;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) s.sample(logits);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      iters;
  std::printf("sample() over %d logits, top_k 40: %.3f ms\n", n_vocab, ms);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  // The target is < 1 ms; the bound is loose because the test machines are shared.
  EXPECT_LT(ms, 5.0);
#endif
}

}  // namespace
}  // namespace ebb
