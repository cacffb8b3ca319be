// Handoffs and cross-agent pre-prefill (LOCAL §6.1). A handoff is one
// agent passing a shared context (a planner's plan, a tool agent's
// observation) to one or more target agents. Until a target's request
// arrives the handoff is pending for it, and its future prompt's prefix
//   target system prompt ++ shared context
// is known: the runtime prefills it ahead, under the target's KV identity
// (the prefix cache's CacheKey: its namespace, its adapters at their
// versions, the KV geometry), so the target's request finds it cached.
//
//   post(h)  ─► plan (scheduler thread, between steps), per target:
//                  key   = the target's CacheKey (adapters resolved now:
//                          a follow-published binding pins the published
//                          version)
//                  Δ_c   = tokens of the prefix (whole KV chunks, at most
//                          max_prefix_tokens) not yet covered under key
//                  s_c   = targets of the handoff still pending
//                  D_ma(c) = ρ_c (1 + β_s log(1 + s_c)) · min(Δ_c, M_max)/M_max
//               ─► one background task (kind "preprefill", utility D_ma:
//                  higher first among admissible tasks of equal priority)
//                  per target with Δ_c > 0; each step runs a bounded chunk
//                  (whole micro-batches from position 0, as a recompute
//                  runs them, so the KV is bit for bit a request's) and
//                  publishes the full KV chunks as coverage in the prefix
//                  cache under key. Nothing runs outside the scheduler.
//
// A step's chunk shrinks under memory pressure: at most the KV that fits
// the headroom above the foreground reserve (Scheduler::memory_headroom),
// at least one micro-batch.
//
// Staleness: the key holds the adapter versions, so a commit or publish of
// a target's adapter before its request came leaves the coverage under the
// old version, which lookups under the new one never return.
// on_published(name, v) counts such targets as stale, cancels their
// unfinished tasks and plans them again under v. A foreground request that
// arrives first prefills as usual (it records its chunks in the cache); the
// task then finds nothing missing and ends.
//
// on_staged(name, v): a version committed and staged ahead of its publish
// has the pending targets that follow it pre-prefilled under it as well
// (LOCAL's stale-coverage prefill, for the prompts known to come), so the
// publish finds their prefixes warm instead of making them stale.
//
// consume(id, agent): the target's request came; the handoff is no longer
// pending for it (fewer consumers for the plans after). Pending handoffs
// are bounded (max_pending): the oldest is forgotten first.
//
// Thread model: post, consume, on_published and stats are thread-safe;
// plan_now and the tasks run on the scheduler thread.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "memory/prefix_cache.h"
#include "runtime/adapters.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"

