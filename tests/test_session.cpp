// Sessions: turns, context limits, save/load, and exact memory accounting.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

std::unique_ptr<Engine> engine_for(const std::string& model) {
  EngineOptions o;
  o.model_path = test::model_path(model);
  o.n_threads = 2;
  return std::make_unique<Engine>(o);
}

GenerateStats greedy(Session& s, std::span<const TokenId> prompt, int64_t n) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampling.temperature = 0;
  go.stop_at_eog = false;
  return generate(s, prompt, go, nullptr);
}

class SessionTest : public testing::Test {
 protected:
  void SetUp() override {
    engine = engine_for("stories260K.gguf");
    dir = test::make_temp_dir("ebb-session");
    prompt = engine->tokenizer().encode("Once upon a time");
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::unique_ptr<Engine> engine;
  std::string dir;
  std::vector<TokenId> prompt;
};

// The default KV chunk follows the context: 256 tokens, or a quarter of a
// small context as a power of two (at least 16), so the prefix cache, whose
// granularity is the chunk, can share prefixes there too.
TEST(DefaultKvChunk, FollowsTheContextAndAnExplicitSizeWins) {
  EXPECT_EQ(default_kv_chunk_size(4096), 256);
  EXPECT_EQ(default_kv_chunk_size(1024), 256);
  EXPECT_EQ(default_kv_chunk_size(1023), 128);
  EXPECT_EQ(default_kv_chunk_size(512), 128);
  EXPECT_EQ(default_kv_chunk_size(128), 32);
  EXPECT_EQ(default_kv_chunk_size(100), 16);
  EXPECT_EQ(default_kv_chunk_size(16), 16);
  EXPECT_EQ(default_kv_chunk_size(0), 256);  // unknown
  auto adaptive = engine_for("stories260K.gguf");  // trained on 128 tokens
  EXPECT_EQ(adaptive->options().kv_chunk_size, 32);
  EXPECT_EQ(Session(*adaptive).options().kv_chunk_size, 32);
  SessionOptions big;
  big.n_ctx = 2048;
  EXPECT_EQ(Session(*adaptive, big).options().kv_chunk_size, 256);
  SessionOptions own;
  own.kv_chunk_size = 8;
  EXPECT_EQ(Session(*adaptive, own).options().kv_chunk_size, 8);
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 1;
  o.kv_chunk_size = 256;  // given: every session that asks for none gets it
  Engine fixed(o);
  EXPECT_EQ(Session(fixed).options().kv_chunk_size, 256);
}

TEST_F(SessionTest, SecondTurnRunsOnlyNewTokens) {
  Session s(*engine);
  const GenerateStats a = greedy(s, prompt, 10);
  EXPECT_EQ(a.prompt_tokens, static_cast<int64_t>(prompt.size()));
  // The last sampled token is pending: part of the conversation, not yet run.
  EXPECT_EQ(s.tokens().size(), prompt.size() + 10);
  EXPECT_EQ(s.n_processed(), static_cast<int64_t>(prompt.size() + 9));
  const std::vector<TokenId> more = {261};
  const GenerateStats b = greedy(s, more, 5);
  EXPECT_EQ(b.prompt_tokens, 2);  // the pending token and the new one
}

TEST_F(SessionTest, ContinuationEqualsSingleGeneration) {
  Session one(*engine);
  const GenerateStats full = greedy(one, prompt, 20);
  Session two(*engine);
  const GenerateStats first = greedy(two, prompt, 8);
  const GenerateStats rest = greedy(two, {}, 12);
  std::vector<TokenId> joined = first.tokens;
  joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(joined, full.tokens);
}

TEST_F(SessionTest, ContextFullIsAClearErrorAndLosesNothing) {
  SessionOptions so;
  so.n_ctx = 16;
  Session s(*engine, so);
  std::vector<TokenId> long_prompt(17, 300);
  try {
    s.feed(long_prompt);
    FAIL() << "expected a context-full error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context full"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(s.tokens().empty());
  // Generation stops at the limit with every kept token in the session.
  const GenerateStats st = greedy(s, prompt, 100);
  EXPECT_EQ(st.stop, StopReason::kContextFull);
  EXPECT_EQ(static_cast<int64_t>(s.tokens().size()), so.n_ctx);
  EXPECT_EQ(s.tokens().size(), prompt.size() + st.tokens.size());
}

TEST_F(SessionTest, SavedAndLoadedSessionContinuesExactly) {
  const std::string path = dir + "/s.ebbsession";
  Session a(*engine);
  greedy(a, prompt, 12);
  a.save(path);
  const GenerateStats cont_a = greedy(a, {}, 16);

  Session b(*engine);
  b.load(path);
  EXPECT_EQ(b.tokens().size(), prompt.size() + 12);
  const GenerateStats cont_b = greedy(b, {}, 16);
  EXPECT_EQ(cont_a.tokens, cont_b.tokens);
  EXPECT_EQ(cont_b.prompt_tokens, 1);  // only the pending token ran: KV came from the file
}

TEST_F(SessionTest, LoadIntoAnotherModelIsRefused) {
  const std::string path = dir + "/s.ebbsession";
  Session a(*engine);
  greedy(a, prompt, 4);
  a.save(path);
  auto other = engine_for("stories260K-f16.gguf");
  Session b(*other);
  try {
    b.load(path);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different model"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(b.tokens().empty());
}

TEST_F(SessionTest, CorruptSessionFileIsDetected) {
  const std::string path = dir + "/s.ebbsession";
  Session a(*engine);
  greedy(a, prompt, 4);
  a.save(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c = 0x5a;
    f.write(&c, 1);
  }
  Session b(*engine);
  EXPECT_THROW(b.load(path), Error);
  std::filesystem::resize_file(path, 100);
  EXPECT_THROW(b.load(path), Error);
}

TEST_F(SessionTest, FootprintEqualsAllocatorLedger) {
  auto check = [&](const char* when) {
    const Footprint f = engine->footprint();
    EXPECT_EQ(static_cast<int64_t>(f.total()), engine->ledger().total()) << when;
  };
  check("after load");
  SessionOptions so;
  so.kv_chunk_size = 8;
  {
    Session s(*engine, so);
    check("empty session");
    greedy(s, prompt, 30);
    check("after generation");
    const Footprint f = engine->footprint();
    // 34 processed tokens in chunks of 8: 5 chunks per layer.
    for (uint64_t kv : f.kv_per_layer) EXPECT_EQ(kv, 5 * s.kv().chunk_alloc_bytes());
    EXPECT_GT(f.weights(), 0u);
    EXPECT_GT(f.globals, 0u);
    s.truncate(3);
    check("after truncate");
    EXPECT_EQ(engine->footprint().kv_per_layer[0], s.kv().chunk_alloc_bytes());
  }
  check("after session end");
  EXPECT_EQ(engine->footprint().kv(), 0u);
}

}  // namespace
}  // namespace ebb
