// The prefix cache: bit-exact reuse on every kernel target, isolation by
// namespace / adapters / versions / KV geometry, longest-prefix lookup, KV a
// restore lost is never returned, and retention in keep-priority order.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "memory/prefix_cache.h"
#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

constexpr int64_t kChunk = 16;

std::unique_ptr<Engine> engine_for(const std::string& model, Isa isa, bool cache = true) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 2;
  o.isa = isa;
  o.kv_chunk_size = kChunk;
  o.prefill_batch = 8;  // divides the chunk: a hit starts where a recompute's micro-batch does
  o.prefix_cache = cache;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

std::vector<TokenId> cat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class PrefixCacheReuse : public testing::TestWithParam<Isa> {};

TEST_P(PrefixCacheReuse, AHitGivesTheLogitsOfARecomputeBitForBit) {
  for (const char* model : {"stories260K.gguf", "tiny-qwen3-f16.gguf"}) {
    auto e = engine_for(model, GetParam());
    const int64_t nv = e->config().n_vocab;
    const std::vector<TokenId> prefix = random_tokens(3 * kChunk + 5, nv, 11), turn = random_tokens(9, nv, 12);
    {
      Session producer(*e);
      producer.feed(prefix);
    }  // the cache keeps the three full chunks
    EXPECT_EQ(e->prefix_cache()->n_nodes(), 3);
    Session hit(*e);
    const std::span<const float> hit_logits = hit.feed(cat(prefix, turn));
    const std::vector<float> got(hit_logits.begin(), hit_logits.end());
    EXPECT_EQ(hit.reused_tokens(), 3 * kChunk) << model;
    EXPECT_EQ(hit.tokens_run(), static_cast<int64_t>(prefix.size() + turn.size()) - 3 * kChunk);

    SessionOptions no_cache;
    no_cache.use_prefix_cache = false;
    Session recompute(*e, no_cache);
    const std::span<const float> want = recompute.feed(cat(prefix, turn));
    EXPECT_EQ(recompute.reused_tokens(), 0);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size_bytes()), 0) << model << " on " << isa_name(GetParam());
  }
}

std::vector<Isa> targets() {
  std::vector<Isa> v;
  for (Isa i : supported_isas())
    if (i != Isa::kRefEngine) v.push_back(i);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Targets, PrefixCacheReuse, testing::ValuesIn(targets()),
                         [](const auto& i) { return std::string(isa_name(i.param)); });

// A cache over a real pool, filled from a session's KV.
struct Fixture {
  std::unique_ptr<Engine> e = engine_for("stories260K.gguf", best_isa(), /*cache=*/false);
  PrefixCache cache{e->config().n_layer};
  std::vector<TokenId> tokens = random_tokens(4 * kChunk, e->config().n_vocab, 21);
  std::unique_ptr<Session> s;
  Fixture() {
    s = std::make_unique<Session>(*e);
    s->feed(tokens);
  }
  CacheKey key() const { return s->cache_key(); }
};

TEST(PrefixCache, StaleCoverageIsNeverReturned) {
  Fixture f;
  CacheKey k = f.key();
  k.ns = "agent-a";
  k.adapters = {{"planner", 3, 0xabcdef, 1.0f}, {"style", 1, 0x1234, 0.5f}};
  f.cache.insert(k, f.tokens, f.s->kv());
  EXPECT_EQ(f.cache.lookup(k, f.tokens).n_tokens, 4 * kChunk);
  // Each part of the key varied alone: never a hit.
  std::vector<CacheKey> others(8, k);
  others[0].ns = "agent-b";
  others[1].adapters[0].version = 4;               // a newer version of the adapter
  others[2].adapters[0].digest = 0xabcdee;          // same name and version, other bytes
  others[3].adapters[1].scale = 1.0f;               // another scale
  others[4].adapters.pop_back();                    // one adapter fewer
  others[5].adapters.clear();                       // the base model
  others[6].chunk_size = 2 * kChunk;                // other KV geometry
  others[7].kv_type = DType::kF32;
  for (size_t i = 0; i < others.size(); ++i)
    EXPECT_EQ(f.cache.lookup(others[i], f.tokens).n_tokens, 0) << "key variant " << i;
}

