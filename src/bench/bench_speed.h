// ebb bench speed: prefill and decode throughput of an engine, measured
// against the machine's memory bandwidth in the same run.
//
// What is counted as streamed per decoded token (model_bytes): every layer
// weight unit in full (WeightUnit::bytes(), which includes the small norm
// vectors and biases and the 64-byte alignment padding between tensors) plus
// the output head matrix (the token embedding when the head is tied). The
// embedding lookup (one row) and the output norm are not counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"
#include "runtime/engine.h"

namespace ebb {

struct SpeedOptions {
  int64_t prompt_tokens = 512;  // P: tokens fed to a fresh session in one feed() (prefill)
  int64_t gen_tokens = 128;     // N: tokens then fed one at a time (decode)
  int64_t reps = 5;             // timed reps, after one untimed warm-up rep
  uint64_t seed = 1;            // of the pseudo-random prompt token ids
  int64_t n_ctx = 0;            // session context; 0: P + N + 1 (must be >= that)
  int64_t kv_chunk_size = 0;    // 0: the engine's default
  DType kv_type = DType::kF16;
  size_t membw_bytes = size_t{256} << 20;  // memory-bandwidth probe buffer; 0: skip the probe
  int membw_reps = 5;
  // Adapters every rep's session binds (empty: the base model).
  std::vector<AdapterBinding> adapters;
  // Called before each rep: (rep, reps); rep 0 is the warm-up, 1..reps timed.
  std::function<void(int64_t rep, int64_t reps)> progress;
};

struct SpeedResult {
  // Throughput (medians over the timed reps) and each rep's values.
  double prefill_tok_s = 0;
  double decode_tok_s = 0;
  std::vector<double> prefill_tok_s_reps;
  std::vector<double> decode_tok_s_reps;
  std::vector<double> prefill_seconds_reps;
  std::vector<double> decode_seconds_reps;

  // Weights streamed per decoded token (see the file comment).
  uint64_t model_bytes = 0;
  uint64_t layer_bytes = 0;        // all layer units
  uint64_t output_head_bytes = 0;  // the output head matrix
  std::vector<std::pair<DType, uint64_t>> bytes_by_type;  // model_bytes by tensor format, largest first
  uint64_t matmul_flops_per_token = 0;  // 2 x the elements of every 2-D weight streamed (attention excluded)

  // Memory bandwidth: decode's achieved rate and the machine's read rate.
  double achieved_gbps = 0;   // model_bytes * decode_tok_s / 1e9
  double mem_bw_gbps = 0;     // measured read bandwidth (median), 0 when skipped
  std::vector<double> mem_bw_gbps_reps;
  size_t mem_bw_bytes = 0;    // probe buffer size
  double achieved_fraction = 0;  // achieved_gbps / mem_bw_gbps (> 1: the weights are served from cache)

  // Rooflines from memory bandwidth alone (an upper bound; compute is not modelled).
  double decode_roofline_tok_s = 0;   // mem_bw / model_bytes: every token streams all weights
  double prefill_roofline_tok_s = 0;  // mem_bw * batch / model_bytes: one weight pass per micro-batch
  double prefill_gflops = 0;          // matmul_flops_per_token * prefill_tok_s / 1e9

  // What was run.
  int threads = 0;
  Isa isa = Isa::kScalar;
  int64_t prompt_tokens = 0, gen_tokens = 0, reps = 0;
  int64_t n_ctx = 0;
  int64_t prefill_batch = 0;  // tokens per micro-batch
  uint64_t llc_bytes = 0;     // largest CPU cache, 0 when unknown
};

// Runs the benchmark: the memory-bandwidth probe on the engine's thread pool,
// then one warm-up rep and `reps` timed reps. Each rep opens a fresh Session,
// times feed(P tokens) (prefill), then times N single-token feed() calls,
// each fed the argmax of the previous logits (greedy decode; the loop costs
// feed() plus an argmax). Throws ebb::Error on impossible options.
SpeedResult bench_speed(Engine& engine, const SpeedOptions& opts);

// The streamed-bytes accounting alone (model_bytes and its parts).
void count_streamed_bytes(const Model& model, SpeedResult* r);

}  // namespace ebb
