// `ebb bench budget`: decode and prefill throughput of budget mode and its
// baselines at several budgets, beside the I/O roofline (storage bandwidth /
// bytes streamed per token), like FlexInfer's Figure 4.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/budget_plan.h"

namespace ebb {

struct BenchBudgetOptions {
  std::string model;
  int n_threads = 2;
  int64_t prompt_tokens = 64;
  int64_t gen_tokens = 32;
  int reps = 3;
  int window = 3;
  bool drop_caches = false;  // echo 3 > /proc/sys/vm/drop_caches before each run (root)
  uint64_t seed = 1;
};

struct BenchBudgetRow {
  std::string system;
  uint64_t budget_bytes = 0;   // 0: fully resident reference
  double decode_tok_s = 0;     // medians over reps
  double prefill_tok_s = 0;
  double roofline_tok_s = 0;   // storage bandwidth / streamed bytes per token (0: nothing streamed)
  uint64_t streamed_per_token = 0;
  double io_wait_fraction = 0;  // of decode time spent waiting on reads (streamer systems)
  double storage_gbps = 0;
};

// Direct-I/O read bandwidth of the model file: 4 MiB requests, 8 in flight,
// best of three passes over the first `bytes`.
double measure_storage_gbps(const std::string& path, uint64_t bytes = 512ull << 20);

// One system at one budget (budget 0: fully resident). storage_gbps sets the roofline.
BenchBudgetRow bench_budget_one(const BenchBudgetOptions& o, BudgetSystem system, uint64_t budget,
                                double storage_gbps);

// Throughput against budget, one polyline per system, as an SVG document.
std::string budget_plot_svg(const std::vector<BenchBudgetRow>& rows, uint64_t model_bytes);

}  // namespace ebb
