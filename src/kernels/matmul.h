// Matrix products against weights in any computable format, through one
// table of per-format kernels (STYLE habit 3): adding a format is adding a row.
//
// Quantized weights pair with activations quantized on the fly (Q8_0 for the
// 32-blocks, Q8_K for the K-quants) and integer dot products. F16 weights pair
// with activations rounded to F16 and BF16 weights with activations rounded
// to BF16 (round to nearest even), the products summed in F32: the pairing of
// the engine we validate logits against, and half the activation bytes (and
// both operands of VDPBF16PS); a batch may hold the rounded values as floats
// (batch_act). F32 weights pair with F32 activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu.h"
#include "kernels/tensor.h"

namespace ebb {

class ThreadPool;
struct Q8_0Sums;  // kernels/quant_blocks.h

// One row of the format table.
struct FormatKernels {
  DType weight = DType::kF32;
  DType act = DType::kF32;  // the activation format vec_dot expects
  // Dequantizes one row of n elements (n a multiple of the block size).
  void (*to_float)(const void* src, float* dst, int64_t n) = nullptr;
  // Converts one activation row of n floats into the `act` format.
  void (*quantize_act)(const float* src, void* dst, int64_t n) = nullptr;
  // *out = dot(weight row w, activation row a), both of n elements.
  void (*vec_dot)(int64_t n, const void* w, const void* a, float* out) = nullptr;
  // Optional register-blocked tile for several tokens: for r < tile_rows,
  // t < tile_tokens, y[t * y_stride + r] = dot(row r of w, token t of a),
  // rows w_stride and tokens a_stride bytes apart, weight blocks unpacked
  // once per tile and reused across the tokens. nullptr: matmul calls
  // vec_dot per (row, token).
  void (*vec_dot_tile)(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride, float* y,
                       int64_t y_stride) = nullptr;
  int tile_rows = 0;
  int tile_tokens = 0;
  // A batched product's arithmetic for one (row, token): the rows and tokens
  // that do not fill a tile, or all of them when there is no tile. With a
  // tile, bit-identical to it, so every output of a batch is computed the
  // same way whatever the batch's size (the ref-engine target's Q4_K is the
  // one exception, as its model engine is). nullptr: vec_dot serves them.
  // (A one-token product runs vec_dot, which may sum in another order.)
  void (*tile_dot)(int64_t n, const void* w, const void* a, float* out) = nullptr;
  // Optional: a batch's activations in another format than vec_dot's, made
  // by quantize_batch_act (rows of batch_act) and read by vec_dot_tile and
  // tile_dot. F16 on AVX2: rounded to F16 and kept as floats (the same
  // values), so a tile widens only its weight rows. nullptr: act throughout.
  DType batch_act = DType::kF32;
  void (*quantize_batch_act)(const float* src, void* dst, int64_t n) = nullptr;
  // Optional, Q4_0, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K: the kernels of
  // packed views (Packing::kQ4_0x8, kQ8_0x8, kQ4_Kx8, kQ5_Kx8, kQ6_Kx8). Per
  // (row, token) they compute isum_b, the exact integer dot of block b, and
  // acc = fmaf(dx_b * dy_b, float(isum_b), acc) block after block (the
  // K-quants: per super-block; Q4_K and Q5_K have a second chain for the min
  // part and acc - accm at the end). x8_sums fills
  // sums[n / 32] for one activation row (Q4_0; the others need none); x8_gemm
  // computes one group of eight rows (w: its n / 32 packed blocks) against
  // n_tok <= 4 tokens: y[t * y_stride + r] for r < 8, activations and sums of
  // token t at a + t * a_stride and sums + t * s_stride; x8_dot computes one
  // plain row (the rows past the last group) in the same arithmetic, bit for
  // bit. A kernel set with x8_gemm is one whose engine packs these formats.
  void (*x8_sums)(int64_t n, const void* a, Q8_0Sums* sums) = nullptr;
  void (*x8_gemm)(int64_t n, const void* w, const void* a, size_t a_stride, const Q8_0Sums* sums, int64_t s_stride,
                  int n_tok, float* y, int64_t y_stride) = nullptr;
  void (*x8_dot)(int64_t n, const void* w, const void* a, float* out) = nullptr;
  // Optional (Q4_0 on AVX-512): two consecutive groups (16 rows; w: the
  // first group's blocks, the second's group_bytes after) against n_tok <= 8
  // tokens, y[t * y_stride + r] for r < 16, x8_gemm's outputs bit for bit.
  // Batches (several conversations' decode rows, prefill) run on it.
  void (*x16_gemm)(int64_t n, const void* w, size_t group_bytes, const void* a, size_t a_stride, const Q8_0Sums* sums,
                   int64_t s_stride, int n_tok, float* y, int64_t y_stride) = nullptr;
};

// All kernels of one instruction-set target.
class KernelSet {
 public:
  // nullptr when the format has no kernels.
  virtual const FormatKernels* format(DType weight) const = 0;
  virtual Isa isa() const = 0;
  virtual ~KernelSet() = default;
};

// The kernels of a supported target (static lifetime). Checks isa_supported.
const KernelSet& kernel_set(Isa isa);

// Bytes of scratch matmul() needs for n_tokens activation rows of `cols`.
size_t matmul_scratch_bytes(DType weight, int64_t cols, int64_t n_tokens);

// A low-rank term added to a one-token product's output after W x (a LoRA
// pair, kernels/lora.h): y[r] += scale · Σ_j bt[j, r] · t[j], t = A x, each
// output in the LoRA kernels' arithmetic whatever the split over threads, so
// the result is bit for bit the LoRA kernels' down then up after the product.
struct LowRankTerm {
  const void* a = nullptr;   // [rank, W.cols] F32, or IEEE half bits when f16
  const void* bt = nullptr;  // [rank, W.rows] B transposed, the same type
  bool f16 = false;
  int64_t rank = 0;
  float scale = 0.0f;
  float* t = nullptr;  // [rank] scratch for A x, one per term
};

// y[t][r] = sum_c W[r][c] * x[t][c] for t < n_tokens, r < W.rows.
//   x:       [n_tokens, W.cols] floats, rows x_stride floats apart
//   y:       [n_tokens, W.rows] floats, rows y_stride floats apart
//   scratch: matmul_scratch_bytes(W.type, W.cols, n_tokens), 64-byte aligned
// Work is split over the pool's threads; nothing is allocated.
struct MatmulArgs {
  const WeightView* w = nullptr;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int64_t n_tokens = 1;
  float* y = nullptr;
  int64_t y_stride = 0;
  void* scratch = nullptr;
  // One token only (n_tokens == 1): low-rank terms added to y after W x, in
  // order, inside the product's own pool dispatch: their A x products are
  // claimed first, and each piece of output rows gets its rows of B (A x)
  // right after its rows of W x, so they add no dispatch and no barrier.
  std::span<const LowRankTerm> terms;
};
void matmul(const KernelSet& ks, const MatmulArgs& args, ThreadPool& pool);

// Several products with the same input x (q/k/v, gate/up): args[i] differ
// only in w, y, y_stride and terms. For one token whose weights share an activation
// format, x is converted once and the union of all rows is split over the
// threads in ONE pool dispatch; otherwise each product runs as matmul().
// Results are identical to calling matmul() for each. scratch must hold
// matmul_scratch_bytes for every weight.
void matmul_multi(const KernelSet& ks, const MatmulArgs* args, int n, ThreadPool& pool);

// Dequantizes row r of W into dst[W.cols] (for embedding lookups); any packing.
void dequantize_row(const KernelSet& ks, const WeightView& w, int64_t r, float* dst);

}  // namespace ebb
