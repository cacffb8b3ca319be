// The command line as a user runs it: stdout carries only the generated
// text, stderr the summary; bad input gives a clear error and exit code 1.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <algorithm>

#include "model/gguf.h"
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

// ---- usage errors: exit status 2 and a message that names the problem ----

TEST(CliUsage, NoOrUnknownSubcommandIsNamed) {
  Result r = run_cli("");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("ebb needs a subcommand: run, chat"), std::string::npos) << r.err;
  r = run_cli("foo");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("'foo' is not a subcommand of ebb"), std::string::npos) << r.err;
  r = run_cli("bench foo");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("'foo' is not a subcommand of ebb bench; the subcommands are: speed, kvcodec, budget, ttft, batch, prefix"),
            std::string::npos)
      << r.err;
  r = run_cli("bench");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("ebb bench needs a subcommand: speed"), std::string::npos) << r.err;
  r = run_cli("run -m x --no-such-option");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--no-such-option"), std::string::npos) << r.err;
}

TEST(CliUsage, VersionNamesCommitAndKernels) {
  const Result r = run_cli("--version");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(^ebb \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,}(-dirty)?|unknown)\))")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(kernels: (scalar|avx2|avx512|neon) on this CPU)"))) << r.out;
}

TEST(CliUsage, BadValuesAreRefused) {
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " ";
  struct Case {
    std::string args, message;
  } cases[] = {
      {"-p hi --threads -3", "--threads -3"},
      {"-p hi --ctx -5", "--ctx -5"},
      {"-p hi -n -2", "-n -2"},
      {"-p hi --seed -7", "--seed"},
      {"-p hi --budget-system zzz", "--budget-system only applies with --memory-budget"},
      {"-p hi -f /etc/hostname", "either with -p TEXT or with -f FILE"},
      {"", "no prompt"},
  };
  for (const Case& c : cases) {
    const Result r = run_cli(m + c.args);
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
}

TEST(CliUsage, PromptFileChecks) {
  test::TempDir d("ebb-cli");
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 8 --threads 1 ";
  Result r = run_cli(m + "-f " + d.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  std::ofstream(d.file("empty")).close();
  r = run_cli(m + "-f " + d.file("empty"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is empty"), std::string::npos) << r.err;
  // -f - reads standard input, and gives what -p gives.
  const Result piped = run_cli(m + "-f -", "Once upon a time");
  const Result direct = run_cli(m + "-p \"Once upon a time\"");
  ASSERT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.out, direct.out);
  EXPECT_GT(piped.out.size(), 5u);
}

TEST(CliUsage, LlamaCppSpellings) {
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " -p Lily --temp 0 -n 4 --threads 1 ";
  const Result base = run_cli(m);
  ASSERT_EQ(base.status, 0) << base.err;
  // -ngl 0: no layer on a GPU, the CPU as without it (-ngl N > 0: test_vulkan_engine).
  Result r = run_cli(m + "-c 64 -ngl 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, base.out);
  r = run_cli(m + "--ctx-size 64");
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_cli(m + "-sys \"You tell stories\"");
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_cli("chat -m " + test::model_path("stories260K.gguf") + " -sys \"You tell stories\" --threads 1", "/quit\n");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(CliUsage, ManyThreadsAreCapped) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::string n = std::to_string(hw + 1);
  const Result r = run_cli("run -m " + test::model_path("stories260K.gguf") + " -p Lily --temp 0 -n 1 --threads " + n);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("note: --threads " + n + " is more than the " + std::to_string(hw) +
                       " hardware threads; using " + std::to_string(hw)),
            std::string::npos)
      << r.err;
}

TEST(CliRun, NPredictMinusOneRunsToTheContextEnd) {
  const Result r = run_cli("run -m " + test::model_path("stories260K.gguf") +
                           " -p \"Once upon a time\" --temp 0 -n -1 --ctx 64 --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(prompt (\d+) tok .*\| gen (\d+) tok .*stop (\w+))"))) << r.err;
  const std::string stop = m[3];
  EXPECT_TRUE(stop == "context_full" || stop == "eog") << r.err;
  if (stop == "context_full") {
    EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]), 64) << r.err;
  }
  EXPECT_GT(std::stoi(m[2]), 0) << r.err;
}

