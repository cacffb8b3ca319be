// The low-rank products of LoRA adapters, y += s · B (A x), one table per
// instruction-set target (scalar reference first, STYLE habit 2). The adapter
// tensors are F32 or IEEE F16 in memory (F16 when the file's values are
// exactly F16, which halves the bytes a token reads; model/lora.h); each
// product has a variant per weight type, the F16 one converting each weight
// to F32 and then doing exactly the F32 variant's arithmetic. B is kept
// transposed so the up product streams rows of n_out.
//
// Shapes (row-major):
//   a:  [r, n_in]      A, one row per rank component (F32 or F16 bits)
//   bt: [r, n_out]     B transposed (F32 or F16 bits)
//   x:  [n, x_stride]  input rows (the first n_in floats of each are read)
//   t:  [n, r]         the rank-r intermediate A x
//   y:  [n, y_stride]  output rows (the first n_out floats of each are updated)
//
// The kernels are single-threaded; the forward pass splits the work.
#pragma once

#include <cstdint>

#include "kernels/cpu.h"

namespace ebb {

struct LoraKernels {
  // t[i, j] = Σ_k a[j, k] · x[i, k], for i < n, j < r, k < n_in.
  void (*down)(const float* a, const float* x, int64_t x_stride, int64_t n, int64_t r, int64_t n_in,
               float* t) = nullptr;
  // y[i, c] += s · Σ_j t[i, j] · bt[j, c], for i < n, c in [c0, c1).
  // The column range lets callers split n_out across threads.
  void (*up)(const float* bt, const float* t, float s, int64_t n, int64_t r, int64_t n_out, int64_t c0,
             int64_t c1, float* y, int64_t y_stride) = nullptr;
  // The same products with F16 weights (a, bt: IEEE half bits).
  void (*down_f16)(const uint16_t* a, const float* x, int64_t x_stride, int64_t n, int64_t r, int64_t n_in,
                   float* t) = nullptr;
  void (*up_f16)(const uint16_t* bt, const float* t, float s, int64_t n, int64_t r, int64_t n_out, int64_t c0,
                 int64_t c1, float* y, int64_t y_stride) = nullptr;
};

// The table of a target (kRefEngine uses the scalar reference).
const LoraKernels& lora_kernels(Isa isa);

}  // namespace ebb
