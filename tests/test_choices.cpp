// What agent clients ask of a generation beyond its text: the sampled
// tokens' log-probabilities (runtime/logprobs.h, checked against a direct
// log_softmax of the engine's own logits), logit_bias in the sampler, stop
// token ids, and n choices of one prompt in the scheduler (the prompt's KV
// held once, the choices decoding in one batch).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "memory/kv_pool.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "support.h"

namespace ebb {
namespace {

// log_softmax(row)[i] in double, the slow way.
std::vector<double> log_softmax(std::span<const float> row) {
  double m = -INFINITY;
  for (float x : row) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : row) s += std::exp(x - m);
  std::vector<double> out;
  for (float x : row) out.push_back(x - m - std::log(s));
  return out;
}

TEST(Logprobs, ChosenAndTopMatchAFullLogSoftmax) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> row(5000);
  for (float& x : row) x = d(rng);
  row[17] = row[18] = 12.0f;  // a tie at the top: lower id first
  row[99] = -INFINITY;        // a masked token is fine
  const std::vector<double> ref = log_softmax(row);
  std::vector<int32_t> order(row.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  StepLogprobs lp;
  for (int k : {0, 1, 5, 20}) {
    step_logprobs(row, 1234, k, lp);
    EXPECT_EQ(lp.id, 1234);
    EXPECT_NEAR(lp.logprob, ref[1234], 1e-4);
    ASSERT_EQ(lp.top.size(), static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(lp.top[i].id, order[i]) << "rank " << i;
      EXPECT_NEAR(lp.top[i].logprob, ref[order[i]], 1e-4);
      if (i > 0) EXPECT_GE(lp.top[i - 1].logprob, lp.top[i].logprob);
    }
  }
  // The probabilities of a row sum to one.
  double sum = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    step_logprobs(row, static_cast<int32_t>(i), 0, lp);
    sum += std::exp(static_cast<double>(lp.logprob));
  }
  EXPECT_NEAR(sum, 1.0, 1e-3);
}

TEST(SamplerLogitBias, MinusHundredBansAndPlusHundredForces) {
  std::vector<float> row = {1.0f, 5.0f, 2.0f, 0.5f, -3.0f};
  SamplerOptions o;
  o.temperature = 0;
  {
    Sampler s(o, 5);
    EXPECT_EQ(s.sample(row), 1);
  }
  o.logit_bias = {{1, -100.0f}};
  {
    Sampler s(o, 5);
    EXPECT_EQ(s.sample(row), 2) << "the argmax is banned";
  }
  o.logit_bias = {{4, 100.0f}};
  {
    Sampler s(o, 5);
    EXPECT_EQ(s.sample(row), 4) << "the least likely is forced";
  }
  // At temperature 1 a banned token never comes, a forced one always.
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = 3;
  o.logit_bias = {{1, -100.0f}};
  Sampler banned(o, 5);
  for (int i = 0; i < 500; ++i) EXPECT_NE(banned.sample(row), 1);
  o.logit_bias = {{3, 100.0f}};
  Sampler forced(o, 5);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(forced.sample(row), 3);
  // Out of range: named.
  o.logit_bias = {{2, 101.0f}};
  EXPECT_THROW(Sampler(o, 5), Error);
  o.logit_bias = {{5, 1.0f}};
  try {
    Sampler s(o, 5);
    ADD_FAILURE() << "a token id past the vocabulary was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logit_bias"), std::string::npos) << e.what();
  }
}

std::unique_ptr<Engine> tiny_engine() {
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 1;
  o.kv_chunk_size = 16;
  o.prefill_batch = 16;
  o.prefix_cache = true;
  return std::make_unique<Engine>(o);
}

GenerateOptions sampled(int64_t n, uint64_t seed) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampling.temperature = 1.0f;
  go.sampling.seed = seed;
  go.stop_at_eog = false;
  return go;
}

