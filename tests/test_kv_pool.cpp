// The KV chunk pool: sessions share full chunks, copy a shared chunk before
// writing into it, and elastic memory moves a shared chunk once.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <unistd.h>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

constexpr int64_t kChunk = 16;

std::unique_ptr<Engine> engine_for(const std::string& model, const std::string& swap_dir = "") {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 2;
  o.kv_chunk_size = kChunk;
  o.prefill_batch = 8;
  o.elastic_opts.swap_dir = swap_dir;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

std::vector<float> copy(std::span<const float> x) { return {x.begin(), x.end()}; }

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST(KvPool, ForkSharesChunksAndCopiesTheSharedPartialChunkBeforeWriting) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab, nl = e->config().n_layer;
  const std::vector<TokenId> p = random_tokens(40, nv, 1);  // 2 full chunks + 8 tokens
  const std::vector<TokenId> more_a = random_tokens(5, nv, 2), more_b = random_tokens(7, nv, 3);
  Session a(*e);
  a.feed(p);
  EXPECT_EQ(e->kv_pool().n_chunks(), 3 * nl);
  const uint64_t kv_before = e->footprint().kv();

  Session b(*e);
  b.fork_from(a, 40);
  EXPECT_EQ(b.n_processed(), 40);
  EXPECT_EQ(e->kv_pool().n_chunks(), 3 * nl) << "a fork copies nothing";
  EXPECT_EQ(e->footprint().kv(), kv_before) << "shared chunks are counted once";
  for (int64_t l = 0; l < nl; ++l)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(&a.kv().chunk(l, c), &b.kv().chunk(l, c));

  // b writes into the shared partial chunk: it takes a private copy of it,
  // one per layer; the full chunks stay shared.
  const std::vector<float> lb = copy(b.feed(more_b));
  EXPECT_EQ(e->kv_pool().n_chunks(), 4 * nl);
  for (int64_t l = 0; l < nl; ++l) {
    EXPECT_EQ(&a.kv().chunk(l, 1), &b.kv().chunk(l, 1));
    EXPECT_NE(&a.kv().chunk(l, 2), &b.kv().chunk(l, 2));
  }
  // Neither conversation sees the other's rows: both equal sessions that
  // never shared anything, bit for bit.
  const std::vector<float> la = copy(a.feed(more_a));
  Session ra(*e), rb(*e);
  ra.feed(p);
  rb.feed(p);
  EXPECT_TRUE(same_bits(la, ra.feed(more_a)));
  EXPECT_TRUE(same_bits(lb, rb.feed(more_b)));
}

TEST(KvPool, TruncatedForkCopiesTheFullChunkItWritesInto) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab;
  const std::vector<TokenId> p = random_tokens(32, nv, 4), q = random_tokens(6, nv, 5);
  Session a(*e);
  const std::vector<float> la = copy(a.feed(p));
  Session b(*e);
  b.fork_from(a, 20);  // ends inside a's second (full) chunk
  const std::vector<float> lb = copy(b.feed(q));
  // a's chunk is untouched: feeding a again from the same state matches a
  // fresh session.
  Session ref(*e);
  ref.feed(p);
  const std::vector<TokenId> next = random_tokens(3, nv, 6);
  EXPECT_TRUE(same_bits(a.feed(next), ref.feed(next)));
  std::vector<TokenId> bq(p.begin(), p.begin() + 20);
  bq.insert(bq.end(), q.begin(), q.end());
  Session rb(*e);
  rb.feed(std::span<const TokenId>(bq).first(20));
  EXPECT_TRUE(same_bits(lb, rb.feed(q)));
  (void)la;
}

TEST(KvPool, SharedChunksAreEvictedAndRestoredOnceAndRssFalls) {
  test::TempDir swap("ebb-pool-swap");
  auto e = engine_for("tiny-qwen3-f16.gguf", swap.path());
  const int64_t nv = e->config().n_vocab;
  const std::vector<TokenId> p = random_tokens(256, nv, 7), q = random_tokens(4, nv, 8);
  SessionOptions so;
  so.n_ctx = 512;
  Session a(*e, so);
  a.feed(p);
  Session b(*e, so);
  b.fork_from(a, 256);
  const int64_t chunks = e->kv_pool().n_chunks();
  const uint64_t kv = e->footprint().kv();
  ASSERT_GT(kv, 0u);
  const uint64_t rss0 = rss_bytes();
  // Everything evictable: every chunk moves once, whoever holds it.
  const EvictReport r = e->evict(UINT64_MAX / 4);
  EXPECT_EQ(r.kv_to_compressed + r.kv_to_storage, chunks);
  EXPECT_EQ(e->footprint().kv(), 0u);
  EXPECT_LT(rss_bytes() + kv / 2, rss0) << "the process gives the KV's pages back";
  // Both continue; one restore brings each chunk back once.
  const std::vector<float> lb = copy(b.feed(q));
  EXPECT_EQ(b.last_restore().chunks_read + b.last_restore().chunks_decompressed, chunks);
  EXPECT_EQ(e->footprint().kv(), kv + static_cast<uint64_t>(e->config().n_layer) * b.kv().chunk_alloc_bytes());
  const std::vector<float> la = copy(a.feed(q));
  Session ref(*e, so);
  ref.feed(p);
  const std::span<const float> want = ref.feed(q);
  // Restored KV went through the int8 codec: close, not equal.
  for (const auto* got : {&la, &lb}) {
    double max_diff = 0;
    for (size_t i = 0; i < want.size(); ++i) max_diff = std::max<double>(max_diff, std::abs((*got)[i] - want[i]));
    EXPECT_LT(max_diff, 0.5);
  }
}

TEST(KvPool, ChunkTablesGrowWithTheContext) {
  auto e = engine_for("stories260K.gguf");
  SessionOptions so;
  so.n_ctx = int64_t{1} << 40;  // far past memory: only what is used is allocated
  try {
    Session s(*e, so);
    FAIL() << "a context whose chunk tables cannot fit must be refused";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("chunk tables"), std::string::npos) << err.what();
  }
  so.n_ctx = int64_t{1} << 24;  // 16M tokens: tables grow as used
  const uint64_t rss0 = rss_bytes();
  Session s(*e, so);
  s.feed(random_tokens(20, e->config().n_vocab, 9));
  EXPECT_LT(rss_bytes(), rss0 + (uint64_t{64} << 20));
  EXPECT_EQ(s.kv().n_chunks(0), 2);
}

}  // namespace
}  // namespace ebb
