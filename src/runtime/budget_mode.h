// Budget mode wiring (DESIGN.md "Budget mode"): measures what the runtime
// needs besides weights (KV for the context, forward scratch, logits), plans
// the weights into what is left and builds the WeightSource that serves them.
#pragma once

#include <memory>

#include "memory/budget_plan.h"
#include "memory/mmap_weights.h"
#include "memory/weight_streamer.h"
#include "model/model.h"
#include "runtime/forward.h"

namespace ebb {

// KV for opts.n_ctx tokens (F16, whole chunks of kv_chunk_size), the forward
// pass's scratch and one session's logits.
BudgetOverheads budget_overheads(const Model& model, const Forward& forward, const BudgetOptions& opts,
                                 int64_t kv_chunk_size);

// The plan for an engine's model under opts (throws Error when impossible).
BudgetPlan plan_for(const Model& model, const Forward& forward, const BudgetOptions& opts, int64_t kv_chunk_size);

// The source for opts.system: an MmapWeights for kMmap, else a WeightStreamer
// over plan_for(...).
std::unique_ptr<WeightSource> make_budget_source(const Model& model, const Forward& forward, Allocator& alloc,
                                                 const BudgetOptions& opts, int64_t kv_chunk_size);

}  // namespace ebb