// The log-probability a generation reports for each token it sampled is
// log_softmax of the engine's logits at that position (recomputed here by
// feeding prompt + tokens through a fresh session).
TEST(Logprobs, AGenerationReportsTheModelsLogSoftmax) {
  auto e = tiny_engine();
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time");
  GenerateOptions go = sampled(12, 11);
  go.logprobs = 3;
  std::vector<StepLogprobs> got;
  go.on_token = [&](const StepLogprobs& t) { got.push_back(t); };
  Session s(*e);
  const GenerateStats st = generate(s, prompt, go, nullptr);
  ASSERT_EQ(got.size(), st.tokens.size());
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), st.tokens.begin(), st.tokens.end());
  Session ref(*e, SessionOptions{.use_prefix_cache = false});
  std::vector<float> rows;
  ref.feed(all, &rows);
  const size_t nv = static_cast<size_t>(e->config().n_vocab);
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t pos = prompt.size() - 1 + i;  // the row after which token i was sampled
    const std::vector<double> ls = log_softmax(std::span<const float>(rows.data() + pos * nv, nv));
    EXPECT_EQ(got[i].id, st.tokens[i]);
    EXPECT_NEAR(got[i].logprob, ls[static_cast<size_t>(got[i].id)], 2e-3) << "token " << i;
    ASSERT_EQ(got[i].top.size(), 3u);
    const double best = *std::max_element(ls.begin(), ls.end());
    EXPECT_NEAR(got[i].top[0].logprob, best, 2e-3);
    EXPECT_GE(got[i].top[0].logprob, got[i].top[1].logprob);
    EXPECT_GE(got[i].top[1].logprob, got[i].top[2].logprob);
  }
}

TEST(Logprobs, AStopTokenEndsTheGenerationWithoutItsText) {
  auto e = tiny_engine();
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time");
  GenerateOptions go = sampled(40, 5);
  go.sampling.temperature = 0;
  Session a(*e);
  const GenerateStats free_run = generate(a, prompt, go, nullptr);
  ASSERT_GE(free_run.tokens.size(), 6u);
  const TokenId stop = free_run.tokens[5];
  const size_t first = static_cast<size_t>(std::find(free_run.tokens.begin(), free_run.tokens.end(), stop) -
                                           free_run.tokens.begin());
  go.stop_tokens = {stop};
  Session b(*e);
  const GenerateStats st = generate(b, prompt, go, nullptr);
  EXPECT_EQ(st.stop, StopReason::kStopString);
  ASSERT_EQ(st.tokens.size(), first + 1) << "ends at the stop token's first sampling";
  go.stop_tokens.clear();
  go.max_tokens = static_cast<int64_t>(first);
  Session c(*e);
  const GenerateStats before = generate(c, prompt, go, nullptr);
  EXPECT_EQ(st.text, before.text) << "the stop token's text is not emitted";
}

// Reads every choice of a request to its end: per choice text and stats.
struct Gathered {
  std::map<int, std::string> text;
  std::map<int, GenerateStats> stats;
  std::map<int, std::vector<TokenId>> tokens;  // from the events
};
Gathered gather(GenerationStream& s, int n) {
  Gathered g;
  while (static_cast<int>(g.stats.size()) < n) {
    std::optional<GenerationEvent> e = s.next(10.0);
    if (!e) {
      ADD_FAILURE() << "no event within 10 s";
      return g;
    }
    EXPECT_NE(e->kind, GenerationEvent::Kind::kError) << e->error;
    if (e->kind == GenerationEvent::Kind::kError) return g;
    for (const StepLogprobs& t : e->tokens) g.tokens[e->choice].push_back(t.id);
    if (e->kind == GenerationEvent::Kind::kText) {
      g.text[e->choice] += e->text;
    } else {
      EXPECT_EQ(g.stats.count(e->choice), 0u) << "choice " << e->choice << " ended twice";
      g.stats[e->choice] = e->stats;
    }
  }
  return g;
}

