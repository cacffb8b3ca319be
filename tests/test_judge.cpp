// The judge prompt as background inference (runtime/judge.h) and the
// learning state on disk (runtime/learn_store.h): the template and the
// score parser; a judge call on stories260K whose answer a grammar forces
// to a digit, run by the scheduler behind foreground work that arrived
// after it (foreground-first), greedy and so repeatable; an answer with no
// score; the state saved and loaded back whole, and a version's weights
// written and read back as the same version number.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <future>
#include <string>

#include "runtime/adapters.h"
#include "runtime/judge.h"
#include "runtime/learn_store.h"
#include "runtime/scheduler.h"
#include "runtime/trace_store.h"
#include "support.h"

namespace ebb {
namespace {

TEST(JudgePrompt, TemplateFillsPlaceholders) {
  EXPECT_EQ(render_judge_prompt("Q: {prompt}\nA: {response}\nUser: {feedback}\n{{score}}: ", "p", "r", "f"),
            "Q: p\nA: r\nUser: f\n{score}: ");
  EXPECT_EQ(render_judge_prompt("{response}{response}", "", "x", ""), "xx");
  EXPECT_THROW(check_judge_template("{answer}"), Error);
  EXPECT_THROW(check_judge_template("open { never closed"), Error);
  EXPECT_THROW(check_judge_template("a } alone"), Error);
  EXPECT_NO_THROW(check_judge_template("{prompt} {{literal}}"));
}

TEST(JudgePrompt, ScoresFromAnswers) {
  EXPECT_EQ(parse_judge_score("0"), -1.0);
  EXPECT_EQ(parse_judge_score("5"), 0.0);
  EXPECT_EQ(parse_judge_score(" 10"), 1.0);
  EXPECT_EQ(parse_judge_score("7/10"), 0.4);
  EXPECT_EQ(parse_judge_score("8."), 0.6);
  EXPECT_EQ(parse_judge_score("Yes, it is"), 1.0);
  EXPECT_EQ(parse_judge_score("no"), -1.0);
  for (const char* bad : {"", "  ", "11", "7.5", "maybe", "-3", "abc", "100"})
    EXPECT_FALSE(parse_judge_score(bad)) << "'" << bad << "'";
}

std::unique_ptr<Engine> tiny_engine() {
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 1;
  o.kv_chunk_size = 16;
  o.prefill_batch = 16;
  return std::make_unique<Engine>(o);
}

JudgeCall call_of(Engine& e, const std::string& gbnf, int64_t max_tokens = 3) {
  JudgeCall c;
  c.prompt = e.tokenizer().encode(render_judge_prompt("Once upon a time {response}. Was it good? Score: ", "",
                                                      "Lily saw a cat", ""));
  if (!gbnf.empty()) {
    c.grammar = grammar::Grammar::parse(gbnf);
    c.vocab = grammar::TokenTrie::from_tokenizer(e.tokenizer());
  }
  c.max_tokens = max_tokens;
  return c;
}

// A judge call submitted first, a foreground generation after it, both
// while the scheduler is held by a control call: the foreground request
// runs to its end before the judge's first step, and no foreground wait is
// attributed to the judge. The answer is the grammar's digit, the same on
// a second call (greedy).
TEST(JudgeCall, RunsBehindForegroundWithAForcedDigit) {
  auto e = tiny_engine();
  Scheduler sched(e.get());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::future<int> held = sched.call([released](Engine&) {
    released.wait();
    return 0;
  });
  std::promise<JudgeResult> judged;
  sched.submit_background(judge_task(*e, call_of(*e, "root ::= [0-9]"), [&](JudgeResult r) { judged.set_value(r); },
                                     &sched));
  GenerationRequest g;
  g.prompt = e->tokenizer().encode("Once upon a time");
  g.options.max_tokens = 24;
  g.options.sampling.temperature = 0;
  g.options.stop_at_eog = false;
  std::shared_ptr<GenerationStream> fg = sched.submit_generation(std::move(g));
  release.set_value();
  held.get();
  for (;;) {
    std::optional<GenerationEvent> ev = fg->next(10.0);
    ASSERT_TRUE(ev) << "no foreground event within 10 s";
    if (ev->kind != GenerationEvent::Kind::kText) break;
  }
  std::future<JudgeResult> f = judged.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const JudgeResult r = f.get();
  ASSERT_TRUE(r.ran) << r.error;
  ASSERT_EQ(r.answer.size(), 1u) << r.answer;
  EXPECT_TRUE(r.answer[0] >= '0' && r.answer[0] <= '9') << r.answer;
  ASSERT_TRUE(r.reward);
  EXPECT_DOUBLE_EQ(*r.reward, (r.answer[0] - '0' - 5) / 5.0);
  // Foreground first: the generation had ended when the judge began.
  EXPECT_EQ(r.fg_active_at_start, 0);
  EXPECT_EQ(r.fg_completed_at_start, 1);
  EXPECT_GE(r.steps, 2);  // the prompt's prefill, then the digit
  const SchedulerMetrics m = sched.metrics();
  EXPECT_EQ(m.wait_behind_s.count("judge"), 0u) << "a foreground request waited behind the judge";
  EXPECT_EQ(m.bg_completed, 1);

  // Greedy: the same call gives the same answer.
  std::promise<JudgeResult> again;
  sched.submit_background(judge_task(*e, call_of(*e, "root ::= [0-9]"), [&](JudgeResult x) { again.set_value(x); }));
  std::future<JudgeResult> f2 = again.get_future();
  ASSERT_EQ(f2.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(f2.get().answer, r.answer);
  sched.shutdown();
}

// A grammar of letters: the answer has no score, and says so.
TEST(JudgeCall, AnAnswerWithoutAScoreIsNoReward) {
  auto e = tiny_engine();
  Scheduler sched(e.get());
  std::promise<JudgeResult> judged;
  sched.submit_background(
      judge_task(*e, call_of(*e, "root ::= [a-z] [a-z] [a-z] [a-z]", 4), [&](JudgeResult r) { judged.set_value(r); }));
  std::future<JudgeResult> f = judged.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const JudgeResult r = f.get();
  ASSERT_TRUE(r.ran) << r.error;
  EXPECT_EQ(r.answer.size(), 4u) << r.answer;
  EXPECT_FALSE(r.reward) << r.answer;
  // An adapter that is not loaded: the call fails, with the reason.
  std::promise<JudgeResult> failed;
  JudgeCall c = call_of(*e, "root ::= [0-9]");
  c.adapter = "nope";
  sched.submit_background(judge_task(*e, std::move(c), [&](JudgeResult x) { failed.set_value(x); }));
  std::future<JudgeResult> f2 = failed.get_future();
  ASSERT_EQ(f2.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const JudgeResult x = f2.get();
  EXPECT_FALSE(x.ran);
  EXPECT_NE(x.error.find("nope"), std::string::npos) << x.error;
  sched.shutdown();
}

// A judge with an adapter runs under the adapter's published version,
// pinned when the call starts.
TEST(JudgeCall, RunsUnderItsAdaptersPublishedVersion) {
  auto e = tiny_engine();
  LoraInitOptions init;
  init.rank = 2;
  init.b_std = 0.05f;
  e->adapters().add("judge", init_lora(e->config(), init, e->allocator()), true);
  init.seed = 2;
  e->adapters().add("judge", init_lora(e->config(), init, e->allocator()), true);  // v2 published
  Scheduler sched(e.get());
  std::promise<JudgeResult> judged;
  JudgeCall c = call_of(*e, "root ::= [0-9]");
  c.adapter = "judge";
  sched.submit_background(judge_task(*e, std::move(c), [&](JudgeResult r) { judged.set_value(r); }));
  std::future<JudgeResult> f = judged.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const JudgeResult r = f.get();
  ASSERT_TRUE(r.ran) << r.error;
  EXPECT_EQ(r.adapter_version, 2u);
  EXPECT_TRUE(r.reward);
  sched.shutdown();
}

// The learning state saved and loaded back whole; a version's weights
// written and read back as that version number.
TEST(LearnStore, SavesAndLoadsTheState) {
  test::TempDir dir("ebb-learn-store");
  const std::string db = dir.file("traces.sqlite");
  std::string note;
  auto traces = TraceStore::open(db, {}, &note);
  ASSERT_TRUE(note.empty()) << note;
  LearnStore store(*traces);
  LearnSnapshot s;
  s.versions.push_back({"teller", "names", 1, 0, "passed", 0.5, 1.5, true, 8, 100.0, ""});
  s.versions.push_back({"teller", "names", 2, 1, "rejected", 0.9, 0.5, false, 16, 101.0, ""});
  s.published["names"] = 1;
  s.counters = {{"feedback", 7}, {"rollbacks", 1}};
  LearnLoopRow l;
  l.agent = "teller";
  l.baseline_mean = 0.25;
  l.baseline_n = 4;
  l.positives = 3;
  l.fresh = 2;
  l.rounds = 1;
  l.replay.push_back(make_sample("cmpl-1", {1, 2}, {3, 4, 5}, -0.75));
  l.heldout.push_back(make_sample("cmpl-2", {1}, {6}, 1.0).sample);
  s.loops.push_back(l);
  store.save(s);
  store.save(s);  // a second save replaces, never duplicates
  int64_t skipped = -1;
  const LearnSnapshot b = LearnStore(*traces).load(&skipped);
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(b.versions.size(), 2u);
  EXPECT_EQ(b.versions[1].version, 2u);
  EXPECT_EQ(b.versions[1].gate, "rejected");
  EXPECT_EQ(b.versions[0].loss_published, 1.5);
  EXPECT_EQ(b.published.at("names"), 1u);
  EXPECT_EQ(b.counters.at("feedback"), 7);
  ASSERT_EQ(b.loops.size(), 1u);
  EXPECT_EQ(b.loops[0].baseline_mean, 0.25);
  EXPECT_EQ(b.loops[0].baseline_n, 4);
  EXPECT_EQ(b.loops[0].fresh, 2);
  ASSERT_EQ(b.loops[0].replay.size(), 1u);
  EXPECT_EQ(b.loops[0].replay[0].response_id, "cmpl-1");
  EXPECT_EQ(b.loops[0].replay[0].weight, -0.75);
  EXPECT_EQ(b.loops[0].replay[0].sample.tokens, l.replay[0].sample.tokens);
  EXPECT_EQ(b.loops[0].replay[0].sample.weights, l.replay[0].sample.weights);
  ASSERT_EQ(b.loops[0].heldout.size(), 1u);
  EXPECT_EQ(b.loops[0].heldout[0].tokens, l.heldout[0].tokens);

  // Weights: written as learned/names/v3.gguf, loaded back as version 3.
  auto e = tiny_engine();
  LoraInitOptions init;
  init.rank = 2;
  init.b_std = 0.01f;
  std::unique_ptr<LoraAdapter> lora = init_lora(e->config(), init, e->allocator());
  const std::string rel = store.write_weights("names", 3, *lora);
  EXPECT_EQ(rel, "learned/names/v3.gguf");
  const AdapterInfo i = e->adapters().load_version(dir.file(rel), "names", 3, true);
  EXPECT_EQ(i.version, 3u);
  EXPECT_TRUE(i.published);
  EXPECT_THROW(e->adapters().load_version(dir.file(rel), "names", 3, false), Error);
  // The next version a training commit makes counts on from it.
  init.seed = 2;  // other bytes: a new version, not the same one again
  EXPECT_EQ(e->adapters().add("names", init_lora(e->config(), init, e->allocator()), false).version, 4u);
  // A sample whose blobs are not whole ids and weights is left out, counted.
  traces->with_db([](sqlite3* d) {
    ASSERT_EQ(sqlite3_exec(d,
                           "INSERT INTO learn_samples (agent, heldout, seq, response_id, weight, tokens, weights) "
                           "VALUES ('teller', 0, 99, 'bad', 1.0, x'010203', x'00000000')",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
  });
  const LearnSnapshot c = store.load(&skipped);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(c.loops[0].replay.size(), 1u);
  // A save whose records name no file removes the file.
  store.save(s);
  EXPECT_FALSE(std::filesystem::exists(dir.file(rel)));
}

// A version-1 trace database (before the learning state's tables) is
// migrated in place: its traces stay, no note, the state can be kept.
TEST(LearnStore, MigratesAVersion1Database) {
  test::TempDir dir("ebb-learn-migrate");
  const std::string db = dir.file("traces.sqlite");
  std::string note;
  {
    auto traces = TraceStore::open(db, {}, &note);
    Trace t;
    t.response_id = "cmpl-old-1";
    t.agent = "teller";
    t.prompt = {1, 2};
    t.output = {5, 6};
    t.text = "old";
    traces->record(t);
  }
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h,
                         "DROP TABLE learn_versions; DROP TABLE learn_published; DROP TABLE learn_counters;"
                         "DROP TABLE learn_agents; DROP TABLE learn_samples; PRAGMA user_version=1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  auto traces = TraceStore::open(db, {}, &note);
  EXPECT_TRUE(note.empty()) << note;
  ASSERT_TRUE(traces->find("cmpl-old-1"));
  EXPECT_EQ(traces->find("cmpl-old-1")->text, "old");
  LearnStore store(*traces);
  LearnSnapshot s;
  s.counters["feedback"] = 3;
  store.save(s);
  EXPECT_EQ(store.load().counters.at("feedback"), 3);
  int64_t version = 0;
  traces->with_db([&](sqlite3* d) {
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(d, "PRAGMA user_version", -1, &st, nullptr);
    if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  });
  EXPECT_EQ(version, 2);
}

}  // namespace
}  // namespace ebb