#if !defined(__SANITIZE_ADDRESS__)  // ASan reserves terabytes of address space: no ulimit -v there
TEST(CliRun, OutOfMemoryIsAMessageNotACrash) {
  // A 100-million-token prefill batch (its planned scratch is about 250 GB)
  // under a 1 GB address-space limit: the run ends with a message, exit 1.
  const Result r = run_cli("--help >/dev/null; ulimit -v 1000000; exec " + std::string(EBB_CLI_PATH) + " run -m " +
                           test::model_path("stories260K.gguf") + " -p Lily -n 4 --temp 0 --threads 1 --batch 100000000");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("ebb: error: out of memory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("unexpected error"), std::string::npos) << r.err;
}
#endif

TEST(CliRun, RandomSeedIsPrintedAndRepeats) {
  const std::string m = "run -m " + test::model_path("stories260K.gguf") + " -p Lily -n 16 --temp 1 --threads 1";
  const Result r = run_cli(m + " --seed -1");
  ASSERT_EQ(r.status, 0) << r.err;
  std::smatch s;
  ASSERT_TRUE(std::regex_search(r.err, s, std::regex(R"(seed (\d+) \(random; --seed \d+ repeats this run\))"))) << r.err;
  const Result again = run_cli(m + " --seed " + s[1].str());
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out, r.out);
  EXPECT_EQ(again.err.find("(random;"), std::string::npos) << again.err;  // a given seed is not announced
  // Greedy runs use no seed and print none.
  const Result greedy = run_cli("run -m " + test::model_path("stories260K.gguf") + " -p Lily -n 4 --temp 0");
  EXPECT_EQ(greedy.err.find("seed "), std::string::npos) << greedy.err;
}

TEST(CliRun, SummaryHasTheLoadTime) {
  const Result r = run_cli("run -m " + test::model_path("stories260K.gguf") + " -p Lily -n 2 --temp 0 --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(^load \d+\.\d\d s \| prompt )", std::regex::multiline))) << r.err;
}

