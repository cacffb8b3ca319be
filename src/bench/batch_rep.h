// One repetition of batched decode, shared by the benchmarks that compare
// against it (bench batch; bench serve's in-process baseline).
#pragma once

#include <cstdint>

#include "runtime/engine.h"

namespace ebb::cli {

struct BatchRep {
  double prefill_tok_s = 0;  // S prompts prefilled one after the other
  double decode_tok_s = 0;   // S x gen tokens over the decode steps' time
};

// S sessions (no prefix cache) each prefill `prompt` random tokens drawn
// from seed, then `gen` steps each decode one greedy token of every stream
// in one forward pass (runtime/batch.h run_step).
BatchRep run_batch_rep(Engine& e, int64_t streams, int64_t prompt, int64_t gen, int64_t kv_chunk, uint32_t seed);

}  // namespace ebb::cli
