// Elastic memory end to end: evict to every stage, restore (overlapped with
// the next request's prefill), and compare with a session that was never
// evicted; the process really gives the memory back; faults lose nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/matmul.h"
#include "memory/weight_verify.h"
#include "platform/direct_io.h"
#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

using test::make_temp_dir;
using test::model_path;

constexpr int64_t kChunk = 64;

EngineOptions engine_options(const std::string& model, const std::string& swap_dir) {
  EngineOptions o;
  o.model_path = model;
  o.n_threads = 2;
  o.kv_chunk_size = kChunk;
  o.elastic_opts.swap_dir = swap_dir;
  return o;
}

std::unique_ptr<Engine> make_engine(const std::string& model, const std::string& swap_dir,
                                    EvictPolicyKind policy = EvictPolicyKind::kHybrid, uint64_t swap_bytes = 0) {
  EngineOptions o = engine_options(model, swap_dir);
  o.elastic_opts.policy = policy;
  o.elastic_opts.swap_bytes = swap_bytes;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

// KL(p || q) of the softmaxes of two logit rows.
double kl(std::span<const float> a, std::span<const float> b) {
  auto probs = [](std::span<const float> x) {
    const float m = *std::max_element(x.begin(), x.end());
    std::vector<double> p(x.size());
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += p[i] = std::exp(static_cast<double>(x[i] - m));
    for (double& v : p) v /= s;
    return p;
  };
  const std::vector<double> p = probs(a), q = probs(b);
  double d = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) d += p[i] * std::log(p[i] / std::max(q[i], 1e-300));
  return d;
}

size_t argmax(std::span<const float> x) { return std::max_element(x.begin(), x.end()) - x.begin(); }

uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t evictable(Engine& e, const Session& s) {
  uint64_t b = s.kv().total_bytes();
  for (int l = 0; l < e.model().n_layers(); ++l) b += e.model().layer_unit(l).bytes();
  return b;
}

// Flips a byte in the swap slot of the first chunk in `state`; false when none is.
bool corrupt_first(Engine& eng, const KvCache& kv, UnitState state, uint64_t at) {
  for (int l = 0; l < eng.model().n_layers(); ++l)
    for (int64_t c = 0; c < kv.n_chunks(l); ++c)
      if (kv.meta(l, c).state == state) {
        eng.elastic()->swap_file()->corrupt_for_test(kv.meta(l, c).slot, at);
        return true;
      }
  return false;
}

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = make_temp_dir("ebb-elastic");
    model = model_path("tiny-qwen3-f16.gguf");
    ref_engine = make_engine(model, dir);
    n_vocab = ref_engine->config().n_vocab;
    context = tokens(600, n_vocab, 1);  // 10 chunks of 64 per layer, the last one partial
    query = tokens(8, n_vocab, 2);
    Session ref(*ref_engine);
    ref.feed(context);
    const auto l = ref.feed(query);
    ref_logits.assign(l.begin(), l.end());
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string dir, model;
  std::unique_ptr<Engine> ref_engine;
  int64_t n_vocab = 0;
  std::vector<TokenId> context, query;
  std::vector<float> ref_logits;
};

TEST_F(ElasticTest, EveryStageRestoresExactlyOrWithinCodecTolerance) {
  auto eng = make_engine(model, dir);
  Session s(*eng);
  s.feed(context);
  const uint64_t total = evictable(*eng, s);
  std::set<EvictStage> stages;
  for (double frac : {0.05, 0.3, 0.6, 0.9, 1.0, 2.0}) {
    s.truncate(static_cast<int64_t>(context.size()));
    ASSERT_TRUE(eng->elastic()->fully_resident());
    const auto r = eng->evict(static_cast<uint64_t>(frac * total));
    stages.insert(r.last_stage);
    if (frac <= 1.0) {
      EXPECT_GE(r.freed, static_cast<uint64_t>(frac * total)) << frac;
    }
    const auto logits = s.feed(query);  // restore overlapped with this prefill
    EXPECT_TRUE(eng->elastic()->fully_resident());
    EXPECT_GT(s.last_restore().seconds, 0.0);
    const bool lossy = r.kv_to_compressed > 0;
    if (!lossy) {
      for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << "frac " << frac << " token " << i;
    } else {
      EXPECT_LT(kl(ref_logits, logits), 1e-3) << frac;
      EXPECT_EQ(argmax(ref_logits), argmax(logits)) << frac;
    }
  }
  // The sizes above walk the policy through KVonly, KVandW (or Wonly) and CompKV.
  EXPECT_GE(stages.size(), 3u);
}