// A copy of stories260K whose output norm holds NaN: every logit is NaN.
std::string nan_model(const test::TempDir& d) {
  const std::string src = test::model_path("stories260K.gguf"), dst = d.file("nan.gguf");
  std::filesystem::copy_file(src, dst);
  uint64_t offset = 0, n = 0;
  const std::unique_ptr<GgufFile> gguf = GgufFile::open(src);
  for (const GgufTensorInfo& t : gguf->tensors()) {
    if (t.name == "output_norm.weight") {
      EXPECT_EQ(t.type, DType::kF32);
      offset = t.file_offset;
      n = t.n_bytes / sizeof(float);
    }
  }
  EXPECT_GT(n, 0u);
  std::fstream f(dst, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  const float nan = NAN;
  for (uint64_t i = 0; i < n; ++i) f.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  return dst;
}

TEST(CliRun, NanLogitsEndTheRunWithAnErrorNotASignal) {
  test::TempDir d("ebb-cli");
  const std::string model = nan_model(d);
  const Result r = run_cli("run -m " + model + " -p \"Once upon a time\" --temp 0 -n 8 --threads 1");
  EXPECT_EQ(r.status, 1) << r.err;  // run_cli gives -1 for a signal (SIGABRT before)
  EXPECT_NE(r.err.find("NaN logits"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at position 5"), std::string::npos) << r.err;  // BOS + 4 prompt tokens
  EXPECT_NE(r.err.find("model file"), std::string::npos) << r.err;
}

TEST(CliChat, NanLogitsFailTheTurnAndKeepTheChat) {
  test::TempDir d("ebb-cli");
  const std::string model = nan_model(d);
  const Result r = run_cli("chat -m " + model + " --temp 0 -n 8 --threads 1", "Lily\n/memory\nTom\n");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("NaN logits"), std::string::npos) << r.err;
  // Each failed turn is undone: the context is empty between them.
  EXPECT_NE(r.err.find("context 0/"), std::string::npos) << r.err;
  size_t undone = 0;
  for (size_t at = 0; (at = r.err.find("this turn was undone", at)) != std::string::npos; ++at) ++undone;
  EXPECT_EQ(undone, 2u) << r.err;
}

TEST(CliRun, BudgetModeCountsItsResidentWeights) {
  // Budget mode keeps weights in buffers of its own (here part of 6.3 MiB in
  // a 5 MiB budget); the summary counts them, and the total stays within it.
  const Result r = run_cli("run -m " + test::model_path("tiny-qwen3-f16.gguf") +
                           " -p Lily -n 2 --temp 0 --threads 1 --ctx 128 --budget-window 1 --memory-budget 5MiB");
  ASSERT_EQ(r.status, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(mem ([0-9.]+) MiB \(weights ([0-9.]+) MiB)"))) << r.err;
  EXPECT_GT(std::stod(m[2]), 1.0) << r.err;
  EXPECT_LT(std::stod(m[2]), 6.0) << r.err;
  EXPECT_LE(std::stod(m[1]), 5.0) << r.err;
}

TEST(CliRun, TheCgroupLimitIsTheDefaultMemoryLimit) {
  // A fake cgroup v2 tree with a 12 MiB limit: 8 MiB go to the process
  // beside the LLM, so elastic memory keeps weights and KV within about 3 MiB
  // (tiny-qwen3 F16 has 6.3 MiB of weights) and streams the rest. The text is
  // the same as without a limit.
  test::TempDir d("ebb-cli");
  std::filesystem::create_directories(d.file("proc/self"));
  std::filesystem::create_directories(d.file("sys/fs/cgroup/chat"));
  std::ofstream(d.file("proc/self/cgroup")) << "0::/chat\n";
  std::ofstream(d.file("proc/self/mountinfo")) << "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  std::ofstream(d.file("sys/fs/cgroup/chat/memory.max")) << (12u << 20) << "\n";
  const std::string run = "run -m " + test::model_path("tiny-qwen3-f16.gguf") + " -p Lily -n 8 --temp 0 --threads 1";
  const Result free = run_cli(run + " --cgroup-root /nonexistent");
  const Result limited = run_cli(run + " --cgroup-root " + d.path());
  ASSERT_EQ(free.status, 0) << free.err;
  ASSERT_EQ(limited.status, 0) << limited.err;
  EXPECT_NE(limited.err.find("note: cgroup v2 memory limit 12.00 MiB"), std::string::npos) << limited.err;
  EXPECT_EQ(free.err.find("cgroup"), std::string::npos) << free.err;
  EXPECT_EQ(limited.out, free.out);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(limited.err, m, std::regex(R"(weights ([0-9.]+) (KiB|MiB))"))) << limited.err;
  const double mib = std::stod(m[1]) / (m[2] == "KiB" ? 1024.0 : 1.0);
  EXPECT_LT(mib, 3.0) << limited.err;
  // --memory-limit off ignores the cgroup.
  const Result off = run_cli(run + " --cgroup-root " + d.path() + " --memory-limit off");
  EXPECT_EQ(off.err.find("cgroup"), std::string::npos) << off.err;
}

TEST(CliBench, ABudgetThatFailsIsReportedAfterTheTableOfThoseThatRan) {
  // 1 MiB is below what the plan needs; 90% runs and is printed.
  const Result r = run_cli("bench budget -m " + test::model_path("tiny-qwen3-f16.gguf") +
                           " --budget 1MiB,90% --systems ebb -n 4 -p 8 --reps 1 --no-resident -t 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.out.find("system           budget"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\nebb +5\.63 MiB +[0-9.]+ )"))) << r.out;
  EXPECT_NE(r.err.find("ebb: error: bench budget: ebb at 1.00 MiB: memory budget 1.0 MiB is below the minimum"),
            std::string::npos)
      << r.err;
}

TEST(CliBench, HelpShowsNoArtefactsOrInternalOptions) {
  const Result r = run_cli("--help-all");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.find("{false}"), std::string::npos);
  EXPECT_EQ(r.out.find("--child"), std::string::npos);
  EXPECT_EQ(r.out.find("--storage-gbps"), std::string::npos);
  EXPECT_EQ(r.out.find("Benchmarks (speed)"), std::string::npos);
  EXPECT_NE(r.out.find("speed (tok/s"), std::string::npos);
  // One thread default everywhere: all hardware threads.
  EXPECT_EQ(r.out.find("--threads INT=2"), std::string::npos);
}

}  // namespace
}  // namespace ebb
