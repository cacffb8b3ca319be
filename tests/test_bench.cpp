// ebb bench speed: the library numbers, the memory-bandwidth probe and the
// CLI's JSON output. No timing thresholds: only that the numbers are sane.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "platform/error.h"
#include "platform/membw.h"
#include "bench/bench_speed.h"
#include "runtime/engine.h"
#include "support.h"

namespace ebb {
namespace {

bool positive_finite(double x) { return std::isfinite(x) && x > 0; }

// Layer units plus the output head, derived from the slots by name.
uint64_t expected_streamed_bytes(const Model& m) {
  uint64_t b = 0;
  for (int l = 0; l < m.n_layers(); ++l) b += m.layer_unit(l).bytes();
  const TensorSlot* head = nullptr;
  for (const TensorSlot& s : m.globals_unit().slots()) {
    if (s.name == "output.weight") head = &s;
  }
  if (!head) {
    for (const TensorSlot& s : m.globals_unit().slots()) {
      if (s.name == "token_embd.weight") head = &s;  // tied head
    }
  }
  EXPECT_NE(head, nullptr);
  return b + (head ? head->unit_bytes : 0);
}

TEST(BenchSpeed, TinyRunGivesPositiveFiniteNumbers) {
  EngineOptions eo;
  eo.model_path = test::model_path("stories260K.gguf");
  eo.n_threads = 2;
  Engine engine(eo);
  SpeedOptions o;
  o.prompt_tokens = 16;
  o.gen_tokens = 4;
  o.reps = 2;
  o.membw_bytes = size_t{1} << 20;
  o.membw_reps = 2;
  int calls = 0;
  o.progress = [&](int64_t rep, int64_t reps) {
    EXPECT_EQ(rep, calls);
    EXPECT_EQ(reps, 2);
    ++calls;
  };
  const SpeedResult r = bench_speed(engine, o);
  EXPECT_EQ(calls, 3);  // warm-up + 2 reps
  EXPECT_TRUE(positive_finite(r.prefill_tok_s)) << r.prefill_tok_s;
  EXPECT_TRUE(positive_finite(r.decode_tok_s)) << r.decode_tok_s;
  ASSERT_EQ(r.prefill_tok_s_reps.size(), 2u);
  ASSERT_EQ(r.decode_tok_s_reps.size(), 2u);
  ASSERT_EQ(r.prefill_seconds_reps.size(), 2u);
  ASSERT_EQ(r.decode_seconds_reps.size(), 2u);
  for (double v : r.prefill_tok_s_reps) EXPECT_TRUE(positive_finite(v));
  for (double v : r.decode_tok_s_reps) EXPECT_TRUE(positive_finite(v));
  // Median of two is their mean.
  EXPECT_DOUBLE_EQ(r.decode_tok_s, 0.5 * (r.decode_tok_s_reps[0] + r.decode_tok_s_reps[1]));

  EXPECT_EQ(r.model_bytes, expected_streamed_bytes(engine.model()));
  EXPECT_EQ(r.model_bytes, r.layer_bytes + r.output_head_bytes);
  EXPECT_GT(r.output_head_bytes, 0u);
  uint64_t typed = 0;
  for (const auto& [t, b] : r.bytes_by_type) typed += b;
  EXPECT_LE(typed, r.model_bytes);  // unit padding is not attributed to a format
  EXPECT_GT(typed, r.model_bytes * 9 / 10);

  EXPECT_TRUE(positive_finite(r.achieved_gbps));
  EXPECT_DOUBLE_EQ(r.achieved_gbps, r.model_bytes * r.decode_tok_s / 1e9);
  EXPECT_TRUE(positive_finite(r.mem_bw_gbps));
  EXPECT_EQ(r.mem_bw_gbps_reps.size(), 2u);
  EXPECT_TRUE(positive_finite(r.decode_roofline_tok_s));
  EXPECT_TRUE(positive_finite(r.prefill_roofline_tok_s));
  EXPECT_TRUE(positive_finite(r.achieved_fraction));
  EXPECT_EQ(r.threads, 2);
  EXPECT_EQ(r.n_ctx, 16 + 4 + 1);
  EXPECT_EQ(r.prompt_tokens, 16);
  EXPECT_EQ(r.gen_tokens, 4);
  EXPECT_EQ(r.reps, 2);
}

TEST(BenchSpeed, ContextTooSmallIsAnError) {
  EngineOptions eo;
  eo.model_path = test::model_path("stories260K.gguf");
  eo.n_threads = 1;
  Engine engine(eo);
  SpeedOptions o;
  o.prompt_tokens = 16;
  o.gen_tokens = 4;
  o.reps = 1;
  o.n_ctx = 20;  // needs 21
  o.membw_bytes = 0;
  try {
    bench_speed(engine, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  o.n_ctx = 0;
  o.reps = 0;
  EXPECT_THROW(bench_speed(engine, o), Error);
}

TEST(BenchMembw, SmallBufferGivesPlausibleBandwidth) {
  for (int threads : {1, 2}) {
    ThreadPool pool(ThreadPoolOptions{.n_threads = threads});
    const ReadBandwidth bw = measure_read_bandwidth(pool, size_t{4} << 20, 3);
    EXPECT_GT(bw.median_gbps, 0.1) << threads << " threads";
    EXPECT_TRUE(std::isfinite(bw.median_gbps));
    EXPECT_EQ(bw.reps_gbps.size(), 3u);
    EXPECT_EQ(bw.bytes, size_t{4} << 20);
    EXPECT_EQ(bw.threads, threads);
  }
  ThreadPool pool(ThreadPoolOptions{.n_threads = 2});
  // Not a multiple of a page: rounded down to whole pages. (Too small for a
  // meaningful rate: the fork-join wake-up dominates, so only > 0.)
  const ReadBandwidth odd = measure_read_bandwidth(pool, 100000, 1);
  EXPECT_EQ(odd.bytes, 98304u);
  EXPECT_GT(odd.median_gbps, 0);
  EXPECT_DOUBLE_EQ(measure_read_bandwidth_gbps(pool, 4096, 1) > 0, true);
  EXPECT_THROW(measure_read_bandwidth(pool, 100, 1), Error);
  EXPECT_THROW(measure_read_bandwidth(pool, 1 << 20, 0), Error);
}

using test::CliResult;
using test::run_cli;

TEST(BenchCli, SpeedJsonHasTheRequiredKeys) {
  const std::string model = test::model_path("stories260K.gguf");
  const CliResult r = run_cli("bench speed -m " + model + " -p 16 -n 4 --reps 2 --threads 2 --membw-mib 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  for (const char* k : {"prefill_tok_s", "decode_tok_s", "mem_bw_gbps", "model_bytes", "threads", "isa",
                        "prompt_tokens", "gen_tokens", "reps", "prefill_tok_s_reps", "decode_tok_s_reps", "model",
                        "achieved_gbps", "decode_roofline_tok_s"}) {
    EXPECT_TRUE(j.contains(k)) << k << " missing in " << r.out;
  }
  EXPECT_EQ(j["model"], model);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_EQ(j["prompt_tokens"], 16);
  EXPECT_EQ(j["gen_tokens"], 4);
  EXPECT_EQ(j["reps"], 2);
  EXPECT_EQ(j["prefill_tok_s_reps"].size(), 2u);
  EXPECT_EQ(j["decode_tok_s_reps"].size(), 2u);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_GT(j["mem_bw_gbps"].get<double>(), 0);
  // Progress goes to stderr, never into the JSON.
  EXPECT_NE(r.err.find("rep 2/2"), std::string::npos) << r.err;
}

TEST(BenchCli, SpeedTableAndErrors) {
  const std::string model = test::model_path("stories260K.gguf");
  const CliResult t = run_cli("bench speed -m " + model + " -p 8 -n 2 --reps 1 --threads 1 --membw-mib 1");
  ASSERT_EQ(t.status, 0) << t.err;
  for (const char* k : {"prefill tok/s", "decode tok/s", "model MB / token", "achieved GB/s", "machine read GB/s",
                        "achieved / bound", "decode roofline tok/s", "isa", "threads"}) {
    EXPECT_NE(t.out.find(k), std::string::npos) << k << " missing in\n" << t.out;
  }
  // `bench` needs a benchmark name.
  EXPECT_NE(run_cli("bench").status, 0);
  const CliResult ctx = run_cli("bench speed -m " + model + " -p 16 -n 4 --reps 1 -c 8 --membw-mib 0");
  EXPECT_EQ(ctx.status, 1);
  EXPECT_NE(ctx.err.find("context"), std::string::npos) << ctx.err;
  const CliResult reps = run_cli("bench speed -m " + model + " --reps 0 --membw-mib 0");
  EXPECT_EQ(reps.status, 1);
  EXPECT_NE(reps.err.find("reps must be >= 1"), std::string::npos) << reps.err;
  const CliResult missing = run_cli("bench speed -m /nonexistent/model.gguf");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model.gguf"), std::string::npos) << missing.err;
}

// bench batch --choices: one request of N choices through the scheduler
// against one; the N choices hold the prompt's full chunks once, so their
// KV is less than N copies of one choice's.
TEST(BenchCli, ChoicesJsonComparesNChoicesWithOne) {
  const std::string model = test::model_path("stories260K.gguf");
  const CliResult r =
      run_cli("bench batch -m " + model + " --choices 3 -p 64 -n 8 --reps 1 --kv-chunk 16 --threads 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j["choices"], 3);
  EXPECT_EQ(j["ratio_to_one_choice_reps"].size(), 1u);
  EXPECT_GT(j["one_choice_decode_tok_s"].get<double>(), 0);
  EXPECT_GT(j["choices_decode_tok_s"].get<double>(), 0);
  EXPECT_GT(j["bound_tok_s"].get<double>(), 0);
  EXPECT_GT(j["kv_bytes_one_choice"].get<double>(), 0);
  EXPECT_LT(j["kv_bytes_choices"].get<double>(), j["kv_bytes_choices_unshared"].get<double>()) << r.out;
  EXPECT_NE(run_cli("bench batch -m " + model + " --choices 1").status, 0) << "one choice is no comparison";
}

}  // namespace
}  // namespace ebb