TEST_F(ElasticTest, PartialOffloadIsLossless) {
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
  Session s(*eng);
  s.feed(context);
  const auto r = eng->evict(evictable(*eng, s));
  EXPECT_EQ(r.kv_to_compressed, 0);
  EXPECT_GT(r.kv_to_storage, 0);
  EXPECT_EQ(r.weights_dropped, eng->model().n_layers());
  const auto logits = s.feed(query);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << i;
}

TEST_F(ElasticTest, LosslessKvGoesRawToStorageAndEveryFractionRestoresExactly) {
  EngineOptions o = engine_options(model, dir);
  o.elastic_opts.lossless_kv = true;
  Engine eng(o);
  Session s(eng);
  s.feed(context);
  const uint64_t total = evictable(eng, s);
  int64_t stored = 0;
  for (double frac : {0.05, 0.3, 0.6, 1.0}) {
    s.truncate(static_cast<int64_t>(context.size()));
    const auto r = eng.evict(static_cast<uint64_t>(frac * total));
    EXPECT_EQ(r.kv_to_compressed, 0) << frac;
    EXPECT_EQ(r.after.compressed, 0u) << frac;
    EXPECT_GE(r.freed, static_cast<uint64_t>(frac * total)) << frac << ": " << r.note;
    stored += r.kv_to_storage;
    const auto logits = s.feed(query);
    for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << "frac " << frac << " token " << i;
  }
  EXPECT_GT(stored, 0);
}

// A server's sessions come and go; the prefix cache keeps their KV. The swap
// file, sized at its first use by the sessions attached then (none here),
// grows to take all of that KV.
TEST_F(ElasticTest, TheSwapFileGrowsForPrefixCachedKvOfSessionsThatAreGone) {
  EngineOptions o = engine_options(model, dir);
  o.prefix_cache = true;
  o.elastic_opts.lossless_kv = true;
  Engine eng(o);
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t seed : {21u, 22u, 23u}) {
    prompts.push_back(tokens(8 * kChunk + 1, n_vocab, seed));
    Session gone(eng);
    gone.feed(prompts.back());
  }
  const uint64_t held = eng.footprint().kv();
  ASSERT_GT(held, uint64_t{2} << 20);  // more than the 1 MiB the file starts with
  const auto r = eng.evict(2 * eng.footprint().total());  // everything
  EXPECT_EQ(r.kv_to_compressed, 0);
  EXPECT_EQ(r.after.kv_resident, 0u) << r.note;
  EXPECT_GE(r.after.kv_stored, held);
  EXPECT_EQ(r.note.find("swap file full"), std::string::npos) << r.note;
  ASSERT_NE(eng.elastic()->swap_file(), nullptr);
  EXPECT_GE(eng.elastic()->swap_file()->capacity(), held);
  // The cached KV comes back from the grown file bit for bit.
  std::vector<TokenId> next = prompts[1];
  next.insert(next.end(), query.begin(), query.end());
  Session again(eng);
  const auto logits = again.feed(next);
  EXPECT_EQ(again.reused_tokens(), 8 * kChunk);
  Session fresh(*ref_engine);
  const auto want = fresh.feed(next);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], want[i]) << i;
}

