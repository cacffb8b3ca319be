// A fork-join pool for the compute kernels. The calling thread is worker 0,
// so a pool of N runs N threads in total. Workers spin briefly after each job
// (decode issues a job every few microseconds), offering their core to the
// scheduler now and then, and then sleep on an atomic wait, so an idle
// engine costs no CPU. A job's share that its worker has not started when
// the caller is done with its own is run by the caller, so a worker without
// a core (more threads than free cores) does not hold the job up for a time
// slice. run() allocates nothing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ebb {

// A non-owning callable reference (no allocation, unlike std::function).
template <class Sig>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>)
  FunctionRef(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

struct ThreadPoolOptions {
  int n_threads = 0;              // 0: hardware concurrency
  int spin_iterations = 20000;    // busy-wait polls before sleeping
  std::string name = "ebb-pool";  // worker i (from 1) is named "<name>-<i>"
};

class ThreadPool {
 public:
  explicit ThreadPool(ThreadPoolOptions opts = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Busy-wait polls before a thread sleeps (at a join, or between jobs).
  // Long spins suit decode, where jobs come every few microseconds and the
  // pool has the cores to itself; while other threads of the process need the
  // cores too (a restore reading and decompressing beside the prefill), a
  // thread spinning at a join only delays them. Takes effect at the next poll.
  void set_spin_iterations(int n) { spin_iterations_.store(n, std::memory_order_relaxed); }
  int spin_iterations() const { return spin_iterations_.load(std::memory_order_relaxed); }
  int default_spin_iterations() const { return default_spin_; }

  // Calls fn(index, n_threads) once for every index in [0, n_threads) and
  // returns when all have finished: index 0 on the calling thread, index i
  // on worker i, or on the calling thread when worker i has not started it by
  // the time the caller finished its own. So fn must not expect an index
  // on a particular thread; indices that wait for one another still all run
  // (the caller takes others' only after its own returned). Not reentrant.
  void run(FunctionRef<void(int, int)> fn);

  // Splits [0, n) into n_threads contiguous ranges aligned to `grain` and
  // calls fn(begin, end, thread_index) for each non-empty one.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n <= grain) {
      fn(int64_t{0}, n, 0);
      return;
    }
    run([&](int t, int nt) {
      const int64_t blocks = (n + grain - 1) / grain;
      const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
      const int64_t begin = b0 * grain, end = std::min(n, b1 * grain);
      if (begin < end) fn(begin, end, t);
    });
  }

  // Splits [0, n) into pieces of `grain` (the last may be shorter) that the
  // threads claim one at a time, and calls fn(begin, end, thread_index) for
  // each. A thread slowed down (another process on its core, a slower core)
  // takes fewer pieces instead of holding the others at the join.
  template <class F>
  void parallel_for_dynamic(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n <= grain) {
      fn(int64_t{0}, n, 0);
      return;
    }
    alignas(64) std::atomic<int64_t> next{0};
    run([&](int t, int) {
      for (int64_t b; (b = next.fetch_add(grain, std::memory_order_relaxed)) < n;) fn(b, std::min(n, b + grain), t);
    });
  }

  // parallel_for_dynamic with pieces that shrink as the range runs out: a
  // claim takes 1/(2 n_threads) of what is left (in whole grains, at least
  // one), so each thread first walks long contiguous runs and the end is
  // still balanced grain by grain. For loops that stream memory: a thread's
  // hardware and software prefetch follow its run, where pieces of one grain
  // interleaved between threads break every stream at each piece (a batch
  // product at 4 tokens: 5.5 ms -> 3.9 ms for 151 MB on 2 threads).
  template <class F>
  void parallel_for_guided(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n <= grain) {
      fn(int64_t{0}, n, 0);
      return;
    }
    alignas(64) std::atomic<int64_t> next{0};
    const int64_t share = 2 * static_cast<int64_t>(n_threads_);
    run([&](int t, int) {
      int64_t b = next.load(std::memory_order_relaxed);
      while (b < n) {
        const int64_t size = std::max<int64_t>(grain, (n - b) / share / grain * grain);
        if (next.compare_exchange_weak(b, b + size, std::memory_order_relaxed)) {
          fn(b, std::min(n, b + size), t);
          b = next.load(std::memory_order_relaxed);
        }
      }
    });
  }

 private:
  void worker_loop(int index, uint32_t seen);
  bool claim(int index, uint32_t gen);  // takes index of job gen; false when taken
  void finish_one();                    // an index of the running job is done

  int n_threads_;
  int default_spin_;
  std::atomic<int> spin_iterations_;
  std::vector<std::thread> workers_;
  const FunctionRef<void(int, int)>* job_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<bool> stop_{false};
  // [n_threads] the generation of the last job whose index i was taken, one
  // cache line each: a worker's claim of its own index touches no line the
  // others write.
  struct alignas(64) Claim {
    std::atomic<uint32_t> gen{0};
  };
  std::vector<Claim> claimed_;
};

}  // namespace ebb