TEST(SchedulerChoices, GreedyChoicesAreIdenticalAndSeededOnesReproducible) {
  auto e = tiny_engine();
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time, a cat and a dog");
  Session alone(*e);
  GenerateOptions greedy = sampled(24, 1);
  greedy.sampling.temperature = 0;
  const GenerateStats ref = generate(alone, prompt, greedy, nullptr);
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt = prompt;
  r.options = greedy;
  r.n_choices = 2;
  Gathered g = gather(*sched.submit_generation(r), 2);
  for (int c = 0; c < 2; ++c) {
    EXPECT_EQ(g.stats[c].tokens, ref.tokens) << "choice " << c;
    EXPECT_EQ(g.text[c], ref.text) << "choice " << c;
    EXPECT_EQ(g.tokens[c], ref.tokens) << "choice " << c << ": the events carry every sampled token";
  }
  // Seeded: choice i samples with seed + i, so it matches a lone
  // generation with that seed, and the request repeats exactly.
  r.options = sampled(24, 100);
  r.n_choices = 3;
  Gathered s1 = gather(*sched.submit_generation(r), 3);
  Gathered s2 = gather(*sched.submit_generation(r), 3);
  std::set<std::vector<TokenId>> distinct;
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(s1.stats[c].tokens, s2.stats[c].tokens) << "choice " << c;
    EXPECT_EQ(s1.text[c], s2.text[c]) << "choice " << c;
    Session one(*e);
    const GenerateStats lone = generate(one, prompt, sampled(24, 100 + c), nullptr);
    EXPECT_EQ(s1.stats[c].tokens, lone.tokens) << "choice " << c;
    distinct.insert(s1.stats[c].tokens);
  }
  EXPECT_EQ(distinct.size(), 3u) << "each choice samples on its own";
}

// While three choices of a 96-token prompt run (16-token chunks: six full
// chunks), each of the prompt's chunks exists once, held by every choice
// (and the prefix cache); what the choices generate is their own.
TEST(SchedulerChoices, TheChoicesHoldThePromptsKvOnce) {
  auto e = tiny_engine();
  std::vector<TokenId> prompt;
  while (prompt.size() < 96) {
    const std::vector<TokenId> more = e->tokenizer().encode("Lily saw a big red ball in the park and she was happy. ");
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  prompt.resize(96);
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt = prompt;
  r.options = sampled(300, 9);
  r.n_choices = 3;
  auto stream = sched.submit_generation(r);
  // A foreground task steps once per round, between the choices' steps, on
  // the scheduler thread: it reads the pool each round until every choice
  // has run a token of its own (a chunk of its own each), with no race
  // against the choices' progress.
  struct Census {
    int64_t chunks = 0;
    int64_t by_three = 0;  // chunks with >= 3 holders
    int rounds = 0;
  };
  auto census = std::make_shared<Census>();
  std::promise<void> counted;
  Task t;
  t.desc.cls = TaskClass::kForeground;
  t.desc.kind = "census";
  Engine* en = e.get();
  t.step = [census, en] {
    Census now;
    for (KvChunk* k : en->kv_pool().layer_chunks(0)) {
      ++now.chunks;
      if (k->refs.load() >= 3) ++now.by_three;
    }
    now.rounds = census->rounds + 1;
    *census = now;
    return now.chunks < 6 + 3 && now.rounds < 200;
  };
  t.on_done = [&counted](TaskOutcome, const std::string&) { counted.set_value(); };
  sched.submit(std::move(t));
  ASSERT_EQ(counted.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  stream->cancel();
  gather(*stream, 3);
  const Census c = *census;
  EXPECT_LT(c.rounds, 200);
  EXPECT_EQ(c.by_three, 6) << "the prompt's six chunks, each held by the three choices";
  EXPECT_GE(c.chunks, 6 + 3) << "and each choice's own chunks";
}

TEST(SchedulerChoices, ChoicesDecodeInOneBatch) {
  auto e = tiny_engine();
  const std::vector<TokenId> prompt = e->tokenizer().encode("Once upon a time");
  Scheduler sched(e.get());
  GenerationRequest r;
  r.prompt = prompt;
  r.options = sampled(30, 4);
  r.n_choices = 4;
  Gathered g = gather(*sched.submit_generation(r), 4);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(g.stats[c].generated_tokens, 30) << "choice " << c;
  sched.shutdown();
  const SchedulerMetrics m = sched.metrics();
  EXPECT_EQ(m.generated_tokens, 120);
  EXPECT_EQ(m.fg_submitted, 1);
  EXPECT_EQ(m.fg_completed, 1) << "a request of four choices is one request";
  EXPECT_LE(m.rounds, 30 + 4) << "one round per token for all four (and the prefill)";
}

}  // namespace
}  // namespace ebb