TEST_F(ElasticTest, EvictGivesMemoryBackToTheProcess) {
  auto eng = make_engine(model, dir);
  Session s(*eng);
  s.feed(context);
  const uint64_t before_rss = rss_bytes();
  const uint64_t before_ledger = static_cast<uint64_t>(eng->ledger().total());
  const auto r = eng->evict(evictable(*eng, s) / 2);
  const uint64_t after_rss = rss_bytes();
  const uint64_t after_ledger = static_cast<uint64_t>(eng->ledger().total());
  // What evict() reports is what the ledger lost, and the process's RSS fell
  // by about as much (anonymous pages unmapped, not just forgotten).
  EXPECT_EQ(r.freed, before_ledger - after_ledger);
  EXPECT_GE(static_cast<double>(before_rss - std::min(before_rss, after_rss)), 0.8 * static_cast<double>(r.freed))
      << "rss " << before_rss << " -> " << after_rss << ", freed " << r.freed;
  // Footprint by state adds up.
  const Footprint f = eng->footprint();
  EXPECT_GT(f.weights_stored + f.kv_stored + f.compressed, 0u);
  s.feed(query);
  EXPECT_EQ(eng->footprint().weights_stored, 0u);
  // Restored chunks share mappings per layer; evicting again still gives
  // each one's pages back.
  const uint64_t rss2 = rss_bytes();
  const auto r2 = eng->evict(evictable(*eng, s) / 2);
  EXPECT_GE(static_cast<double>(rss2 - std::min(rss2, rss_bytes())), 0.8 * static_cast<double>(r2.freed));
  EXPECT_GT(r2.kv_to_compressed + r2.kv_to_storage, 0);
}

TEST_F(ElasticTest, TwentyRandomCyclesAddNoErrorBeyondOneCodecRound) {
  auto eng = make_engine(model, dir);
  Session s(*eng);
  s.feed(context);
  const uint64_t total = evictable(*eng, s);
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    eng->evict(static_cast<uint64_t>(std::uniform_real_distribution<double>(0.05, 1.0)(rng) * total));
    if (i % 2) eng->restore();  // explicit restores and on-demand ones
  }
  const auto logits = s.feed(query);
  EXPECT_LT(kl(ref_logits, logits), 1e-3);
  EXPECT_EQ(argmax(ref_logits), argmax(logits));
}

TEST_F(ElasticTest, GenerationContinuesAfterRestore) {
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
  Session a(*ref_engine), b(*eng);
  a.feed(context);
  b.feed(context);
  eng->evict(evictable(*eng, b) * 3 / 4);
  GenerateOptions g;
  g.max_tokens = 12;
  g.stop_at_eog = false;
  g.sampling.temperature = 0;  // greedy
  const auto ga = generate(a, query, g, nullptr);
  const auto gb = generate(b, query, g, nullptr);
  EXPECT_EQ(ga.tokens, gb.tokens);
}

// While a restore runs beside the prefill, the compute threads spin only
// briefly at joins (the cores are shared); afterwards decode gets its long
// spins back.
TEST_F(ElasticTest, RestoreShortensThePoolsSpinsAndGivesThemBack) {
  auto eng = make_engine(model, dir);
  Session s(*eng);
  s.feed(context);
  ThreadPool& pool = eng->pool();
  const int normal = pool.default_spin_iterations();
  ASSERT_GT(normal, ElasticMemory::kRestoreSpin);
  eng->evict(evictable(*eng, s) / 2);
  EXPECT_EQ(pool.spin_iterations(), normal);
  eng->elastic()->begin_restore();
  EXPECT_EQ(pool.spin_iterations(), ElasticMemory::kRestoreSpin);
  eng->elastic()->wait_restored();
  EXPECT_EQ(pool.spin_iterations(), normal);
  const auto l = s.feed(query);
  EXPECT_EQ(pool.spin_iterations(), normal);
  EXPECT_EQ(argmax(l), argmax(ref_logits));
}

TEST_F(ElasticTest, UnwritableSwapDirFallsBackToCompressedOnly) {
  const std::string file = dir + "/not-a-dir";
  std::ofstream(file) << "x";
  auto eng = make_engine(model, file + "/swap");
  Session s(*eng);
  s.feed(context);
  // Everything: the policy reaches the stages that want storage.
  const auto r = eng->evict(2 * evictable(*eng, s));
  EXPECT_EQ(r.kv_to_storage, 0);
  EXPECT_EQ(r.compressed_to_storage, 0);
  EXPECT_GT(r.kv_to_compressed, 0);
  EXPECT_NE(r.note.find("not-a-dir"), std::string::npos) << r.note;
  const auto logits = s.feed(query);
  EXPECT_EQ(argmax(ref_logits), argmax(logits));
}

