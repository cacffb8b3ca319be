#include "runtime/offload_admission.h"

#include "memory/elastic.h"
#include "memory/prefix_cache.h"
#include "runtime/engine.h"

namespace ebb {

CacheOffloader::CacheOffloader(Engine& engine, OffloadOptions opts) : engine_(engine), opts_(opts) {}

uint64_t CacheOffloader::offload(uint64_t bytes) {
  uint64_t spare = 0, prefix = 0, evicted = 0;
  int64_t dropped = 0;
  const auto freed = [&] { return spare + prefix + evicted; };
  if (opts_.release_spare && bytes > 0) {
    const uint64_t before = engine_.kv_pool().spare_bytes();
    engine_.kv_pool().release_spare();
    const uint64_t after = engine_.kv_pool().spare_bytes();
    spare = before > after ? before - after : 0;
  }
  PrefixCache* pc = engine_.prefix_cache();
  if (opts_.prefix_cache && pc && freed() < bytes) {
    const uint64_t want = bytes - freed();
    const uint64_t held = pc->private_bytes();
    const int64_t d0 = pc->stats().dropped_chunks;
    prefix = pc->trim(held > want ? held - want : 0);
    dropped = pc->stats().dropped_chunks - d0;
    // The dropped chunks' buffers may stay as spare: give them back too.
    if (opts_.release_spare) engine_.kv_pool().release_spare();
  }
  if (opts_.evict && engine_.elastic() && freed() < bytes) {
    const EvictReport r = engine_.evict(bytes - freed());
    evicted = r.freed;
  }
  std::lock_guard lock(mu_);
  ++stats_.requests;
  stats_.requested += bytes;
  stats_.freed_spare += spare;
  stats_.freed_prefix += prefix;
  stats_.freed_evict += evicted;
  stats_.prefix_chunks_dropped += dropped;
  if (freed() < bytes) ++stats_.short_of;
  return freed();
}

OffloadStats CacheOffloader::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace ebb