TEST(PrefixCache, LookupReturnsTheLongestCachedPrefixInWholeChunks) {
  Fixture f;
  f.cache.insert(f.key(), f.tokens, f.s->kv());
  std::vector<TokenId> q = f.tokens;
  q[2 * kChunk + 3] ^= 1;  // diverges inside the third chunk
  PrefixHit h = f.cache.lookup(f.key(), q);
  EXPECT_EQ(h.n_tokens, 2 * kChunk);
  ASSERT_EQ(h.chunks.size(), 2u);
  for (int64_t l = 0; l < f.e->config().n_layer; ++l) EXPECT_EQ(h.chunks[1][l].get(), &f.s->kv().chunk(l, 1));
  // A limit below the match, and a query shorter than one chunk.
  EXPECT_EQ(f.cache.lookup(f.key(), f.tokens, 3 * kChunk - 1).n_tokens, 2 * kChunk);
  EXPECT_EQ(f.cache.lookup(f.key(), std::span<const TokenId>(f.tokens).first(kChunk - 1)).n_tokens, 0);
  q[3] ^= 1;
  EXPECT_EQ(f.cache.lookup(f.key(), q).n_tokens, 0);
}

TEST(PrefixCache, KvARestoreLostIsDroppedNotReturned) {
  Fixture f;
  f.cache.insert(f.key(), f.tokens, f.s->kv());
  f.s->kv().chunk(3, 2).lost.store(true);
  EXPECT_EQ(f.cache.lookup(f.key(), f.tokens).n_tokens, 2 * kChunk);
  EXPECT_EQ(f.cache.stats().rejected_lost, 1);
  EXPECT_EQ(f.cache.n_nodes(), 2);
  f.s->kv().chunk(3, 2).lost.store(false);
}

TEST(PrefixCache, OverItsLimitColdEntriesGoFirst) {
  auto e = engine_for("stories260K.gguf", best_isa(), false);
  const int64_t nv = e->config().n_vocab;
  PrefixCache cache(e->config().n_layer);
  std::vector<std::vector<TokenId>> prompts;
  {
    for (uint32_t i = 0; i < 4; ++i) {
      prompts.push_back(random_tokens(2 * kChunk, nv, 100 + i));
      Session s(*e);
      s.feed(prompts.back());
      cache.insert(s.cache_key(), prompts.back(), s.kv());
    }
  }
  Session probe(*e);
  const CacheKey k = probe.cache_key();
  // Prompt 2 is used again and again: it is hot.
  for (int i = 0; i < 50; ++i) EXPECT_EQ(cache.lookup(k, prompts[2]).n_tokens, 2 * kChunk);
  const std::vector<PrefixCache::NodeInfo> info = cache.nodes();
  for (size_t i = 1; i < info.size(); ++i) EXPECT_LE(info[i - 1].keep, info[i].keep);
  // Room for two prompts (four nodes): the hot one stays.
  const uint64_t per_node = info[0].bytes;
  ASSERT_GT(per_node, 0u);
  cache.trim(4 * per_node);
  EXPECT_EQ(cache.n_nodes(), 4);
  EXPECT_LE(cache.private_bytes(), 4 * per_node);
  EXPECT_EQ(cache.lookup(k, prompts[2]).n_tokens, 2 * kChunk);
}

TEST(PrefixCache, HeatHalvesEvery512Accesses) {
  auto e = engine_for("stories260K.gguf", best_isa(), false);
  PrefixCache cache(e->config().n_layer);
  const std::vector<TokenId> a = random_tokens(kChunk, e->config().n_vocab, 1),
                             b = random_tokens(kChunk, e->config().n_vocab, 2);
  Session sa(*e), sb(*e);
  sa.feed(a);
  sb.feed(b);
  cache.insert(sa.cache_key(), a, sa.kv());
  cache.insert(sb.cache_key(), b, sb.kv());
  cache.lookup(sa.cache_key(), a);  // heats a once
  auto heat_of_a = [&] {
    double h = 0;
    for (const auto& n : cache.nodes()) h = std::max(h, n.heat_prefix);
    return h;
  };
  const double h1 = heat_of_a();
  for (int i = 0; i < 512; ++i) cache.lookup(sb.cache_key(), std::span<const TokenId>(b).first(kChunk - 1));
  EXPECT_NEAR(heat_of_a() / h1, 0.5, 0.01);
}

}  // namespace
}  // namespace ebb