TEST_F(ElasticTest, CompressedStackHoldsItsBlobsWithoutGaps) {
  // All KV into the stack (no usable swap directory), 10 full chunks per
  // layer. Each segment must hold whole blobs with their alignment: this
  // model's int8 blob of a 64-token chunk is 16912 bytes, so segments of
  // 4 x 16912 held only 3 padded ones and the stack took a third more memory
  // than its blobs.
  const std::string file = dir + "/not-a-dir";
  std::ofstream(file) << "x";
  auto eng = make_engine(model, file + "/swap");
  const std::vector<TokenId> full = tokens(10 * kChunk, n_vocab, 3);
  std::vector<float> want;
  {
    Session ref(*ref_engine);
    ref.feed(full);
    const auto l = ref.feed(query);
    want.assign(l.begin(), l.end());
  }
  Session s(*eng);
  s.feed(full);
  const auto r = eng->evict(2 * evictable(*eng, s));
  ASSERT_EQ(r.kv_to_compressed, 4 * 10);
  const ModelConfig& c = eng->config();
  const KvChunkShape shape{kChunk, kChunk, c.n_head_kv * c.head_dim, DType::kF16};
  const uint64_t blob = kv_codec(KvCodecId::kInt8, Isa::kScalar).max_compressed_bytes(shape);
  ASSERT_EQ(blob, 16912u);
  const uint64_t slot = (blob + CompressedStack::kAlign - 1) / CompressedStack::kAlign * CompressedStack::kAlign;
  const uint64_t segment = CompressedStack::segment_bytes_for(blob);
  ASSERT_EQ(segment, 4 * slot);
  EXPECT_EQ(eng->footprint().compressed, 10 * segment);
  const auto logits = s.feed(query);
  EXPECT_EQ(argmax(want), argmax(logits));
  EXPECT_LT(kl(want, logits), 1e-3);
}

TEST_F(ElasticTest, FullSwapFileStopsWithAMessageAndLosesNothing) {
  // 1 MiB of swap holds 32 of the 40 KV chunks of 32 KiB.
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload, 1 << 20);
  Session s(*eng);
  s.feed(context);
  const auto r = eng->evict(evictable(*eng, s));
  EXPECT_EQ(r.kv_to_storage, 32);
  EXPECT_EQ(s.kv().total_bytes(), 8 * s.kv().chunk_alloc_bytes());  // the 8 that did not fit stay resident
  EXPECT_NE(r.note.find("swap file full"), std::string::npos) << r.note;
  const auto logits = s.feed(query);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << i;
}

TEST_F(ElasticTest, FailedSwapWritesKeepRawChunksResident) {
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
  Session s(*eng);
  s.feed(context);
  eng->evict(1);  // makes the swap file
  eng->restore();
  eng->elastic()->swap_file()->fail_writes_for_test(3);
  const auto r = eng->evict(s.kv().total_bytes() / 2);
  EXPECT_NE(r.note.find("3 swap writes failed"), std::string::npos) << r.note;
  int64_t stored = 0;
  for (int l = 0; l < eng->model().n_layers(); ++l)
    for (int64_t c = 0; c < s.kv().n_chunks(l); ++c) stored += s.kv().meta(l, c).state == UnitState::kStored;
  EXPECT_EQ(stored, r.kv_to_storage - 3);  // the three whose writes failed stayed in RAM
  const auto logits = s.feed(query);
  EXPECT_EQ(s.recomputes(), 0);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << i;
}

TEST_F(ElasticTest, FailedCompressedWritesPutTheBlobsBackOnTheStack) {
  // Reference: everything evicted (compressed chunks written to storage) and restored.
  std::vector<float> want;
  {
    auto eng = make_engine(model, dir);
    Session s(*eng);
    s.feed(context);
    const auto r = eng->evict(2 * evictable(*eng, s));
    ASSERT_GT(r.compressed_to_storage, 4);
    const auto l = s.feed(query);
    want.assign(l.begin(), l.end());
  }
  auto eng = make_engine(model, dir);
  Session s(*eng);
  s.feed(context);
  eng->evict(2 * evictable(*eng, s));  // makes the swap file
  eng->restore();
  eng->elastic()->swap_file()->fail_writes_for_test(4);
  const auto r = eng->evict(2 * evictable(*eng, s));
  EXPECT_NE(r.note.find("4 swap writes failed"), std::string::npos) << r.note;
  int64_t on_stack = 0;
  for (int l = 0; l < eng->model().n_layers(); ++l)
    for (int64_t c = 0; c < s.kv().n_chunks(l); ++c) on_stack += s.kv().meta(l, c).state == UnitState::kCompressed;
  EXPECT_EQ(on_stack, 4);
  EXPECT_GT(eng->footprint().compressed, 0u);
  // Nothing was lost: the blobs restore to the same bytes as from storage
  // (the codec is idempotent, so the earlier cycle changes nothing either).
  const auto logits = s.feed(query);
  EXPECT_EQ(s.recomputes(), 0);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], want[i]) << i;
}

