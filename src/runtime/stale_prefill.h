// Stale-coverage prefill (LOCAL §5.3): when a new version of an adapter is
// staged, the hottest prefixes the prefix cache holds under the version
// that serves now are prefilled again under the staged version, as
// background tasks of the scheduler (kind "prefill"), so that the first
// requests after publication find their KV already computed.
//
//   on_staged(A, v)  ─► plan (on the scheduler thread, between steps):
//                         source keys: those holding A at its published
//                         version (when that is not v); else A at any other
//                         version; else, when v is A's only version, the
//                         base model's keys (no adapter)
//                         up to max_prefixes hottest prefixes by H_KV
//                         (PrefixCache::hot_prefixes), each mapped to its
//                         target key: A at v (same scale, namespace, other
//                         adapters, KV geometry); prefixes the target key
//                         already covers are skipped
//                   ─► one background task per prefix; each step runs
//                         about chunk_tokens tokens (whole micro-batches of
//                         the engine's prefill batch, aligned as a
//                         recompute from position 0 is, so the KV is the
//                         one a request would compute, bit for bit) on a
//                         Session bound to {A@v, ...}, and inserts the full
//                         KV chunks into the prefix cache under the target key
//
// The KV is private to the staged version until it is published: requests
// on the published version look up another key and never see it. When v is
// published before the warm-up ends, the remaining tasks keep going (their
// KV is now under the key requests use; the request path prefills whatever
// is not there yet, and the scheduler still runs the tasks only when no
// foreground work waits). When v is unloaded, its tasks are cancelled
// (on_unloaded), and a task that finds its version gone ends at its next
// step without inserting anything more.
//
// Thread model: on_staged, on_unloaded and stats are thread-safe; plan()
// and the tasks run on the scheduler thread.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "memory/prefix_cache.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"

namespace ebb {

struct StalePrefillOptions {
  bool enabled = true;
  int max_prefixes = 8;             // hot prefixes warmed per staged version (LOCAL §7: 8)
  int64_t chunk_tokens = 128;       // tokens per scheduler step (whole micro-batches, at least one)
  double step_seconds = 0;          // and about this long at most (PrePrefillOptions::step_seconds; 0: off)
  int64_t max_prefix_tokens = 4096; // longer prefixes are warmed up to this many tokens (whole KV chunks)
  int priority = 0;                 // of the background tasks
};

struct StalePrefillStats {
  int64_t versions = 0;  // staged versions planned for
  int64_t tasks_submitted = 0, tasks_completed = 0, tasks_cancelled = 0, tasks_failed = 0;
  int64_t tasks_running = 0;     // submitted and not ended
  int64_t tokens_prefilled = 0;  // tokens run under staged versions
  int64_t chunks_inserted = 0;   // KV chunks added to the prefix cache by the tasks
};

class StalePrefill {
 public:
  // engine and sched must outlive the tasks this submits (the scheduler
  // ends them at its shutdown).
  StalePrefill(Engine& engine, Scheduler& sched, StalePrefillOptions opts = {});
  // Cancels the tasks that have not ended.
  ~StalePrefill();
  StalePrefill(const StalePrefill&) = delete;
  StalePrefill& operator=(const StalePrefill&) = delete;

  // After `version` of adapter `name` was staged (a server load with
  // publish false, a stage, a training commit): plans the warm-up at the
  // scheduler's next step boundary and returns at once. Callable from any
  // thread, the scheduler's included; the future carries the number of
  // tasks submitted (do not wait for it on the scheduler thread).
  std::future<size_t> on_staged(const std::string& name, uint64_t version);
  // The same, now: only on the scheduler thread (inside Scheduler::call or
  // a task's step), e.g. right after the registry staged the version.
  size_t plan(const std::string& name, uint64_t version);
  // Cancels the tasks warming `name` at `version` (0: every version).
  void on_unloaded(const std::string& name, uint64_t version = 0);

  StalePrefillStats stats() const;
  const StalePrefillOptions& options() const { return opts_; }

 private:
  struct Shared;
  struct Job;
  static size_t plan_on(const std::shared_ptr<Shared>& sh, const std::string& name, uint64_t version);
  StalePrefillOptions opts_;
  // The engine, the scheduler, the statistics and the tasks' jobs: queued
  // control work and the tasks hold it too, so it outlives this object.
  std::shared_ptr<Shared> shared_;
};

}  // namespace ebb
