// Budget mode planning (DESIGN.md "Budget mode", FlexInfer §3.3-3.4): given a
// byte budget for all of the LLM's memory, choose which weight tensors stay
// resident in every layer and which are streamed through a prefetch window.
//
// What the budget must hold:
//   fixed    KV for the session context + forward scratch + logits + all 1-D
//            tensors (norms, biases, as F32) + the embedding-row buffer
//   window   k slots, each as large as the largest streamed step (a layer's
//            streamed tensors, or one row range of a streamed output head)
//   resident the preserved tensors (and the head when it fits)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/weights.h"

namespace ebb {

struct ModelConfig;

enum class BudgetSystem : uint8_t {
  kEbb,         // Algorithm 1 (FFN first when it fits with half the attention), balanced
  kAttnFirst,   // attention tensors first, then FFN (paper Figure 5)
  kFfnFirst,    // FFN tensors first, then attention (paper Figure 5)
  kUnbalanced,  // whole layers locked in layer order
  kSync,        // ebb's plan, direct reads without prefetch
  kPrefetch,    // nothing locked: every 2-D tensor streamed
  kMmap,        // baseline: the page cache over an mmap of the file (no plan)
};
std::string_view budget_system_name(BudgetSystem s);
std::optional<BudgetSystem> parse_budget_system(std::string_view name);

// "600MiB", "1.5GiB", "2G" (binary units), "900MB" (decimal), "40%" (of
// model_bytes), "123456" (bytes). Throws Error naming the text.
uint64_t parse_size(std::string_view text, uint64_t model_bytes);

struct BudgetOptions {
  uint64_t budget = 0;  // bytes of LLM memory; 0: budget mode off
  BudgetSystem system = BudgetSystem::kEbb;
  int window = 3;       // prefetch window k, in steps (layers or head parts)
  int64_t n_ctx = 0;    // context the KV reserve covers; 0: min(training context, 4096)
  // true: a plan holds the KV in use plus a margin and follows it between
  // passes (KvReplan), so a short chat keeps more weights resident; false:
  // KV for n_ctx tokens is reserved up front.
  bool kv_on_demand = true;
  int kv_elem_bytes = 2;  // 2: F16 KV, 4: F32 KV
};

// Memory the planner must leave for everything but weights (the runtime
// measures these: KV bytes for the context, Forward::scratch_bytes(), logits).
struct BudgetOverheads {
  uint64_t kv = 0;
  uint64_t scratch = 0;
  int64_t max_batch = 64;  // tokens per pass: sizes the embedding-row buffer
};

struct LayerPlan {
  std::vector<bool> preserved;  // [slot of the layer unit]; 1-D slots are always preserved
  uint64_t resident_bytes = 0;  // preserved tensors, compact (64-byte aligned)
  uint64_t streamed_bytes = 0;  // file bytes read per pass
  uint64_t window_bytes = 0;    // 4 KiB-aligned spans of the streamed tensors in a window slot
};

struct BudgetPlan {
  BudgetSystem system = BudgetSystem::kEbb;
  uint64_t budget = 0;
  int window = 3;        // slots in the prefetch window
  bool prefetch = true;  // false for kSync: a step is read when acquired
  uint64_t kv = 0, scratch = 0;
  uint64_t small_bytes = 0;     // 1-D tensors of all layers + output norm, as F32
  uint64_t embd_row_bytes = 0;  // buffer for the embedding rows of one pass (0 when resident)
  std::vector<LayerPlan> layers;
  bool head_preserved = false;
  bool embd_preserved = false;  // embedding rows served from memory (tied: from the preserved head)
  uint64_t head_bytes = 0;      // output head file bytes
  uint64_t embd_bytes = 0;      // untied token embedding file bytes (0 when tied)
  int64_t head_rows_per_part = 0;  // when streamed: rows per window step
  int head_parts = 0;
  uint64_t slot_bytes = 0;      // bytes of one window slot (0: nothing streamed)

  uint64_t resident_weight_bytes() const;  // preserved tensors + preserved globals
  uint64_t window_bytes() const { return slot_bytes * static_cast<uint64_t>(window); }
  uint64_t streamed_per_token() const;     // bytes read per decode pass (excludes embedding rows)
  uint64_t total() const;                  // everything the plan holds
  uint64_t headroom() const { return budget - total(); }
  int steps_per_pass() const { return static_cast<int>(layers.size()) + head_parts; }
};

// Chooses the plan. Throws Error naming the numbers when the budget is below
// the minimum (fixed + a window of fully streamed layers).
BudgetPlan plan_budget(const WeightLayout& layout, const ModelConfig& config, const BudgetOptions& opts,
                       const BudgetOverheads& overheads);

// A human description: one line per group of layers with the same set, then
// totals (what `ebb inspect --memory-budget` prints).
std::string describe_plan(const BudgetPlan& plan, const WeightLayout& layout);

// 4 KiB-aligned span covering [offset, offset + bytes) of the file.
uint64_t direct_span(uint64_t offset, uint64_t bytes);

}  // namespace ebb