TEST_F(ElasticTest, CorruptSwapSlotIsRecomputedFromTokens) {
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
  Session s(*eng);
  s.feed(context);
  eng->evict(s.kv().total_bytes() / 2);
  // Corrupt one stored chunk on disk.
  ASSERT_TRUE(corrupt_first(*eng, s.kv(), UnitState::kStored, 100));
  const auto logits = s.feed(query);
  EXPECT_EQ(s.recomputes(), 1);
  EXPECT_EQ(s.last_restore().chunks_lost, 1);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << i;
}

TEST_F(ElasticTest, CorruptCompressedSlotIsRecomputedToo) {
  auto eng = make_engine(model, dir);
  Session s(*eng);
  s.feed(context);
  const auto r = eng->evict(2 * evictable(*eng, s));  // through CompKV: compressed chunks on storage
  ASSERT_GT(r.compressed_to_storage, 0);
  ASSERT_TRUE(corrupt_first(*eng, s.kv(), UnitState::kStoredCompressed, 40));
  const auto logits = s.feed(query);
  EXPECT_EQ(s.recomputes(), 1);
  EXPECT_EQ(s.last_restore().chunks_lost, 1);
  EXPECT_LT(kl(ref_logits, logits), 1e-3);
  EXPECT_EQ(argmax(ref_logits), argmax(logits));
}

TEST_F(ElasticTest, ChangedModelFileFailsWeightRestoreAndTheTurnIsRolledBack) {
  const std::string copy = dir + "/model.gguf";
  std::filesystem::copy_file(model, copy);
  auto eng = make_engine(copy, dir);
  Session s(*eng);
  s.feed(context);
  eng->evict(evictable(*eng, s));  // weights dropped too
  ASSERT_GT(eng->footprint().weights_stored, 0u);
  { std::ofstream(copy, std::ios::app) << "changed"; }
  try {
    s.feed(query);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed on disk"), std::string::npos) << e.what();
  }
  // The failed turn adds nothing: the conversation is as it was before it
  // (a later turn does not carry the failed one's tokens), and nothing of
  // it is lost.
  EXPECT_EQ(s.tokens(), context);
  EXPECT_LE(s.n_processed(), static_cast<int64_t>(context.size()));
}

TEST_F(ElasticTest, OverTheMemoryLimitRequestsStreamAndComeBackWhenItRises) {
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
  Session s(*eng);
  s.feed(context);
  const uint64_t total = evictable(*eng, s);
  const uint64_t limit = total * 3 / 5;
  const EvictReport r = eng->set_memory_limit(limit);
  EXPECT_GT(r.freed, 0u);
  const auto logits = s.feed(query);  // cannot restore everything: streams
  EXPECT_TRUE(eng->elastic()->streaming());
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << i;
  // Within the limit, but for the KV the query itself added.
  EXPECT_LE(eng->elastic()->footprint().in_ram(), limit + eng->model().n_layers() * s.kv().chunk_alloc_bytes());
  // Decoding goes on under the limit, then the limit is lifted.
  const auto more = tokens(4, n_vocab, 3);
  s.feed(more);
  eng->set_memory_limit(0);
  s.truncate(static_cast<int64_t>(context.size() + query.size()));
  EXPECT_TRUE(eng->elastic()->fully_resident());
  EXPECT_FALSE(eng->elastic()->streaming());
  EXPECT_EQ(eng->elastic()->footprint().stream_window, 0u);
}

