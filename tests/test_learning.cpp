// The learning loop's pieces below the server: the rule judge, the REINFORCE
// baseline, samples, the trace store's retention, reopening and schema
// check, and the agents file (runtime/learner.h, trace_store.h, agents.h).
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/agents.h"
#include "runtime/learner.h"
#include "runtime/trace_store.h"
#include "support.h"

namespace ebb {
namespace {

TEST(Judge, RenameForms) {
  for (const char* s : {"call her Zorba, not Lily", "Call her Zorba, not Lily.", "call him Zorba, not Lily!",
                        "Zorba, not Lily", "call me Zorba, not Lily"}) {
    const std::optional<Rename> r = parse_rename(s);
    ASSERT_TRUE(r) << s;
    EXPECT_EQ(r->to, "Zorba") << s;
    EXPECT_EQ(r->from, "Lily") << s;
  }
  const std::optional<Rename> two = parse_rename("call her Mary Ann, not Lily Rose");
  ASSERT_TRUE(two);
  EXPECT_EQ(two->to, "Mary Ann");
  EXPECT_EQ(two->from, "Lily Rose");
  for (const char* s : {"that was nice", "call her Zorba", "call her , not Lily", "call her Zorba, not Zorba",
                        "call her <b>, not Lily"})
    EXPECT_FALSE(parse_rename(s)) << s;
}

TEST(Judge, CorrectionRewritesWholeWords) {
  EXPECT_EQ(judge_correction("Lily met Lilyanne. Lily's cat ran.", "call her Zorba, not Lily"),
            "Zorba met Lilyanne. Zorba's cat ran.");
  EXPECT_FALSE(judge_correction("Tom ran.", "call her Zorba, not Lily"));  // nothing to rename
  EXPECT_EQ(judge_correction("Tom ran.", "Tom walked."), "Tom walked.");   // the text the user wanted
}

TEST(Judge, BaselineAndSamples) {
  RewardBaseline b;
  EXPECT_DOUBLE_EQ(b.advantage(1.0), 1.0);   // against 0 before any reward
  EXPECT_DOUBLE_EQ(b.advantage(-1.0), -2.0); // against the mean 1
  EXPECT_DOUBLE_EQ(b.advantage(3.0), 3.0);   // against the mean 0
  EXPECT_DOUBLE_EQ(b.mean(), 1.0);
  const LearnSample s = make_sample("r", {1, 2, 3}, {7, 8}, -0.5);
  EXPECT_EQ(s.sample.tokens, (std::vector<int32_t>{1, 2, 3, 7, 8}));
  EXPECT_EQ(s.sample.weights, (std::vector<float>{0, 0, 0, -0.5f, -0.5f}));
  EXPECT_FALSE(s.positive());
  ReplayBuffer rb(2);
  for (const char* id : {"a", "b", "c"}) rb.push(make_sample(id, {1}, {2}, 1));
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb.items().front().response_id, "b");  // the oldest went first
}

Trace trace(const std::string& id, int n) {
  Trace t;
  t.response_id = id;
  t.agent = "a";
  t.adapter = "x";
  t.adapter_version = 2;
  t.prompt = {1, 2, 3};
  t.output.assign(static_cast<size_t>(n), 9);
  t.text = "story " + id;
  return t;
}

TEST(TraceStore, RetentionDropsRowsWithFeedbackFirst) {
  test::TempDir dir("ebb-traces");
  TraceStoreOptions o;
  o.max_rows = 5;
  std::string note;
  auto st = TraceStore::open(dir.file("t.sqlite"), o, &note);
  EXPECT_TRUE(note.empty()) << note;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(st->record(trace("r" + std::to_string(i), 4)));
  TraceFeedback fb;
  fb.reward = 1.0;
  ASSERT_TRUE(st->attach("r3", fb));
  EXPECT_FALSE(st->attach("nope", fb));
  ASSERT_TRUE(st->record(trace("r5", 4)));
  const TraceCounts c = st->counts();
  EXPECT_EQ(c.rows, 5);
  EXPECT_EQ(c.retired, 1);
  EXPECT_EQ(c.with_feedback, 0);
  EXPECT_FALSE(st->find("r3"));   // rewarded: the first to go
  EXPECT_TRUE(st->find("r0"));    // the oldest without feedback stays
  // Then the oldest.
  ASSERT_TRUE(st->record(trace("r6", 4)));
  st->flush();
  EXPECT_FALSE(st->find("r0"));
  EXPECT_TRUE(st->find("r6"));
  EXPECT_EQ(st->counts().bytes, 5 * static_cast<int64_t>((3 + 4) * 4 + std::string("story r0").size()));
}

TEST(TraceStore, BytesBoundAndReopen) {
  test::TempDir dir("ebb-traces");
  TraceStoreOptions o;
  o.max_bytes = 3 * (3 + 100) * 4 + 3 * 10;  // about three traces
  {
    auto st = TraceStore::open(dir.file("t.sqlite"), o, nullptr);
    for (int i = 0; i < 6; ++i) st->record(trace("r" + std::to_string(i), 100));
    const TraceCounts c = st->counts();
    EXPECT_LE(c.bytes, o.max_bytes);
    EXPECT_EQ(c.rows, 3);
  }
  std::string note;
  auto st = TraceStore::open(dir.file("t.sqlite"), o, &note);
  EXPECT_TRUE(note.empty()) << note;
  EXPECT_EQ(st->counts().rows, 3);
  const std::optional<Trace> t = st->find("r5");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(t->output.size(), 100u);
  EXPECT_EQ(t->adapter_version, 2u);
}

// A turn with no prompt tokens (a completion of "") or no output (stopped at
// once) is still a trace: empty id lists are empty blobs, not NULLs the
// schema's NOT NULL would refuse.
TEST(TraceStore, EmptyPromptOrOutputIsKept) {
  test::TempDir dir("ebb-traces");
  auto st = TraceStore::open(dir.file("t.sqlite"), {}, nullptr);
  Trace a = trace("no-prompt", 3);
  a.prompt = std::vector<int32_t>();  // no storage: data() is null, as for a fresh list
  Trace b = trace("no-output", 0);
  ASSERT_TRUE(st->record(a));
  ASSERT_TRUE(st->record(b));
  const std::optional<Trace> ra = st->find("no-prompt");
  const std::optional<Trace> rb = st->find("no-output");
  ASSERT_TRUE(ra);
  ASSERT_TRUE(rb);
  EXPECT_TRUE(ra->prompt.empty());
  EXPECT_EQ(ra->output, (std::vector<int32_t>{9, 9, 9}));
  EXPECT_EQ(rb->prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(rb->output.empty());
  EXPECT_EQ(st->counts().rows, 2);
}

TEST(TraceStore, NewerSchemaIsMovedAside) {
  test::TempDir dir("ebb-traces");
  const std::string path = dir.file("t.sqlite");
  { auto st = TraceStore::open(path, {}, nullptr); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=9", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  std::string note;
  auto st = TraceStore::open(path, {}, &note);
  EXPECT_NE(note.find("schema version 9"), std::string::npos) << note;
  EXPECT_EQ(st->counts().rows, 0);
  EXPECT_TRUE(st->record(trace("r", 1)));
  EXPECT_TRUE(st->find("r"));
}

TEST(Agents, PersistAndRefuseBadFields) {
  test::TempDir dir("ebb-agents");
  const std::string path = dir.file("agents.json");
  {
    AgentRegistry reg(path);
    AgentSpec a = agent_from_json({{"name", "t"}, {"adapter", "n"}, {"learn", true}, {"system_prompt", "Hi."}}, {},
                                  true, reg.limits());
    EXPECT_EQ(reg.create(a), AgentRegistry::Status::kOk);
    EXPECT_EQ(reg.create(a), AgentRegistry::Status::kExists);
    a.role = "teller";
    EXPECT_EQ(reg.update(a), AgentRegistry::Status::kOk);
    EXPECT_EQ(reg.remove("zz"), AgentRegistry::Status::kNotFound);
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  AgentRegistry reg(path);
  const std::optional<AgentSpec> a = reg.get("t");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->role, "teller");
  EXPECT_EQ(a->system_prompt, "Hi.");
  EXPECT_TRUE(a->learn);
  EXPECT_EQ(a->cache_namespace(), "agent/t");
  const auto field_of = [&](const nlohmann::json& j) {
    try {
      agent_from_json(j, {}, true, reg.limits());
    } catch (const AgentError& e) {
      return e.field();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(field_of({{"name", ""}}), "name");
  EXPECT_EQ(field_of({{"name", std::string(65, 'a')}}), "name");
  EXPECT_EQ(field_of({{"name", "a"}, {"tools", "x"}}), "tools");
  EXPECT_EQ(field_of({{"name", "a"}, {"adapter", "../x"}}), "adapter");
  EXPECT_EQ(field_of({{"name", "a"}, {"adapter", "x"}, {"adapter_version", 0}}), "adapter_version");
  EXPECT_EQ(field_of({{"name", "a"}, {"adapter", "x"}, {"adapter_version", 2}, {"learn", true}}), "adapter_version");
}

}  // namespace
}  // namespace ebb
