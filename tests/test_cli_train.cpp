// ebb train as a user runs it: the README's example learns with the default
// learning rate, held-out loss, a log line per step, a loss chart, epochs,
// an ETA, and mistakes caught before any step runs.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"

namespace ebb {
namespace {

using test::run_cli;
using Result = test::CliResult;

std::string stories() { return test::model_path("stories260K.gguf"); }

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Sentences that name a fox "Zorbo", a name stories260K never writes.
void write_samples(const std::string& path, int n, int offset) {
  const char* verbs[] = {"ran", "sang", "jumped", "played", "smiled", "danced", "slept", "laughed"};
  std::ofstream f(path);
  for (int i = 0; i < n; ++i) {
    f << "{\"text\": \"Once upon a time there was a fox named Zorbo. Zorbo " << verbs[(i + offset) % 8]
      << " in the park.\"}\n";
  }
}

TEST(TrainUx, TheReadmeExampleLearnsWithTheDefaults) {
  // The README's example (train -m MODEL --data samples.jsonl -o A.gguf),
  // with fewer steps: the defaults (rank, learning rate) lower the loss.
  test::TempDir d("ebb-train");
  write_samples(d.file("train.jsonl"), 8, 0);
  write_samples(d.file("eval.jsonl"), 2, 3);
  const Result r = run_cli("train -m " + stories() + " --data " + d.file("train.jsonl") + " -o " + d.file("a.gguf") +
                           " --steps 24 --threads 2 --eval " + d.file("eval.jsonl") + " --eval-every 8 --log " +
                           d.file("log.jsonl") + " --plot " + d.file("loss.svg"));
  ASSERT_EQ(r.status, 0) << r.err;
  // The progress line: elapsed time and ETA.
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(step 1/24 \| loss [0-9.]+ \|.*\| [0-9.]+s, eta [0-9.]+s \|)")))
      << r.out;
  // One log line per step.
  const std::string log = read(d.file("log.jsonl"));
  std::vector<double> losses;
  std::vector<double> eval;
  const std::regex loss_re(R"("loss":([0-9.eE+-]+))"), eval_re(R"("eval_loss":([0-9.eE+-]+))");
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, loss_re)) << line;
    losses.push_back(std::stod(m[1]));
    if (std::regex_search(line, m, eval_re)) eval.push_back(std::stod(m[1]));
  }
  ASSERT_EQ(losses.size(), 24u) << log;
  ASSERT_EQ(eval.size(), 3u) << log;  // steps 8, 16, 24
  // The held-out loss before training is printed, and it falls.
  std::smatch before;
  ASSERT_TRUE(std::regex_search(r.out, before, std::regex(R"(eval loss ([0-9.]+) \(before training\))"))) << r.out;
  // By a factor the old default (1e-4, which fell by about half here) never
  // reached: the default learning rate learns the name.
  EXPECT_LT(eval.back(), std::stod(before[1]) * 0.25) << r.out;
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[21] + losses[22] + losses[23]) / 3;
  EXPECT_LT(last, first * 0.25) << log;
  // And the adapter tells of Zorbo, whom the base model never names.
  const std::string tell = "run -m " + stories() + " -p 'Once upon a time there was a fox named' -n 6 --temp 0 -t 1";
  const Result base = run_cli(tell), tuned = run_cli(tell + " --lora " + d.file("a.gguf"));
  ASSERT_EQ(tuned.status, 0) << tuned.err;
  EXPECT_EQ(base.out.find("Zorbo"), std::string::npos) << base.out;
  EXPECT_NE(tuned.out.find("Zorbo"), std::string::npos) << tuned.out;
  // The chart: an SVG with a train and an eval line.
  const std::string svg = read(d.file("loss.svg"));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 100);
  EXPECT_NE(svg.find("class=\"train\""), std::string::npos);
  EXPECT_NE(svg.find("class=\"eval\""), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(TrainUx, EpochsSetTheSteps) {
  test::TempDir d("ebb-train");
  write_samples(d.file("train.jsonl"), 6, 0);
  const Result r = run_cli("train -m " + stories() + " --data " + d.file("train.jsonl") + " -o " + d.file("a.gguf") +
                           " --epochs 2 --batch-size 4 --threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step 3/3 |"), std::string::npos) << r.out;  // ceil(2 x 6 / 4)
  EXPECT_EQ(run_cli("train -m " + stories() + " --data " + d.file("train.jsonl") + " -o x --epochs 1 --steps 3").status,
            2);
}

TEST(TrainUx, MistakesAreCaughtBeforeAnyStep) {
  test::TempDir d("ebb-train");
  write_samples(d.file("train.jsonl"), 2, 0);
  // No -o: refused, nothing trained.
  Result r = run_cli("train -m " + stories() + " --data " + d.file("train.jsonl") + " --threads 1");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("-o ADAPTER.gguf is required: the trained adapter would be thrown away"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
  // A messages line with no assistant turn, named by its line.
  {
    std::ofstream f(d.file("msgs.jsonl"));
    f << "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello.\"}]}\n"
      << "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n";
  }
  r = run_cli("train -m " + stories() + " --data " + d.file("msgs.jsonl") + " -o " + d.file("a.gguf"));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("msgs.jsonl:2: the messages have no \"assistant\" turn"), std::string::npos) << r.err;
  // Data without line ends (here /dev/zero): a bounded line, named.
  r = run_cli("train -m " + stories() + " --data /dev/zero -o " + d.file("a.gguf"));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("/dev/zero:1: the line is longer than"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ebb
