// A machine memory-bandwidth probe: how fast the CPU threads can stream-read
// a buffer much larger than the caches. It is the bound a memory-bound decode
// step is measured against (decode reads every weight once per token).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "platform/thread_pool.h"

namespace ebb {

struct ReadBandwidth {
  double median_gbps = 0;          // median over reps, GB/s (1e9 bytes/s)
  std::vector<double> reps_gbps;   // each timed rep
  size_t bytes = 0;                // buffer size actually read per rep
  int threads = 0;
};

// Reads a `bytes` buffer `reps` times (after one untimed warm-up pass) with
// every thread of the pool, each thread summing its own contiguous slice
// (plain C++ the compiler vectorises; no intrinsics), and returns the median
// rate. The buffer is a plain aligned allocation (std::aligned_alloc), not
// the engine's Allocator/Ledger: it is probe memory, not LLM memory, and it is
// freed before returning. Pages are first touched by the thread that later
// reads them. Throws ebb::Error when bytes < 4 KiB, reps < 1, or the
// allocation fails.
ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{256} << 20, int reps = 5);

// The median GB/s of measure_read_bandwidth().
double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes = size_t{256} << 20, int reps = 5);

// Size of the largest CPU cache level in bytes (Linux sysfs, cpu0), or 0 when
// unknown. A model smaller than this is decoded from cache, not DRAM.
uint64_t last_level_cache_bytes();

}  // namespace ebb
