// ebb serve inside a memory cgroup (v1) under concurrent load: the limit
// it computes leaves room for what the process holds outside the ledger
// and for requests on their way in, and generations whose KV would pass it
// wait instead of getting the process OOM-killed. Needs root and the v1
// memory controller at /sys/fs/cgroup/memory (as on the CI machines); it
// says so and skips elsewhere.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace ebb::test {
namespace {

using nlohmann::json;

constexpr const char* kMemRoot = "/sys/fs/cgroup/memory";

uint64_t read_u64(const std::string& path) {
  std::ifstream f(path);
  uint64_t v = 0;
  f >> v;
  return v;
}

void write_str(const std::string& path, const std::string& v) {
  std::ofstream f(path);
  f << v;
}

// A cgroup made for the test and removed after it (its processes gone).
struct Cgroup {
  std::string dir;
  explicit Cgroup(uint64_t limit) {
    dir = std::string(kMemRoot) + "/ebb-test-" + std::to_string(::getpid());
    if (::mkdir(dir.c_str(), 0755) != 0) {
      dir.clear();
      return;
    }
    write_str(dir + "/memory.limit_in_bytes", std::to_string(limit));
    write_str(dir + "/memory.swappiness", "0");
  }
  ~Cgroup() {
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
};

// A completion of `prompt` token ids that generates exactly n tokens.
json request(const std::vector<int>& prompt, int n) {
  return {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}};
}

TEST(ServeCgroup, ConcurrentLoadStaysInsideTheCgroupWithRequestsWaitingForRoom) {
  if (::access((std::string(kMemRoot) + "/cgroup.procs").c_str(), W_OK) != 0)
    GTEST_SKIP() << "no writable cgroup v1 memory controller at " << kMemRoot << " (needs root)";
  const std::string model = model_path("tiny-qwen3-f16.gguf");
  const std::vector<std::string> args = {"-c", "4096", "--max-body", "64KiB", "--quiet"};

  // The server's resident size once it has answered a request, unconstrained.
  uint64_t idle = 0;
  {
    ServerProcess s(args, model);
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    ASSERT_EQ(post(*c, "/v1/completions", request({1, 2, 3}, 4)).status, 200);
    idle = rss_bytes(s.pid());
  }
  ASSERT_GT(idle, 0u);
  // Room for the weights and the KV of about two of the eight requests
  // beside what the server holds and reserves (32 MiB + 4 x 64 KiB).
  const uint64_t limit = idle + (33u << 20) + (10u << 20);
  Cgroup cg(limit);
  ASSERT_FALSE(cg.dir.empty()) << "cannot make a cgroup under " << kMemRoot;
  int answered = 0;
  {
    ServerProcess s(args, model, cg.dir + "/cgroup.procs");
    ASSERT_GT(s.port(), 0) << s.first_line();
    // Eight clients at once, each 2,000 prompt tokens and 1,500 generated:
    // about 7 MB of KV each, 56 MB if they all ran together.
    std::vector<std::thread> ths;
    std::atomic<int> ok{0}, bad{0};
    for (int i = 0; i < 8; ++i) {
      ths.emplace_back([&, i] {
        std::mt19937 g(static_cast<unsigned>(i));
        std::vector<int> prompt(2000);
        for (int& t : prompt) t = 3 + static_cast<int>(g() % 500);
        auto c = client(s.port());
        c->set_read_timeout(300, 0);
        auto r = c->Post("/v1/completions", request(prompt, 1500).dump(), "application/json");
        (r && r->status == 200 ? ok : bad)++;
      });
    }
    for (auto& t : ths) t.join();
    answered = ok.load();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(::kill(s.pid(), 0), 0) << "the server is gone (OOM-killed?)";
    auto c = client(s.port());
    EXPECT_GT(metric_value(*c, "ebb_requests_deferred_memory_total"), 0) << "no request waited for room";
    EXPECT_EQ(s.stop(SIGTERM), 0);
  }
  EXPECT_EQ(answered, 8);
  EXPECT_LE(read_u64(cg.dir + "/memory.max_usage_in_bytes"), limit);
}

}  // namespace
}  // namespace ebb::test
