#include "platform/thread_pool.h"

#include <sched.h>

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

namespace {

// One poll of a spin-wait. Every kYieldEvery polls the thread also offers
// its core to the scheduler: when the pool has more threads than free cores
// (other processes, the restore threads, -t above the core count), the
// thread the spinner waits for may be queued on this very core, and a spin
// that never yields keeps it off until the time slice ends (milliseconds,
// against jobs of microseconds). With the core idle otherwise, sched_yield
// returns at once (about 0.3 us, one poll in 64).
constexpr int kYieldEvery = 64;
inline void spin_poll(int i) {
  if (i % kYieldEvery == kYieldEvery - 1) {
    ::sched_yield();
  } else {
    EBB_CPU_RELAX();
  }
}

}  // namespace

ThreadPool::ThreadPool(ThreadPoolOptions opts)
    : n_threads_(opts.n_threads > 0 ? opts.n_threads
                                     : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      default_spin_(opts.spin_iterations),
      spin_iterations_(opts.spin_iterations),
      claimed_(static_cast<size_t>(n_threads_)) {
  workers_.reserve(n_threads_ - 1);
  // Workers start from the generation seen here, not from whatever it is
  // when their thread first runs: a job posted before a worker starts must
  // still be picked up by it.
  const uint32_t start = generation_.load(std::memory_order_relaxed);
  for (auto& c : claimed_) c.gen.store(start, std::memory_order_relaxed);
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

// Index i of job `gen` is claimed by moving its tag from gen - 1 to gen:
// each job's every index is claimed exactly once, so while job gen runs the
// tag is gen - 1 (open) or gen (taken), and a worker still holding an older
// generation finds neither and runs nothing.
bool ThreadPool::claim(int index, uint32_t gen) {
  std::atomic<uint32_t>& c = claimed_[static_cast<size_t>(index)].gen;
  uint32_t open = gen - 1;
  return c.load(std::memory_order_relaxed) == open &&
         c.compare_exchange_strong(open, gen, std::memory_order_acq_rel, std::memory_order_relaxed);
}

void ThreadPool::finish_one() {
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  const uint32_t gen = generation_.fetch_add(1, std::memory_order_acq_rel) + 1;
  generation_.notify_all();
  fn(0, n_threads_);
  // Indices whose worker has not started them yet (asleep, or not given a
  // core) are run here rather than waited for.
  if (pending_.load(std::memory_order_acquire) != 0)
    for (int i = 1; i < n_threads_; ++i)
      if (claim(i, gen)) {
        fn(i, n_threads_);
        finish_one();
      }
  // Wait for the workers: spin (yielding now and then), then sleep on pending_.
  int spins = 0;
  for (;;) {
    const int p = pending_.load(std::memory_order_acquire);
    if (p == 0) break;
    if (spins < spin_iterations_.load(std::memory_order_relaxed)) {
      spin_poll(spins++);
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
      if (spins < spin_iterations_.load(std::memory_order_relaxed)) {
        spin_poll(spins++);
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    // The caller may have run this index already; then the job may be over
    // and job_ another job's, so it is only read after a claim.
    if (claim(index, g)) {
      (*job_)(index, n_threads_);
      finish_one();
    }
  }
}

}  // namespace ebb