// Packed weights (Q4_0, Q8_0 on targets with packed kernels) are packed again
// after every read: restoring all layers from the file, and streaming layers
// through the window under a memory limit, both give the never-evicted logits
// bit for bit.
// Restores keep at least 64 MiB of reads queued whatever point the profile
// chose (its point is measured on idle cores; a restore's reads compete with
// the prefill), in the profile's request size; a deeper profile keeps its own.
TEST(ElasticIo, RestoresKeepAtLeast64MiBInFlight) {
  DeviceProfile p = DeviceProfile::defaults();
  auto in_flight = [](const IoOptions& o) { return static_cast<uint64_t>(o.queue_depth) * o.max_request; };
  for (uint64_t mib : {1, 2, 3, 4, 8, 64, 128}) {
    for (int depth : {1, 8, 32}) {
      p.best_request_bytes = mib << 20;
      p.best_queue_depth = depth;
      const IoOptions o = elastic_io_options(p);
      EXPECT_EQ(o.max_request, mib << 20) << mib << " MiB x " << depth;
      EXPECT_GE(in_flight(o), uint64_t{64} << 20) << mib << " MiB x " << depth;
      EXPECT_GE(o.queue_depth, std::max(4, depth)) << mib << " MiB x " << depth;
      // No deeper than the 64 MiB (or the profile's own depth, or 4) needs.
      const bool minimal = o.queue_depth == std::max(4, depth) ||
                           static_cast<uint64_t>(o.queue_depth - 1) * o.max_request < (uint64_t{64} << 20);
      EXPECT_TRUE(minimal) << mib << " MiB x " << depth << ": " << o.queue_depth << " deep";
    }
  }
  p.best_request_bytes = 512 << 10;  // below the 1 MiB floor
  p.best_queue_depth = 8;
  EXPECT_EQ(elastic_io_options(p).max_request, uint64_t{1} << 20);
  EXPECT_EQ(elastic_io_options(p).queue_depth, 64);
}

