// The compute pool: every thread runs each job once, jobs posted right after
// construction are not missed, and parallel_for / parallel_for_dynamic cover
// a range exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "platform/thread_name.h"
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

// Index i runs on worker i, named after the pool, or on the caller when
// worker i had not started it; index 0 always on the caller.
TEST(ThreadPool, WorkersCarryThePoolsNameAndTheCallerKeepsItsOwn) {
  set_current_thread_name("pool-test-main");
  ThreadPool pool(ThreadPoolOptions{.n_threads = 3, .name = "ebb-compute"});
  for (int job = 0; job < 100; ++job) {
    std::vector<std::string> names(3);
    pool.run([&](int t, int) { names[static_cast<size_t>(t)] = current_thread_name(); });
    EXPECT_EQ(names[0], "pool-test-main");
    for (int i = 1; i < 3; ++i)
      EXPECT_TRUE(names[i] == "ebb-compute-" + std::to_string(i) || names[i] == "pool-test-main") << names[i];
  }
}

TEST(ThreadName, LongNamesAreCutToFifteenBytes) {
  std::string got;
  std::thread([&] {
    set_current_thread_name("ebb-a-name-longer-than-fifteen");
    got = current_thread_name();
  }).join();
  EXPECT_EQ(got, "ebb-a-name-long");
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

// More threads than cores (64 on the test machine's few): every index still
// runs exactly once per job and never on two threads at once, whether its
// worker or the caller takes it, with workers that spin, yield or sleep.
TEST(ThreadPool, OversubscribedPoolRunsEveryIndexOnceAndTheCallerTakesUnstartedOnes) {
  const int n = 64;
  for (int spin : {0, 100, 20000}) {
    ThreadPool pool(ThreadPoolOptions{.n_threads = n, .spin_iterations = spin});
    std::vector<std::atomic<int>> running(n), ran(n);
    std::atomic<int> by_caller{0};
    const auto caller = std::this_thread::get_id();
    for (int job = 0; job < 200; ++job) {
      for (auto& r : ran) r.store(0);
      pool.run([&](int t, int nt) {
        ASSERT_EQ(nt, n);
        ASSERT_EQ(running[t].fetch_add(1), 0) << "index " << t << " on two threads at once";
        if (t != 0 && std::this_thread::get_id() == caller) by_caller.fetch_add(1);
        ran[t].fetch_add(1);
        running[t].fetch_sub(1);
      });
      for (int t = 0; t < n; ++t) ASSERT_EQ(ran[t].load(), 1) << "spin " << spin << " job " << job << " index " << t;
    }
    // Workers that sleep after each job wake one by one through the
    // scheduler, much later than the caller finishes index 0.
    if (spin == 0) EXPECT_GT(by_caller.load(), 0);
  }
}

// Indices that wait for one another (a barrier inside a job, as the decode
// adapter path uses) all run: the caller takes no other index before its own
// has returned.
TEST(ThreadPool, IndicesWaitingForEachOtherComplete) {
  ThreadPool pool(ThreadPoolOptions{.n_threads = 4, .spin_iterations = 0});
  for (int job = 0; job < 200; ++job) {
    std::atomic<int> arrived{0};
    std::atomic<int> after{0};
    pool.run([&](int, int nt) {
      arrived.fetch_add(1);
      while (arrived.load() < nt) std::this_thread::yield();
      after.fetch_add(1);
    });
    ASSERT_EQ(after.load(), 4);
  }
}

TEST(ThreadPool, SpinCountChangesBetweenJobsAndJobsStillRun) {
  ThreadPool pool(ThreadPoolOptions{.n_threads = 3, .spin_iterations = 5000});
  EXPECT_EQ(pool.default_spin_iterations(), 5000);
  for (int spin : {0, 1, 1000, 5000}) {
    pool.set_spin_iterations(spin);
    for (int job = 0; job < 300; ++job) {
      std::atomic<int> ran{0};
      pool.run([&](int, int) { ran.fetch_add(1); });
      ASSERT_EQ(ran.load(), 3) << "spin " << spin << " job " << job;
    }
  }
  EXPECT_EQ(pool.default_spin_iterations(), 5000);
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

// Pieces are claimed one at a time: every index once, pieces of exactly
// `grain` (the last may be shorter) starting on multiples of it, and a thread
// held up on its first piece leaves the rest of the range to the others.
TEST(ThreadPool, ParallelForDynamicCoversRangeOnceAndBalances) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(ThreadPoolOptions{.n_threads = threads});
    for (int64_t n : {1, 7, 16, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for_dynamic(n, 16, [&](int64_t b, int64_t e, int) {
        EXPECT_EQ(b % 16, 0);
        EXPECT_TRUE(e - b == 16 || e == n) << b << ".." << e;
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
  ThreadPool pool(ThreadPoolOptions{.n_threads = 2});
  std::vector<std::atomic<int>> pieces(2);
  std::atomic<int> done{0};
  std::atomic<bool> slow_taken{false};
  pool.parallel_for_dynamic(64, 1, [&](int64_t, int64_t, int t) {
    pieces[t].fetch_add(1);
    if (!slow_taken.exchange(true)) {
      // Held until the other thread has done all the rest (a static split
      // would leave it 32 pieces; give up after 5 s).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (done.load() < 63 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    done.fetch_add(1);
  });
  EXPECT_EQ(pieces[0].load() + pieces[1].load(), 64);
  EXPECT_EQ(std::min(pieces[0].load(), pieces[1].load()), 1);
}

// Guided pieces: every index once, pieces of whole grains starting on
// multiples of the grain, long runs first (a quarter of the range for two
// threads), and a thread held up on its first piece leaves the rest to the
// other.
TEST(ThreadPool, ParallelForGuidedCoversRangeOnceInShrinkingRunsAndBalances) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(ThreadPoolOptions{.n_threads = threads});
    for (int64_t n : {1, 7, 16, 100, 1001, 4096}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex mu;
      int64_t longest = 0;
      pool.parallel_for_guided(n, 16, [&](int64_t b, int64_t e, int) {
        EXPECT_EQ(b % 16, 0);
        EXPECT_TRUE((e - b) % 16 == 0 || e == n) << b << ".." << e;
        {
          std::lock_guard lock(mu);
          longest = std::max(longest, e - b);
        }
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "threads=" << threads << " n=" << n;
      if (threads == 2 && n == 4096) EXPECT_EQ(longest, 1024) << "the first claim takes a quarter";
    }
  }
  ThreadPool pool(ThreadPoolOptions{.n_threads = 2});
  std::vector<std::atomic<int64_t>> done_by(2), pieces(2);
  std::atomic<bool> slow_taken{false};
  std::atomic<int64_t> done{0};
  pool.parallel_for_guided(1024, 1, [&](int64_t b, int64_t e, int t) {
    if (!slow_taken.exchange(true)) {
      // Held until the other thread has done all the rest (give up after 5 s).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (done.load() < 1024 - (e - b) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    done_by[t].fetch_add(e - b);
    pieces[t].fetch_add(1);
    done.fetch_add(e - b);
  });
  EXPECT_EQ(done_by[0].load() + done_by[1].load(), 1024);
  EXPECT_EQ(std::min(pieces[0].load(), pieces[1].load()), 1) << "the held thread did its first piece only";
  EXPECT_LE(std::min(done_by[0].load(), done_by[1].load()), 256);
}

}  // namespace
}  // namespace ebb
