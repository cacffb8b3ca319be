// The compute pool: every thread runs each job once, jobs posted right after
// construction are not missed, and parallel_for covers a range exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "platform/thread_pool.h"

namespace ebb {
namespace {

TEST(ThreadPool, JobPostedImmediatelyAfterConstructionRuns) {
  // A worker that has not started yet must still see the first job.
  for (int round = 0; round < 200; ++round) {
    ThreadPool pool(ThreadPoolOptions{.n_threads = 3});
    std::atomic<int> ran{0};
    pool.run([&](int, int) { ran.fetch_add(1); });
    ASSERT_EQ(ran.load(), 3) << "round " << round;
  }
}

TEST(ThreadPool, EveryThreadRunsEachJobOnce) {
  ThreadPool pool(ThreadPoolOptions{.n_threads = 4, .spin_iterations = 10});
  for (int job = 0; job < 1000; ++job) {
    std::vector<std::atomic<int>> seen(4);
    pool.run([&](int t, int n) {
      ASSERT_EQ(n, 4);
      seen[t].fetch_add(1);
    });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  ThreadPool pool(ThreadPoolOptions{.n_threads = 2});
  for (int64_t n : {1, 7, 16, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(b % 16, 0);
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

}  // namespace
}  // namespace ebb
