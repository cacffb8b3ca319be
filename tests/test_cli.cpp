// The command line as a user runs it: stdout carries only the generated
// text, stderr the summary; bad input gives a clear error and exit code 1.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

#include "support.h"

namespace ebb {
namespace {

using test::run_cli;
using Result = test::CliResult;

TEST(Cli, RunPrintsTheGoldenContinuation) {
  const auto golden = test::load_golden("stories260K");
  const Result r = run_cli("run -m " + test::model_path("stories260K.gguf") +
                           " -p \"Once upon a time\" -n 48 --temp 0 --threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, golden[0].greedy_text + "\n");
  // The summary goes to stderr: prompt and generation speed, TTFT, memory.
  EXPECT_NE(r.err.find("prompt 5 tok"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gen 48 tok"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ttft"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mem "), std::string::npos) << r.err;
}

TEST(Cli, SameSeedSameText) {
  const std::string args = "run -m " + test::model_path("stories260K.gguf") +
                           " -p \"Lily\" -n 24 --temp 0.9 --top-k 20 --top-p 0.9 --seed 7 --threads 1";
  const Result a = run_cli(args), b = run_cli(args);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_GT(a.out.size(), 10u);
}

TEST(Cli, MissingModelIsAClearError) {
  const Result r = run_cli("run -m /nonexistent/model.gguf -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, BadOptionValueIsAClearError) {
  const Result r = run_cli("run -m " + test::model_path("stories260K.gguf") + " -p hi --top-p 3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;
}

TEST(Cli, InspectShowsLayersAndKvSize) {
  const Result r = run_cli("inspect " + test::model_path("tiny-qwen3-q4_k_m.gguf"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("qwen3"), std::string::npos);
  EXPECT_NE(r.out.find("layer 3"), std::string::npos);
  EXPECT_NE(r.out.find("KV per 1k tokens"), std::string::npos);
  EXPECT_NE(r.out.find("blk.0.attn_q_norm.weight"), std::string::npos);
}

TEST(Cli, ChatKeepsTheConversationBetweenTurns) {
  const Result r = run_cli("chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 16 --threads 1",
                           "Once upon a time\nThe end\n/memory\n/quit\n");
  ASSERT_EQ(r.status, 0) << r.err;
  // Two answers, each followed by a summary; the second turn ran only its
  // new tokens, so its prompt count is small.
  size_t first = r.err.find("prompt ");
  ASSERT_NE(first, std::string::npos) << r.err;
  size_t second = r.err.find("prompt ", first + 1);
  ASSERT_NE(second, std::string::npos) << r.err;
  const int n2 = std::stoi(r.err.substr(second + 7));
  EXPECT_LT(n2, 20) << r.err;
  EXPECT_NE(r.err.find("context "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ebb
