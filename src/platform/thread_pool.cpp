#include "platform/thread_pool.h"

#include <algorithm>

#include "platform/thread_name.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define EBB_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define EBB_CPU_RELAX() asm volatile("yield")
#else
#define EBB_CPU_RELAX() ((void)0)
#endif

namespace ebb {

ThreadPool::ThreadPool(ThreadPoolOptions opts)
    : n_threads_(opts.n_threads > 0 ? opts.n_threads
                                     : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      default_spin_(opts.spin_iterations),
      spin_iterations_(opts.spin_iterations) {
  workers_.reserve(n_threads_ - 1);
  // Workers start from the generation seen here, not from whatever it is
  // when their thread first runs: a job posted before a worker starts must
  // still be picked up by it.
  const uint32_t start = generation_.load(std::memory_order_relaxed);
  for (int i = 1; i < n_threads_; ++i) {
    workers_.emplace_back([this, i, start, name = opts.name + "-" + std::to_string(i)] {
      set_current_thread_name(name);
      worker_loop(i, start);
    });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  // Wait for the workers: spin, then sleep on pending_.
  int spins = 0;
  for (;;) {
    const int p = pending_.load(std::memory_order_acquire);
    if (p == 0) break;
    if (++spins < spin_iterations_.load(std::memory_order_relaxed)) {
      EBB_CPU_RELAX();
    } else {
      pending_.wait(p, std::memory_order_acquire);
    }
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index, uint32_t seen) {
  for (;;) {
    int spins = 0;
    uint32_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < spin_iterations_.load(std::memory_order_relaxed)) {
        EBB_CPU_RELAX();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(index, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace ebb