namespace ebb {

struct HandoffTarget {
  std::string agent;                     // its name: consume() and statistics
  std::string ns;                        // its context namespace
  std::vector<AdapterBinding> adapters;  // its adapter binding (version 0: the published one)
  std::vector<TokenId> system_prompt;    // its prompt before the shared context
  // Bindings the target's requests take once these adapters are first
  // published (a learning agent whose first version has not passed its gate
  // runs on the base model until then): on_published(name) moves the
  // binding into `adapters` and plans the target again, as a stale one.
  std::vector<AdapterBinding> on_first_publish;
};

struct Handoff {
  std::string source;                  // the agent handing off
  std::vector<HandoffTarget> targets;  // at least one
  std::vector<TokenId> shared_context; // the context every target's prompt continues with
  double rho = 2.0;                    // ρ_c: the shared context's priority (> 0)
};

struct PrePrefillOptions {
  bool enabled = true;
  // The KV geometry of the targets' requests (their sessions' chunk size,
  // KV type and accumulator), the key parts beside namespace and adapters.
  // kv_chunk_size 0: the engine's kv_chunk_size.
  int64_t kv_chunk_size = 0;
  DType kv_type = DType::kF16;
  bool f16_accumulator = false;
  double beta_s = 0.5;              // β_s: weight of the pending consumers
  int64_t m_max = 8192;             // M_max: cap of the missing-token term
  int64_t chunk_tokens = 128;       // tokens per scheduler step without pressure (>= 1 micro-batch)
  // A step also ends before a micro-batch that would take it past about
  // this many seconds (the last micro-batch's time predicts the next's), so
  // a request arriving mid-step waits about this long on any device; at
  // least one micro-batch runs (0: chunk_tokens alone sizes a step).
  double step_seconds = 0;
  int64_t max_prefix_tokens = 8192; // longer prefixes are pre-prefilled up to this (whole KV chunks)
  size_t max_pending = 256;         // pending handoffs kept at most (oldest forgotten)
  // Of the background tasks: above training's and stale prefill's (0), so
  // the prefix of a request known to come within seconds (under the
  // published version, or a staged one about to be) is ready before the
  // engine's idle time goes to them; the foreground still goes first, and
  // training keeps its share of the foreground's time.
  int priority = 1;
  // Bytes background work may take now (above the foreground reserve).
  // Default: the scheduler's memory_headroom().
  std::function<uint64_t()> headroom;
};

// D_ma(c) = ρ_c (1 + β_s log(1 + s_c)) · min(Δ_c, M_max) / M_max.
double preprefill_priority(double rho, int64_t pending_consumers, int64_t missing_tokens, double beta_s,
                           int64_t m_max);

struct PrePrefillStats {
  int64_t handoffs = 0;             // posted
  int64_t targets_planned = 0;      // targets with something missing when planned
  int64_t tasks_submitted = 0, tasks_completed = 0, tasks_cancelled = 0, tasks_failed = 0;
  int64_t tasks_running = 0;        // submitted and not ended
  int64_t nothing_missing = 0;      // targets (or started tasks) already covered: a request made it first
  int64_t tokens_prefilled = 0;     // tokens run by the tasks
  int64_t chunks_inserted = 0;      // KV chunks the tasks published in the prefix cache
  int64_t steps = 0;
  int64_t shrunk_steps = 0;         // steps whose chunk memory pressure made smaller than chunk_tokens
  int64_t timed_steps = 0;          // steps that step_seconds ended before their chunk
  int64_t min_chunk_tokens = 0;     // the smallest chunk a step ran (0: none ran)
  double busy_s = 0;                // seconds in the tasks' steps
  int64_t consumed = 0;             // targets whose request came
  int64_t stale = 0;                // targets whose adapter moved to another version before their request
  int64_t staged_planned = 0;       // tasks under a staged version (on_staged)
  int64_t staged_promoted = 0;      // of those, kept when their version was published
};

class PrePrefill {
 public:
  // engine and sched must outlive the tasks this submits.
  PrePrefill(Engine& engine, Scheduler& sched, PrePrefillOptions opts = {});
  // Cancels the tasks that have not ended.
  ~PrePrefill();
  PrePrefill(const PrePrefill&) = delete;
  PrePrefill& operator=(const PrePrefill&) = delete;

  // Records a pending handoff and plans its tasks at the scheduler's next
  // step boundary. Returns the handoff's id; `planned` (optional) receives
  // the number of tasks submitted (do not wait for it on the scheduler
  // thread). Throws ebb::Error for a handoff without targets or ρ <= 0.
  uint64_t post(Handoff h, std::future<size_t>* planned = nullptr);
  // The same, planned now: only on the scheduler thread.
  uint64_t post_now(Handoff h, size_t* planned = nullptr);
  // The target's request came: the handoff is no longer pending for it.
  void consume(uint64_t handoff, const std::string& agent);
  // Version `version` of adapter `name` was committed and published: the
  // pending targets that follow it were pre-prefilled under another
  // version (stale), and those that take it at its first publish
  // (HandoffTarget::on_first_publish) under none; their tasks are cancelled
  // and planned again under it at the next step boundary.
  void on_published(const std::string& name, uint64_t version);
  // Version `version` of adapter `name` was committed and staged, not yet
  // published: the pending targets that follow `name` (or take it at its
  // first publish) are pre-prefilled
  // under it too, beside their task under the published version, so a
  // request after the publish finds its prefix (stale-coverage prefill for
  // the prompts known to come); on_published(name, version) then keeps
  // that task instead of planning again. A later staged version replaces
  // an earlier one's tasks. Returns (at the next step boundary) the number
  // of tasks submitted.
  std::future<size_t> on_staged(const std::string& name, uint64_t version);
  // The same, now: only on the scheduler thread.
  size_t on_staged_now(const std::string& name, uint64_t version);

  PrePrefillStats stats() const;
  // Handoff ids and agents of the tasks that ended, in the order they
  // ended (the latest 256).
  std::vector<std::pair<uint64_t, std::string>> ended() const;
  // The D_ma a pending target's task was planned with (0: none planned).
  double planned_priority(uint64_t handoff, const std::string& agent) const;
  const PrePrefillOptions& options() const { return opts_; }

 private:
  struct Shared;
  struct Job;
  PrePrefillOptions opts_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace ebb
