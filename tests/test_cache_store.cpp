// The prefix cache's persistent tier: a new engine (a new process) resumes a
// conversation from the KV files of an earlier one, bit for bit; corrupt,
// truncated, foreign and non-finite files are detected, deleted and their KV
// recomputed (the answer is never wrong); a process killed mid-conversation
// leaves only whole files; the directory stays within its size limit.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sys/wait.h>
#include <unistd.h>

#include "memory/cache_store.h"
#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kChunk = 16;

std::unique_ptr<Engine> engine_for(const std::string& model, const std::string& dir, uint64_t limit = 0) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 2;
  o.kv_chunk_size = kChunk;
  o.prefill_batch = 8;
  o.prefix_cache = true;
  o.cache_dir = dir;
  o.cache_dir_bytes = limit;
  return std::make_unique<Engine>(o);
}

std::vector<TokenId> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  return t;
}

// Past stories260K's 128-token training context: the tests need room.
SessionOptions roomy() {
  SessionOptions so;
  so.n_ctx = 512;
  return so;
}

std::vector<fs::path> node_files(const std::string& dir) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

struct Resumed {
  std::vector<float> logits;
  int64_t reused = 0;
};

// A new engine on `dir` feeds the whole conversation.
Resumed resume(const std::string& model, const std::string& dir, const std::vector<TokenId>& all) {
  auto e = engine_for(model, dir);
  Session s(*e, roomy());
  const std::span<const float> l = s.feed(all);
  return {{l.begin(), l.end()}, s.reused_tokens()};
}

std::vector<float> recompute(const std::string& model, const std::vector<TokenId>& all) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 2;
  o.kv_chunk_size = kChunk;
  o.prefill_batch = 8;
  Engine e(o);
  Session s(e, roomy());
  const std::span<const float> l = s.feed(all);
  return {l.begin(), l.end()};
}

class CacheStoreTest : public testing::Test {
 protected:
  void SetUp() override {
    auto e = engine_for(model, dir.path());
    prefix = random_tokens(3 * kChunk + 4, e->config().n_vocab, 5);
    turn = random_tokens(6, e->config().n_vocab, 6);
    all = prefix;
    all.insert(all.end(), turn.begin(), turn.end());
    Session s(*e, roomy());
    s.feed(prefix);
    EXPECT_EQ(e->cache_store()->stats().written, 3);
    want = recompute(model, all);
  }
  const std::string model = "stories260K.gguf";
  test::TempDir dir{"ebb-kvstore"};
  std::vector<TokenId> prefix, turn, all;
  std::vector<float> want;
};