TEST(ElasticPacked, RestoredAndStreamedPackedWeightsAreExact) {
  const std::string dir = make_temp_dir("ebb-elastic-packed");
  for (const char* name : {"tiny-qwen3-q4_0.gguf", "tiny-llama-q8_0.gguf"}) {
    SCOPED_TRACE(name);
    const std::string model = model_path(name);
    auto ref = make_engine(model, dir);
    const bool packs = kernel_set(ref->isa()).format(DType::kQ4_0)->x8_gemm != nullptr;
    bool any_packed = false;
    for (const TensorSlot& t : ref->model().layer_unit(0).slots()) any_packed |= t.packing != Packing::kRows;
    EXPECT_EQ(any_packed, packs);
    const int64_t n_vocab = ref->config().n_vocab;
    const auto context = tokens(300, n_vocab, 1), query = tokens(8, n_vocab, 2);
    std::vector<float> want;
    {
      Session s(*ref);
      s.feed(context);
      const auto l = s.feed(query);
      want.assign(l.begin(), l.end());
    }
    {
      auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
      Session s(*eng);
      s.feed(context);
      EXPECT_EQ(eng->evict(evictable(*eng, s)).weights_dropped, eng->model().n_layers());
      const auto got = s.feed(query);
      for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(got[i], want[i]) << "restored, token " << i;
    }
    {
      auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
      Session s(*eng);
      s.feed(context);
      eng->set_memory_limit(evictable(*eng, s) * 3 / 5);
      const auto got = s.feed(query);
      EXPECT_TRUE(eng->elastic()->streaming());
      for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(got[i], want[i]) << "streamed, token " << i;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ebb

// Issue 21 item 7: restored and streamed weights are checked against the
// layer checksums taken at load; the descriptor held since load serves a file
// replaced or deleted under it; a failed streamed read never leaves a slot
// whose unread buffer is used.
namespace ebb {
namespace {

// Writes 4 bytes into the middle of a tensor of `file` in place and puts
// its mtime back, as `rsync --inplace -t` leaves a changed file: same size,
// inode and mtime.
void rewrite_in_place_keeping_identity(const std::string& file, const TensorSlot& t) {
  struct stat before {};
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t.file_offset + t.file_bytes / 2));
    const char junk[4] = {0x11, 0x22, 0x33, 0x44};
    f.write(junk, 4);
  }
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  struct stat after {};
  ASSERT_EQ(::stat(file.c_str(), &after), 0);
  ASSERT_EQ(after.st_ino, before.st_ino);
  ASSERT_EQ(after.st_size, before.st_size);
  ASSERT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
}

int first_dropped_layer(Engine& e) {
  for (int l = 0; l < e.model().n_layers(); ++l)
    if (!e.model().layer_unit(l).resident()) return l;
  return -1;
}

void expect_changed_error(Session& s, std::span<const TokenId> toks, int layer) {
  try {
    s.feed(toks);
    FAIL() << "weights changed on disk were used";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("differs from the weights loaded"), std::string::npos) << m;
    EXPECT_NE(m.find("layer " + std::to_string(layer)), std::string::npos) << m;
  }
}

TEST_F(ElasticTest, RestoredLayerRewrittenInPlaceWithIdentityKeptIsRefused) {
  const std::string copy = dir + "/model.gguf";
  std::filesystem::copy_file(model, copy);
  auto eng = make_engine(copy, dir);
  Session s(*eng);
  s.feed(context);
  eng->evict(evictable(*eng, s));
  const int l = first_dropped_layer(*eng);
  ASSERT_GE(l, 0);
  const LayerLayout& ls = eng->model().layout().layer_slots[l];
  rewrite_in_place_keeping_identity(copy, eng->model().layer_unit(l).slots()[ls.ffn_up]);
  ASSERT_TRUE(eng->model().file().unchanged_on_disk());  // the identity check cannot see it
  expect_changed_error(s, query, l);
}

// A restore skips the layers' CRC only while the descriptor shows the ctime
// of the open: an in-place rewrite that keeps size, inode and mtime still
// moves it, so the check runs then (and refuses the layer, above).
TEST_F(ElasticTest, CtimeTellsWhetherTheBytesMayHaveChangedSinceLoad) {
  const std::string copy = dir + "/model.gguf";
  std::filesystem::copy_file(model, copy);
  auto eng = make_engine(copy, dir);
  const int fd = ::open(copy.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(descriptor_unchanged(fd, eng->model().file()));
  EXPECT_TRUE(bytes_unchanged(fd, eng->model().file()));
  const LayerLayout& ls = eng->model().layout().layer_slots[0];
  // Past the filesystem clock's tick (a few ms), which ctimes are taken from.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  rewrite_in_place_keeping_identity(copy, eng->model().layer_unit(0).slots()[ls.ffn_up]);
  EXPECT_TRUE(descriptor_unchanged(fd, eng->model().file()));
  EXPECT_FALSE(bytes_unchanged(fd, eng->model().file()));
  ::close(fd);
}

TEST_F(ElasticTest, StreamedLayerRewrittenInPlaceWithIdentityKeptIsRefused) {
  const std::string copy = dir + "/model.gguf";
  std::filesystem::copy_file(model, copy);
  auto eng = make_engine(copy, dir, EvictPolicyKind::kPartialOffload);
  Session s(*eng);
  s.feed(context);
  eng->set_memory_limit(evictable(*eng, s) * 3 / 5);
  const auto first = s.feed(query);
  ASSERT_TRUE(eng->elastic()->streaming());
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(first[i], ref_logits[i]) << i;
  const int l = first_dropped_layer(*eng);
  ASSERT_GE(l, 0);
  const LayerLayout& ls = eng->model().layout().layer_slots[l];
  rewrite_in_place_keeping_identity(copy, eng->model().layer_unit(l).slots()[ls.attn_q]);
  // The slots may still hold layer l from the last pass: make the next pass read it.
  const auto more = tokens(70, n_vocab, 4);
  expect_changed_error(s, more, l);
}

TEST_F(ElasticTest, FileReplacedOrDeletedIsRestoredFromTheHeldDescriptor) {
  const std::string copy = dir + "/model.gguf";
  std::filesystem::copy_file(model, copy);
  auto eng = make_engine(copy, dir, EvictPolicyKind::kPartialOffload);  // lossless: logits compare exactly
  Session s(*eng);
  s.feed(context);
  eng->evict(evictable(*eng, s));
  ASSERT_GE(first_dropped_layer(*eng), 0);
  // Another file renamed over the path (a new inode whose bytes differ).
  const std::string other = dir + "/other.gguf";
  std::filesystem::copy_file(model, other);
  {
    const int l = first_dropped_layer(*eng);
    const TensorSlot& t = eng->model().layer_unit(l).slots()[eng->model().layout().layer_slots[l].ffn_up];
    std::fstream f(other, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t.file_offset + 64));
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  std::filesystem::rename(other, copy);
  ASSERT_FALSE(eng->model().file().unchanged_on_disk());
  auto logits = s.feed(query);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << "replaced, token " << i;
  // Deleted: the descriptor still holds the original inode.
  s.truncate(static_cast<int64_t>(context.size()));
  eng->evict(evictable(*eng, s));
  ASSERT_GE(first_dropped_layer(*eng), 0);
  std::filesystem::remove(copy);
  logits = s.feed(query);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << "deleted, token " << i;
}

TEST_F(ElasticTest, FailedStreamedReadIsReadAgainNotUsedUnread) {
  auto eng = make_engine(model, dir, EvictPolicyKind::kPartialOffload);
  Session s(*eng);
  s.feed(context);
  eng->set_memory_limit(evictable(*eng, s) * 3 / 5);
  ElasticMemory& em = *eng->elastic();
  em.restore();  // what fits comes back; the rest streams, no slot holds a layer yet
  ASSERT_TRUE(em.streaming());
  const int l = first_dropped_layer(*eng);
  ASSERT_GE(l, 0);
  const std::vector<int32_t> toks = {1, 2};
  fail_reads_for_test(model, 1);  // the pass's first streamed read: layer l
  em.begin_pass(toks);
  for (int i = 0; i < l; ++i) {
    em.acquire_layer(i);
    em.release_layer(i);
  }
  try {
    em.acquire_layer(l);
    FAIL() << "the injected fault was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected read fault"), std::string::npos) << e.what();
  }
  fail_reads_for_test("", 0);
  const LayerWeights w = em.acquire_layer(l);
  const WeightUnit& ru = ref_engine->model().layer_unit(l);
  const int q = ref_engine->model().layout().layer_slots[l].attn_q;
  EXPECT_EQ(std::memcmp(w.q.data, ru.data(q), ru.slots()[q].unit_bytes), 0)
      << "layer " << l << " served from a buffer its failed read left";
  em.release_layer(l);
  // A whole turn afterwards is exact.
  const auto logits = s.feed(query);
  for (int64_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], ref_logits[i]) << i;
}

