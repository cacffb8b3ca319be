// The parts shared by the background tasks that prefill a prefix under a key
// planned in advance (cross-agent pre-prefill, runtime/handoff.h;
// stale-coverage prefill, runtime/stale_prefill.h): the session a task runs,
// and how its end is counted.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/adapters.h"
#include "memory/prefix_cache.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"

namespace ebb {

// A session that prefills `tokens` [n] under `key` with `bindings` (their
// versions pinned), appended and not yet run. It records its KV itself: it
// makes no prefix-cache lookups of its own, so heat and hit counts stay as
// requests made them. Throws naming `what` when the session's key is not `key`
// (the plan and the engine disagree on the geometry or the adapters).
std::unique_ptr<Session> open_warm_session(Engine& engine, const CacheKey& key, std::span<const TokenId> tokens,
                                           const std::vector<AdapterBinding>& bindings, std::string_view what);

// One background step of a warm session: whole micro-batches of `mb`
// tokens until `max_tokens` ran (at least one micro-batch), the session has
// nothing pending, or the next micro-batch, predicted to take as long as
// the last, would end past `step_seconds` after `t0` (0: no time limit).
struct WarmStep {
  int64_t tokens = 0;   // run
  bool timed = false;   // ended by step_seconds before max_tokens
};
WarmStep run_warm_step(Session& session, int64_t mb, int64_t max_tokens, double step_seconds, double t0);

// Counts a task's end in stats with the fields tasks_{completed,cancelled,
// failed,running}: a task that ended because its target went away (`gone`:
// consumed, stale or unloaded) counts as cancelled.
template <class Stats>
void count_task_end(Stats& s, TaskOutcome outcome, bool gone) {
  if (outcome == TaskOutcome::kFailed) {
    ++s.tasks_failed;
  } else if (outcome == TaskOutcome::kCancelled || gone) {
    ++s.tasks_cancelled;
  } else {
    ++s.tasks_completed;
  }
  --s.tasks_running;
}

}  // namespace ebb
