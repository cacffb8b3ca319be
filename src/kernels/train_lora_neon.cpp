// aarch64 NEON training products; train_lora_avx2.cpp at half the width,
// with NEON's 32 registers. nn: blocks of 5 rows x 16 columns of C held in
// 20 registers across the sum over k; columns in panels sized so the panel
// of B stays in L2 across all rows of C. nt: blocks of 4 x 4 dot products,
// 16 accumulators. The last N % 4 columns (nn) and K % 4 elements (nt) are
// summed in scalar code, over k in order as the reference does.
// Every loop over a block's rows, vectors or columns is unrolled by
// #pragma GCC unroll: rolled, GCC keeps the accumulator arrays in memory and
// stores them on every step of k; unrolled, they live in registers.
#include <arm_neon.h>

#include <algorithm>

#include "kernels/train_lora_internal.h"

namespace ebb::detail {
namespace {

// Rows of C per block: 5 x 4 accumulators, 4 vectors of B and 5 values of A
// fill 29 of the 32 registers (6 rows would spill).
constexpr int kRowsNN = 5;

// C[MB rows, 4 NV columns] += alpha · A[MB, K] · B[K, 4 NV].
template <int MB, int NV>
inline void nn_block(int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk, const float* b, int64_t ldb,
                     float* c, int64_t ldc) {
  float32x4_t acc[MB][NV];
  #pragma GCC unroll 32
  for (int m = 0; m < MB; ++m)
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[m][v] = vdupq_n_f32(0.0f);
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    float32x4_t bv[NV];
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) bv[v] = vld1q_f32(bk + 4 * v);
    const float* ak = a + k * a_sk;
    #pragma GCC unroll 32
    for (int m = 0; m < MB; ++m) {
      const float32x4_t am = vld1q_dup_f32(ak + m * a_sm);
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[m][v] = vfmaq_f32(acc[m][v], am, bv[v]);
    }
  }
  const float32x4_t va = vdupq_n_f32(alpha);
  #pragma GCC unroll 32
  for (int m = 0; m < MB; ++m) {
    float* cm = c + m * ldc;
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) vst1q_f32(cm + 4 * v, vfmaq_f32(vld1q_f32(cm + 4 * v), va, acc[m][v]));
  }
}

// MB rows of C, columns [n0, n1).
template <int MB>
void nn_rows(int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk, const float* b, int64_t ldb,
             float* c, int64_t ldc, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16) nn_block<MB, 4>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc);
  for (; n + 4 <= n1; n += 4) nn_block<MB, 1>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc);
  for (; n < n1; ++n)
    #pragma GCC unroll 32
    for (int m = 0; m < MB; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += a[m * a_sm + k * a_sk] * b[k * ldb + n];
      c[m * ldc + n] += alpha * acc;
    }
}

void gemm_nn_neon(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk,
                  const float* b,  // [K, ldb]
                  int64_t ldb,
                  float* c,  // [M, ldc]
                  int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  // A panel of B: K rows of `panel` columns, about 128 KB.
  const int64_t panel = std::max<int64_t>(64, 32768 / K / 64 * 64);
  for (int64_t n0 = 0; n0 < N; n0 += panel) {
    const int64_t n1 = std::min(N, n0 + panel);
    for (int64_t m0 = 0; m0 < M; m0 += kRowsNN) {
      const float* am = a + m0 * a_sm;
      float* cm = c + m0 * ldc;
      switch (std::min<int64_t>(kRowsNN, M - m0)) {
        case 5: nn_rows<5>(K, alpha, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 4: nn_rows<4>(K, alpha, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 3: nn_rows<3>(K, alpha, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 2: nn_rows<2>(K, alpha, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        default: nn_rows<1>(K, alpha, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
      }
    }
  }
}

// C[MR, NR] += alpha · A[MR, K] · B[NR, K]ᵀ.
template <int MR, int NR>
void nt_block(int64_t K, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
              int64_t ldc) {
  float32x4_t acc[MR][NR];
  #pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) acc[m][n] = vdupq_n_f32(0.0f);
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    float32x4_t bv[NR];
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) bv[n] = vld1q_f32(b + n * ldb + k);
    #pragma GCC unroll 32
    for (int m = 0; m < MR; ++m) {
      const float32x4_t av = vld1q_f32(a + m * lda + k);
      #pragma GCC unroll 32
      for (int n = 0; n < NR; ++n) acc[m][n] = vfmaq_f32(acc[m][n], av, bv[n]);
    }
  }
  #pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) {
      float tail = 0.0f;
      for (int64_t l = k; l < K; ++l) tail += a[m * lda + l] * b[n * ldb + l];
      c[m * ldc + n] += alpha * (vaddvq_f32(acc[m][n]) + tail);
    }
}

template <int MR>
void nt_rows(int64_t N, int64_t K, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
             int64_t ldc) {
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) nt_block<MR, 4>(K, alpha, a, lda, b + n * ldb, ldb, c + n, ldc);
  switch (N - n) {
    case 3: nt_block<MR, 3>(K, alpha, a, lda, b + n * ldb, ldb, c + n, ldc); break;
    case 2: nt_block<MR, 2>(K, alpha, a, lda, b + n * ldb, ldb, c + n, ldc); break;
    case 1: nt_block<MR, 1>(K, alpha, a, lda, b + n * ldb, ldb, c + n, ldc); break;
    default: break;
  }
}

void gemm_nt_neon(int64_t M, int64_t N, int64_t K, float alpha,
                  const float* a,  // [M, lda]
                  int64_t lda,
                  const float* b,  // [N, ldb]
                  int64_t ldb,
                  float* c,  // [M, ldc]
                  int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) nt_rows<4>(N, K, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc);
  switch (M - m) {
    case 3: nt_rows<3>(N, K, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc); break;
    case 2: nt_rows<2>(N, K, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc); break;
    case 1: nt_rows<1>(N, K, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc); break;
    default: break;
  }
}

}  // namespace

const TrainGemm& train_gemm_neon() {
  static const TrainGemm g{gemm_nn_neon, gemm_nt_neon};
  return g;
}

void lora_backward_neon(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                        int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                        float* dx) {
  lora_backward_with(train_gemm_neon(), x, t, dy, a, bt, s, T, r, n_in, n_out, da, dbt, dt, dx);
}

}  // namespace ebb::detail
