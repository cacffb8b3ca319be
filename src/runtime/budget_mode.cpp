#include "runtime/budget_mode.h"

#include <algorithm>

namespace ebb {

BudgetOverheads budget_overheads(const Model& model, const Forward& forward, const BudgetOptions& opts,
                                 int64_t kv_chunk_size) {
  const ModelConfig& c = model.config();
  const int64_t n_ctx = opts.n_ctx > 0 ? opts.n_ctx : std::min<int64_t>(c.n_ctx_train, 4096);
  const int64_t chunk = std::max<int64_t>(kv_chunk_size, 1);
  const uint64_t chunks = static_cast<uint64_t>((n_ctx + chunk - 1) / chunk);
  // K+V of one chunk, in whole pages as KvCache allocates them.
  const uint64_t raw = 2ull * static_cast<uint64_t>(c.kv_dim()) * static_cast<uint64_t>(opts.kv_elem_bytes) *
                       static_cast<uint64_t>(chunk);
  const uint64_t chunk_bytes = (raw + 4095) & ~uint64_t{4095};
  BudgetOverheads o;
  o.kv = static_cast<uint64_t>(c.n_layer) * chunks * chunk_bytes;
  o.scratch = forward.scratch_bytes() + static_cast<uint64_t>(c.n_vocab) * sizeof(float);
  o.max_batch = forward.max_batch();
  return o;
}

BudgetPlan plan_for(const Model& model, const Forward& forward, const BudgetOptions& opts, int64_t kv_chunk_size) {
  return plan_budget(model.layout(), model.config(), opts, budget_overheads(model, forward, opts, kv_chunk_size));
}

std::unique_ptr<WeightSource> make_budget_source(const Model& model, const Forward& forward, Allocator& alloc,
                                                 const BudgetOptions& opts, int64_t kv_chunk_size) {
  if (opts.system == BudgetSystem::kMmap) return std::make_unique<MmapWeights>(model, alloc);
  return std::make_unique<WeightStreamer>(model, plan_for(model, forward, opts, kv_chunk_size), alloc);
}

}  // namespace ebb