// The OS-paging baseline (EngineOptions::os_paging, what `ebb bench ttft`
// compares with): the layers come from a mapping of the GGUF, which after its
// pages were dropped faults back in and gives the resident engine's logits;
// it cannot be combined with elastic memory.
TEST(OsPaging, MappedWeightsGiveTheResidentLogitsAndExcludeElasticMemory) {
  EngineOptions o;
  o.model_path = model_path("tiny-qwen3-f16.gguf");
  o.n_threads = 2;
  o.elastic = false;
  Engine resident(o);
  EXPECT_EQ(resident.mmap_weights(), nullptr);
  o.os_paging = true;
  Engine paged(o);
  ASSERT_NE(paged.mmap_weights(), nullptr);
  EXPECT_EQ(paged.weight_source(), paged.mmap_weights());
  EXPECT_EQ(paged.mmap_weights()->mapped_bytes(), std::filesystem::file_size(o.model_path));
  std::vector<TokenId> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back(static_cast<TokenId>(1 + (i * 37) % (resident.config().n_vocab - 1)));
  Session a(resident), b(paged);
  // Twice each: the second feed after the mapping's pages were dropped.
  for (int round = 0; round < 2; ++round) {
    const std::span<const float> want = a.feed(tokens);
    const std::span<const float> got = b.feed(tokens);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "round " << round << ", logit " << i;
    paged.mmap_weights()->drop_pages();
  }
  o.elastic = true;
  try {
    Engine both(o);
    FAIL() << "os_paging with elastic memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("os_paging"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ebb
