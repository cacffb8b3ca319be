// Kernels of on-device training (LoRA over a frozen base; DESIGN.md
// "Trainer"): the forward ops whose saved results the backward needs, and
// the backward of every op of the transformer block. One table per
// instruction-set target, scalar reference first (STYLE habit 2); every SIMD
// version is tested against it. Activations and gradients are F32; shapes
// are row-major and given beside each argument. Gradients named d* that say
// "+=" accumulate (the caller zeroes them), the others are written.
#pragma once

#include <cstdint>

#include "kernels/cpu.h"

namespace ebb {

class KernelSet;
class ThreadPool;
struct WeightView;

struct TrainOpsKernels {
  // RMSNorm backward (weights w frozen). Forward: y = x * r * w with
  // r = 1 / sqrt(mean(x^2) + eps).
  //   dx[i] += r * (w[i] dy[i] - x[i] * r^2 * mean_j(w[j] dy[j] x[j]))
  //   x, dy, dx: [n]  w: [n]
  void (*rmsnorm_backward)(const float* x, const float* w, const float* dy, float* dx, int64_t n, float eps) = nullptr;

  // SwiGLU backward. Forward: h = silu(g) * u, silu(g) = g * sigmoid(g).
  //   dg[i] = dh[i] * u[i] * sigmoid(g[i]) * (1 + g[i] * (1 - sigmoid(g[i])))
  //   du[i] = dh[i] * silu(g[i])
  //   g, u, dh, dg, du: [n]; dg and du are written (may not alias the inputs).
  void (*swiglu_backward)(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n) = nullptr;

  // Causal attention over one sequence, contiguous F32 (training runs whole
  // sequences, not KV chunks), grouped-query heads (head h reads KV head
  // h / (n_heads / n_kv_heads)). Query row i attends to rows [0, i].
  //   q:   [T, n_heads, head_dim]      (after norm and RoPE)
  //   k,v: [T, n_kv_heads, head_dim]
  //   out: [T, n_heads, head_dim]
  //   lse: [T, n_heads]  log-sum-exp of the scaled scores of each row (saved for the backward)
  // Any head_dim and T; no scratch (the SIMD targets keep one block of 64
  // scores on the stack and fold the blocks in by the running max).
  void (*attention_forward)(const float* q, const float* k, const float* v, int64_t T, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float scale, float* out, float* lse) = nullptr;
  // Its backward, recomputing the probabilities from q, k and lse:
  //   dq: [T, n_heads, head_dim] written
  //   dk, dv: [T, n_kv_heads, head_dim] written (the heads of a group summed)
  //   scratch: [T] floats (one row of probabilities)
  void (*attention_backward)(const float* q, const float* k, const float* v, const float* out, const float* dout,
                             const float* lse, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, float* dq, float* dk, float* dv, float* scratch) = nullptr;

  // Weighted cross-entropy of one row: loss = weight * (logsumexp(z) - z[target]);
  // dz = weight * (softmax(z) - onehot(target)) written over z's row (in place).
  // Returns the row's loss (already multiplied by weight). weight 0: dz = 0, returns 0.
  // Any sign of weight (REINFORCE advantages); 0 <= target < n_vocab (checked).
  //   z: [n_vocab]
  double (*cross_entropy)(float* z, int64_t n_vocab, int32_t target, float weight) = nullptr;

  // LoRA backward of y += s · B (A x) for T rows, with t = A x saved from
  // the forward:
  //   dbt[j, c] += s · Σ_i t[i, j] dy[i, c]        (the gradient of B, transposed like bt)
  //   dt[i, j]   = s · Σ_c dy[i, c] bt[j, c]       (written)
  //   da[j, k]  += Σ_i dt[i, j] x[i, k]
  //   dx[i, k]  += Σ_j dt[i, j] a[j, k]            (dx may be nullptr: not wanted)
  //   x: [T, n_in]  t, dt: [T, r]  dy: [T, n_out]  a, da: [r, n_in]  bt, dbt: [r, n_out]  dx: [T, n_in]
  void (*lora_backward)(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                        int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                        float* dx) = nullptr;
};

// The table of a target (kRefEngine uses the scalar reference).
const TrainOpsKernels& train_ops_kernels(Isa isa);

// dx[T, n_in] += dy[T, n_out] · W, for a frozen weight W of any computable
// format ([n_out rows of n_in], packed or not): the gradient through a
// projection y = W x. W is dequantized tile by tile (rows of the tile into
// `scratch`), never whole. Work is split over the pool by column blocks of
// dx and, when those are too few for the threads, by ranges of W's rows
// summed into partial copies of dx in `scratch` (kernels/matmul_t.cpp), so
// no two threads write the same element.
//   dy: [T, n_out]  dx: [T, n_in] (+=)  n_out = w.rows, n_in = w.cols
//   scratch: matmul_t_scratch_floats(w, T, pool.size()) floats, which serve any T' <= T
void matmul_t(const KernelSet& ks, const WeightView& w, const float* dy, int64_t T, float* dx, float* scratch,
              ThreadPool& pool);
size_t matmul_t_scratch_floats(const WeightView& w, int64_t T, int n_threads);

}  // namespace ebb
