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

// Bytes of one KV chunk in every layer (whole pages, as KvCache allocates).
uint64_t kv_chunk_all_layers(const Model& model, const BudgetOptions& opts, int64_t kv_chunk_size);
// The KV a plan holds beyond what is in use with opts.kv_on_demand: one
// forward batch of tokens in whole chunks, plus one chunk, in every layer.
uint64_t kv_margin(const Model& model, const Forward& forward, const BudgetOptions& opts, int64_t kv_chunk_size);

// The plan for an engine's model under opts (throws Error when impossible):
// with opts.kv_on_demand the KV of the margin (none in use yet), else KV for
// opts.n_ctx tokens.
BudgetPlan plan_for(const Model& model, const Forward& forward, const BudgetOptions& opts, int64_t kv_chunk_size);
// The plan for `kv_bytes` of KV (what a KvReplan asks for).
BudgetPlan plan_for_kv(const Model& model, const Forward& forward, const BudgetOptions& opts, uint64_t kv_bytes);

// The source for opts.system: an MmapWeights for kMmap, else a WeightStreamer
// over plan_for(...).
std::unique_ptr<WeightSource> make_budget_source(const Model& model, const Forward& forward, Allocator& alloc,
                                                 const BudgetOptions& opts, int64_t kv_chunk_size);

}  // namespace ebb
