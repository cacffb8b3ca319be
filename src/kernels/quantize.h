// Weight quantizers: float rows -> any computable format. Round to nearest
// with a small per-block scale search; not bit-identical to other engines,
// but the output is a valid GGUF block layout. Used by tests and by the
// synthetic-model writer; not on any hot path.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace ebb {

// True for the formats quantize_row can write: F32, F16, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, and the
// activation formats Q8_K and Q8_1.
bool can_quantize(DType t);

// Writes row_bytes(t, n) bytes at dst; n must be a multiple of t's block
// size. src: [n] floats (finite).
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// As quantize_row, for Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS
// without the per-block scale search (one scale, refit once): several times
// faster, a little less exact; for synthetic weights (ebb synth).
void quantize_row_fast(DType t, const float* src, void* dst, int64_t n);

}  // namespace ebb
