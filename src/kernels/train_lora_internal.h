// The F32 matrix products under TrainOpsKernels::lora_backward and matmul_t
// (kernels/train_ops.h), one pair per target, and the per-target
// lora_backward built from them. Internal to src/kernels: train_ops.cpp puts
// lora_backward_<target> into each target's table, matmul_t.cpp picks the
// products of its kernel set's target.
//
// The scalar products are the reference (STYLE habit 2): every C element is
// one float sum over k in index order from 0, one product and one addition
// per term, then scaled by alpha and added to C. The SIMD products keep each
// element's sum over k in index order but fuse the multiply-add; tests
// compare them with the reference within a tolerance relative to the sum of
// the terms' magnitudes.
#pragma once

#include <cstdint>

#include "kernels/cpu.h"

namespace ebb::detail {

// C[m, n] += alpha · Σ_k A[m, k] · B[k, n]   for m < M, n < N, k < K
//   A[m, k] = a[m * a_sm + k * a_sk]   (any two strides: a matrix or its transpose)
//   B:        [K, ldb], the first N of each row read
//   C:        [M, ldc], the first N of each row updated
// Blocked for B in rows (a panel of B's columns stays in cache across the
// rows of C); K is kept modest by the callers (T, r, a tile of W's rows).
using GemmNN = void (*)(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk,
                        const float* b, int64_t ldb, float* c, int64_t ldc);

// C[m, n] += alpha · Σ_k A[m, k] · B[n, k]   (rows of A against rows of B: dot products)
//   A: [M, lda]  B: [N, ldb], the first K of each row read  C: [M, ldc]
using GemmNT = void (*)(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda, const float* b,
                        int64_t ldb, float* c, int64_t ldc);

struct TrainGemm {
  GemmNN nn = nullptr;
  GemmNT nt = nullptr;
};

// The products of a target: kScalar and kRefEngine get the scalar reference.
// Checks that the target is compiled in.
const TrainGemm& train_gemm(Isa isa);  // train_lora_scalar.cpp

const TrainGemm& train_gemm_scalar();  // train_lora_scalar.cpp
#if defined(EBB_ARCH_X86)
const TrainGemm& train_gemm_avx2();    // train_lora_avx2.cpp
const TrainGemm& train_gemm_avx512();  // train_lora_avx512.cpp
#endif
#if defined(EBB_ARCH_ARM)
const TrainGemm& train_gemm_neon();  // train_lora_neon.cpp
#endif

// lora_backward (TrainOpsKernels, kernels/train_ops.h) through the products
// of g, in four steps:
//   dbt[r, n_out] += s · tᵀ[r, T] · dy[T, n_out]   (nn, A = t read transposed)
//   dt[T, r]       = s · dy[T, n_out] · btᵀ         (nt, over column chunks of dy and bt so they stay in cache)
//   da[r, n_in]   += dtᵀ[r, T] · x[T, n_in]          (nn)
//   dx[T, n_in]   += dt[T, r] · a[r, n_in]           (nn; skipped when dx is nullptr)
void lora_backward_with(const TrainGemm& g, const float* x, const float* t, const float* dy, const float* a,
                        const float* bt, float s, int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da,
                        float* dbt, float* dt, float* dx);

// The table entries: lora_backward_with with each target's products.
void lora_backward_scalar(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                          int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                          float* dx);
#if defined(EBB_ARCH_X86)
void lora_backward_avx2(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                        int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                        float* dx);
void lora_backward_avx512(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                          int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                          float* dx);
#endif
#if defined(EBB_ARCH_ARM)
void lora_backward_neon(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                        int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                        float* dx);
#endif

}  // namespace ebb::detail
