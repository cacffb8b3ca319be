#include "runtime/budget_mode.h"

#include <algorithm>

namespace ebb {

uint64_t kv_chunk_all_layers(const Model& model, const BudgetOptions& opts, int64_t kv_chunk_size) {
  const ModelConfig& c = model.config();
  const int64_t chunk = std::max<int64_t>(kv_chunk_size, 1);
  // K+V of one chunk, in whole pages as KvCache allocates them.
  const uint64_t raw = 2ull * static_cast<uint64_t>(c.kv_dim()) * static_cast<uint64_t>(opts.kv_elem_bytes) *
                       static_cast<uint64_t>(chunk);
  return static_cast<uint64_t>(c.n_layer) * ((raw + 4095) & ~uint64_t{4095});
}

uint64_t kv_margin(const Model& model, const Forward& forward, const BudgetOptions& opts, int64_t kv_chunk_size) {
  const int64_t chunk = std::max<int64_t>(kv_chunk_size, 1);
  const auto chunks = static_cast<uint64_t>((forward.max_batch() + chunk - 1) / chunk + 1);
  // Never more than the whole context's KV.
  return std::min(chunks * kv_chunk_all_layers(model, opts, kv_chunk_size),
                  budget_overheads(model, forward, opts, kv_chunk_size).kv);
}

BudgetOverheads budget_overheads(const Model& model, const Forward& forward, const BudgetOptions& opts,
                                 int64_t kv_chunk_size) {
  const ModelConfig& c = model.config();
  const int64_t n_ctx = opts.n_ctx > 0 ? opts.n_ctx : std::min<int64_t>(c.n_ctx_train, 4096);
  const int64_t chunk = std::max<int64_t>(kv_chunk_size, 1);
  const uint64_t chunks = static_cast<uint64_t>((n_ctx + chunk - 1) / chunk);
  BudgetOverheads o;
  o.kv = chunks * kv_chunk_all_layers(model, opts, kv_chunk_size);
  o.scratch = forward.scratch_bytes() + static_cast<uint64_t>(c.n_vocab) * sizeof(float);
  o.max_batch = forward.max_batch();
  return o;
}

BudgetPlan plan_for_kv(const Model& model, const Forward& forward, const BudgetOptions& opts, uint64_t kv_bytes) {
  BudgetOverheads o = budget_overheads(model, forward, opts, 1);
  o.kv = kv_bytes;
  return plan_budget(model.layout(), model.config(), opts, o);
}

BudgetPlan plan_for(const Model& model, const Forward& forward, const BudgetOptions& opts, int64_t kv_chunk_size) {
  if (opts.kv_on_demand) return plan_for_kv(model, forward, opts, kv_margin(model, forward, opts, kv_chunk_size));
  return plan_budget(model.layout(), model.config(), opts, budget_overheads(model, forward, opts, kv_chunk_size));
}

std::unique_ptr<WeightSource> make_budget_source(const Model& model, const Forward& forward, Allocator& alloc,
                                                 const BudgetOptions& opts, int64_t kv_chunk_size) {
  if (opts.system == BudgetSystem::kMmap) return std::make_unique<MmapWeights>(model, alloc);
  KvReplan replan;
  if (opts.kv_on_demand) {
    replan.plan = [&model, &forward, opts](uint64_t kv) { return plan_for_kv(model, forward, opts, kv); };
    replan.kv_step = kv_chunk_all_layers(model, opts, kv_chunk_size);
    replan.kv_margin = kv_margin(model, forward, opts, kv_chunk_size);
    replan.kv_cap = budget_overheads(model, forward, opts, kv_chunk_size).kv;
  }
  return std::make_unique<WeightStreamer>(model, plan_for(model, forward, opts, kv_chunk_size), alloc,
                                          StreamerOptions{}, std::move(replan));
}

}  // namespace ebb
