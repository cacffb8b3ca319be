// The KV chunk pool: sessions share full chunks, copy a shared chunk before
// writing into it, and elastic memory moves a shared chunk once.
#include <gtest/gtest.h>

#include <algorithm>
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

// A split of the layers (runtime/device_forward.h): layers [0, host_layers)
// keep their rows in pool chunks, the others only their positions (their
// rows are on a device), and the pool counts the host layers alone.
TEST(KvPool, HostLayersHoldRowsTheOthersOnlyPositions) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nl = e->config().n_layer;
  ASSERT_GE(nl, 3);
  KvPool& pool = e->kv_pool();
  KvCacheOptions o;
  o.chunk_size = kChunk;
  o.max_tokens = 256;
  o.host_layers = 2;
  {
    KvCache kv(pool, o);
    EXPECT_EQ(kv.n_host_layers(), 2);
    EXPECT_TRUE(kv.on_host(1));
    EXPECT_FALSE(kv.on_host(2));
    EXPECT_FALSE(kv.all_on_host());
    kv.reserve(40);  // 3 chunks in each host layer, none elsewhere
    for (int64_t l = 0; l < nl; ++l) EXPECT_EQ(kv.n_chunks(l), l < 2 ? 3 : 0) << "layer " << l;
    for (int64_t l = 0; l < nl; ++l) EXPECT_EQ(pool.layer_bytes(l) > 0, l < 2) << "layer " << l;
    kv.set_n_tokens(40);
    EXPECT_EQ(kv.n_tokens(), 40);
    kv.truncate(10);  // one chunk left in the host layers; the position moves for all
    EXPECT_EQ(kv.n_tokens(), 10);
    EXPECT_EQ(kv.n_chunks(0), 1);
    EXPECT_EQ(kv.n_chunks(nl - 1), 0);
  }
  o.host_layers = 0;  // every layer on the device: positions only
  {
    KvCache kv(pool, o);
    kv.reserve(40);
    kv.set_n_tokens(40);
    EXPECT_EQ(kv.n_tokens(), 40);
    EXPECT_EQ(kv.total_bytes(), 0u);
  }
  o.host_layers = nl + 1;
  EXPECT_THROW(KvCache(pool, o), Error);
}

// Spare buffers: a released chunk's storage goes to the next chunks of its
// size instead of being unmapped, counted in the footprint until it does.
TEST(KvPool, SpareBuffersAreReusedWhateverTheyHeldAndCountedUntilReleased) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab, nl = e->config().n_layer;
  const std::vector<TokenId> p = random_tokens(40, nv, 21), q = random_tokens(20, nv, 22);
  std::vector<float> want;
  {
    Session fresh(*e);
    want = copy(fresh.feed(q));
  }
  EXPECT_EQ(e->footprint().kv_spare, 0u) << "off by default";
  e->set_kv_spare_limit(uint64_t{1} << 30);
  std::vector<const void*> held;
  uint64_t chunk_bytes = 0;
  {
    Session a(*e);
    a.feed(p);  // 3 chunks per layer
    chunk_bytes = a.kv().chunk_alloc_bytes();
    for (int64_t l = 0; l < nl; ++l)
      for (int64_t c = 0; c < 3; ++c) {
        Buffer& b = a.kv().chunk(l, c).storage;
        held.push_back(b.data());
        std::memset(b.data(), 0xFF, b.size());  // NaN in F16: must never be read
      }
  }
  Footprint f = e->footprint();
  EXPECT_EQ(f.kv(), 0u);
  EXPECT_EQ(f.kv_spare, static_cast<uint64_t>(3 * nl) * chunk_bytes);
  EXPECT_EQ(static_cast<int64_t>(f.total()), e->ledger().total()) << "spare bytes are in the footprint";

  Session b(*e);
  EXPECT_TRUE(same_bits(b.feed(q), want)) << "reused buffers hold another session's rows and NaN";
  for (int64_t l = 0; l < nl; ++l)
    for (int64_t c = 0; c < 2; ++c)
      EXPECT_NE(std::find(held.begin(), held.end(), b.kv().chunk(l, c).storage.data()), held.end())
          << "layer " << l << " chunk " << c << " was mapped anew";
  f = e->footprint();
  EXPECT_EQ(f.kv_spare, static_cast<uint64_t>(nl) * chunk_bytes);
  EXPECT_EQ(static_cast<int64_t>(f.total()), e->ledger().total());

  const int64_t ledger = e->ledger().total();
  EXPECT_EQ(e->kv_pool().release_spare(), static_cast<uint64_t>(nl) * chunk_bytes);
  EXPECT_EQ(e->ledger().total(), ledger - static_cast<int64_t>(nl * chunk_bytes));
  EXPECT_EQ(e->footprint().kv_spare, 0u);
}

