// Offload before admission (LOCAL §6.2): the cache manager's side. Before
// the scheduler admits a training or cache-maintenance background task
// whose projected memory m̂ does not fit the headroom above the foreground
// reserve (m̂ + M_reserve > M_free), it asks for the bytes it is short
// (SchedulerOptions::offload, offload_kinds). CacheOffloader answers by
// offloading the lowest-priority KV first, tier by tier, until that many
// bytes are back:
//
//   1. spare KV chunk buffers the pool keeps for the next sessions
//      (nothing is lost: they hold no KV);
//   2. prefix-cache chunks only the cache holds, in ascending keep priority
//      Π_keep (LOCAL §5.4: cold, cheap-to-recompute, large first). Chunks
//      that a live session shares are never dropped;
//   3. optionally (evict), Engine::evict: adapter versions no session binds,
//      then KV chunks to the compressed stack and the swap file (with the
//      hybrid-swap policy's share of weight layers), restored by the next
//      request. Off by default: it moves the foreground's own KV.
//
// The scheduler admits the task only when M_free then suffices; otherwise
// the task stays pending with the reason "memory" (SchedulerMetrics::
// bg_pending_memory, ebb_background_pending{reason="memory"} in /metrics).
//
// Thread model: offload() runs on the scheduler thread (it uses the
// engine); stats() is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace ebb {

class Engine;

struct OffloadOptions {
  bool release_spare = true;  // tier 1
  bool prefix_cache = true;   // tier 2
  bool evict = false;         // tier 3 (Engine::evict; needs elastic memory)
};

struct OffloadStats {
  int64_t requests = 0;      // offload() calls
  int64_t short_of = 0;      // calls that freed less than asked
  uint64_t requested = 0;    // bytes asked for, in all
  uint64_t freed_spare = 0, freed_prefix = 0, freed_evict = 0;  // bytes each tier gave back
  int64_t prefix_chunks_dropped = 0;
};

class CacheOffloader {
 public:
  explicit CacheOffloader(Engine& engine, OffloadOptions opts = {});
  CacheOffloader(const CacheOffloader&) = delete;
  CacheOffloader& operator=(const CacheOffloader&) = delete;

  // Gives back at least `bytes` if the tiers can; returns the bytes freed.
  // Scheduler thread (between steps).
  uint64_t offload(uint64_t bytes);
  // offload() as SchedulerOptions::offload; this object must outlive the
  // scheduler's use of it.
  std::function<uint64_t(uint64_t)> hook() {
    return [this](uint64_t b) { return offload(b); };
  }
  OffloadStats stats() const;

 private:
  Engine& engine_;
  OffloadOptions opts_;
  mutable std::mutex mu_;
  OffloadStats stats_;
};

}  // namespace ebb
