// Element-wise and row operations of the transformer block, one table per
// instruction-set target (scalar reference first).
#pragma once

#include <cstdint>

#include "kernels/cpu.h"

namespace ebb {

enum class RopeStyle {
  kNorm,  // rotate pairs (2i, 2i+1)            (llama)
  kNeox,  // rotate pairs (i, i + rot_dim / 2)  (qwen2, qwen3)
};

struct OpsKernels {
  // y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n. y may alias x.
  void (*rmsnorm)(const float* x, const float* w, float* y, int64_t n, float eps) = nullptr;
  // y[i] = silu(gate[i]) * up[i]. y may alias gate.
  void (*swiglu)(const float* gate, const float* up, float* y, int64_t n) = nullptr;
  // y[i] += x[i]
  void (*add)(float* y, const float* x, int64_t n) = nullptr;
  // In place: x = softmax(x).
  void (*softmax)(float* x, int64_t n) = nullptr;
  // Rotates each of n_heads head vectors in place.
  //   x:       [n_heads, head_dim]
  //   cos_sin: [rot_dim / 2][2] (cos, sin) of pos * theta_i for this token
  // Dimensions at and beyond rot_dim are left unchanged.
  void (*rope)(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_sin,
               RopeStyle style) = nullptr;
  // The (cos, sin) table of one position for rope: rope_cos_sin, except on
  // the ref-engine target (the reference engine's float angles).
  void (*rope_angles)(int64_t pos, int64_t rot_dim, float base, float freq_scale, float* cos_sin,
                      const float* factors) = nullptr;
};

const OpsKernels& ops_kernels(Isa isa);

// cos_sin[i] = (cos, sin)(pos * freq_scale * base^(-2i / rot_dim) / factors[i]),
// i < rot_dim / 2; factors: [rot_dim / 2] divisors, or nullptr for none. The
// angles are computed in double and rounded once.
void rope_cos_sin(int64_t pos, int64_t rot_dim, float base, float freq_scale, float* cos_sin,
                  const float* factors = nullptr);

}  // namespace ebb