TEST_F(CacheStoreTest, ANewEngineResumesFromTheFilesBitForBit) {
  ASSERT_EQ(node_files(dir.path()).size(), 3u);
  const Resumed r = resume(model, dir.path(), all);
  EXPECT_EQ(r.reused, 3 * kChunk);
  ASSERT_EQ(r.logits.size(), want.size());
  EXPECT_EQ(std::memcmp(r.logits.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST_F(CacheStoreTest, CorruptTruncatedAndForeignFilesAreRecomputed) {
  const std::vector<fs::path> files = node_files(dir.path());
  ASSERT_EQ(files.size(), 3u);
  // Which file holds which chunk is in its header; corrupt them all in
  // different ways and every one must be refused.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(files[0]) - 100));
    f.put('\x5a');
  }
  fs::resize_file(files[1], fs::file_size(files[1]) - 4096);
  {
    std::fstream f(files[2], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);  // inside the header
    f.put('\x01');
  }
  auto e = engine_for(model, dir.path());
  Session s(*e, roomy());
  const std::span<const float> got = s.feed(all);
  EXPECT_EQ(s.reused_tokens(), 0);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_GE(e->cache_store()->stats().rejected, 1);
  EXPECT_NE(e->cache_store()->stats().last_error.find("recomputed"), std::string::npos);
  // Each bad file is refused when a lookup reaches it; a later engine finds
  // none it accepts until the recomputed chunks are written again.
  for (int round = 0; round < 3; ++round) {
    auto e2 = engine_for(model, dir.path());
    Session s2(*e2, roomy());
    const std::span<const float> again = s2.feed(all);
    EXPECT_EQ(std::memcmp(again.data(), want.data(), want.size() * sizeof(float)), 0) << "round " << round;
  }
  const Resumed last = resume(model, dir.path(), all);
  EXPECT_EQ(last.reused, 3 * kChunk) << "rewritten after recompute";
}

TEST_F(CacheStoreTest, AnotherModelsFilesAreRefused) {
  // stories260K-f16 has the same vocabulary and shapes, another fingerprint.
  const std::string other = "stories260K-f16.gguf";
  auto e = engine_for(other, dir.path());
  Session s(*e, roomy());
  const std::span<const float> got = s.feed(all);
  EXPECT_EQ(s.reused_tokens(), 0);
  EXPECT_EQ(e->cache_store()->stats().rejected, 1);
  EXPECT_NE(e->cache_store()->stats().last_error.find("another model"), std::string::npos);
  const std::vector<float> ref = recompute(other, all);
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
}

TEST_F(CacheStoreTest, NonFiniteKvUnderAValidChecksumIsRefused) {
  test::TempDir d2("ebb-kvstore-nan");
  {
    // A session whose third chunk holds a NaN when the cache writes it.
    auto e = engine_for(model, d2.path());
    SessionOptions so = roomy();
    so.use_prefix_cache = false;
    Session s(*e, so);
    s.feed(prefix);
    auto* h = reinterpret_cast<uint16_t*>(s.kv().chunk(1, 2).storage.data());
    h[7] = 0x7E00;  // F16 NaN
    e->prefix_cache()->insert(s.cache_key(), prefix, s.kv());
    EXPECT_EQ(e->cache_store()->stats().written, 3);
  }
  auto e = engine_for(model, d2.path());
  Session s(*e, roomy());
  const std::span<const float> got = s.feed(all);
  EXPECT_EQ(s.reused_tokens(), 2 * kChunk);
  EXPECT_NE(e->cache_store()->stats().last_error.find("non-finite"), std::string::npos);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST_F(CacheStoreTest, AProcessKilledMidConversationLeavesWholeFilesOnly) {
  test::TempDir d2("ebb-kvstore-kill");
  const std::vector<TokenId> longer = random_tokens(25 * kChunk, 512, 9);  // stories260K holds 512
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child writes node after node and is killed while doing so.
    try {
      auto e = engine_for(model, d2.path());
      Session s(*e, roomy());
      for (size_t i = 0; i < longer.size(); i += kChunk) {
        s.feed(std::span<const TokenId>(longer).subspan(i, kChunk));
        if (i == 12 * kChunk) kill(getpid(), SIGKILL);
      }
    } catch (...) {
    }
    _exit(1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  // Every file there is whole: a new engine reads them all back, and the
  // conversation's logits are right.
  std::vector<TokenId> all2(longer.begin(), longer.begin() + 12 * kChunk + 3);
  auto e = engine_for(model, d2.path());
  Session s(*e, roomy());
  const std::span<const float> got = s.feed(all2);
  EXPECT_GE(s.reused_tokens(), 10 * kChunk);
  EXPECT_EQ(e->cache_store()->stats().rejected, 0);
  const std::vector<float> ref = recompute(model, all2);
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
  for (const fs::path& p : node_files(d2.path())) EXPECT_EQ(p.extension(), ".kv");
}

TEST_F(CacheStoreTest, TheDirectoryStaysWithinItsLimit) {
  const uint64_t per_file = fs::file_size(node_files(dir.path())[0]);
  test::TempDir d2("ebb-kvstore-limit");
  auto e = engine_for(model, d2.path(), 2 * per_file);
  Session s(*e, roomy());
  s.feed(prefix);
  EXPECT_EQ(node_files(d2.path()).size(), 2u);
  EXPECT_LE(e->cache_store()->bytes(), 2 * per_file);
  EXPECT_EQ(e->cache_store()->stats().evicted, 1);
}

TEST(CacheStore, ADirectoryThatCannotBeUsedIsAClearError) {
  try {
    engine_for("stories260K.gguf", "/proc/self/ebb-cache");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/self/ebb-cache"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ebb