// The peak is the most KV resident at any moment since reset_peak(): it
// stays after the sessions that made it are gone.
TEST(KvPool, PeakBytesFollowTheMostResidentSinceAReset) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab;
  KvPool& pool = e->kv_pool();
  pool.reset_peak();
  EXPECT_EQ(pool.peak_bytes(), 0u);
  uint64_t both = 0, one_after_reset = 0;
  {
    Session a(*e);
    a.feed(random_tokens(40, nv, 31));  // 3 chunks per layer
    const uint64_t one = pool.total_bytes();
    EXPECT_EQ(pool.peak_bytes(), one);
    {
      Session b(*e);
      b.feed(random_tokens(20, nv, 32));  // 2 more
      both = pool.total_bytes();
      EXPECT_GT(both, one);
      EXPECT_EQ(pool.peak_bytes(), both);
    }
    EXPECT_EQ(pool.total_bytes(), one);
    EXPECT_EQ(pool.peak_bytes(), both) << "the peak stays after b's chunks went";
    pool.reset_peak();
    EXPECT_EQ(pool.peak_bytes(), one) << "a reset starts from what is resident";
    one_after_reset = one;
  }
  EXPECT_EQ(pool.total_bytes(), 0u);
  EXPECT_EQ(pool.peak_bytes(), one_after_reset);
}

TEST(KvPool, SpareBuffersStayWithinTheirLimitAndGoFirstOnEviction) {
  auto e = engine_for("stories260K.gguf");
  const int64_t nv = e->config().n_vocab, nl = e->config().n_layer;
  e->set_kv_spare_limit(uint64_t{1} << 30);
  uint64_t chunk_bytes = 0;
  {
    Session a(*e);
    a.feed(random_tokens(40, nv, 23));
    chunk_bytes = a.kv().chunk_alloc_bytes();
  }
  ASSERT_EQ(e->footprint().kv_spare, static_cast<uint64_t>(3 * nl) * chunk_bytes);
  // A lower limit gives back what is over it.
  e->set_kv_spare_limit(static_cast<uint64_t>(nl) * chunk_bytes);
  EXPECT_EQ(e->footprint().kv_spare, static_cast<uint64_t>(nl) * chunk_bytes);
  Session live(*e);
  live.feed(random_tokens(20, nv, 25));  // takes those and maps one chunk per layer
  EXPECT_EQ(e->footprint().kv_spare, 0u);
  {
    Session a(*e);
    a.feed(random_tokens(40, nv, 24));
  }
  EXPECT_EQ(e->footprint().kv_spare, static_cast<uint64_t>(nl) * chunk_bytes) << "no more than the limit is kept";

  // Eviction gives the spare buffers back before anything that holds KV.
  const uint64_t kv = e->footprint().kv();
  const EvictReport r = e->evict(1);
  EXPECT_GE(r.freed, static_cast<uint64_t>(nl) * chunk_bytes);
  EXPECT_EQ(r.kv_to_compressed + r.kv_to_storage, 0);
  EXPECT_EQ(r.weights_dropped, 0);
  EXPECT_EQ(e->footprint().kv_spare, 0u);
  EXPECT_EQ(e->footprint().kv(), kv);

  // Under a memory limit nothing is kept: the limit bounds what is held.
  e->set_kv_spare_limit(uint64_t{1} << 30);
  e->set_memory_limit(e->footprint().total() * 4);
  {
    Session a(*e);
    a.feed(random_tokens(40, nv, 26));
  }
  EXPECT_EQ(e->footprint().kv_spare, 0u);
  e->set_memory_limit(0);
  {
    Session a(*e);
    a.feed(random_tokens(40, nv, 27));
  }
  EXPECT_EQ(e->footprint().kv_spare, static_cast<uint64_t>(3 * nl) * chunk_bytes) << "kept again without the limit";
}

}  // namespace
}  // namespace ebb
