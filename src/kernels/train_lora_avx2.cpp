// AVX2 + FMA training products; train_lora_avx512.cpp at half the width.
// nn: blocks of 6 rows x 16 columns of C held in 12 registers across the sum
// over k, each load of B shared by the six rows; columns in panels sized so
// the panel of B stays in L2 across all rows of C. nt: blocks of 2 x 4 dot
// products, 8 accumulators. Tails use masked loads and stores, so they go
// through the same arithmetic as the body.
// Every loop over a block's rows, vectors or columns is unrolled by
// #pragma GCC unroll: rolled, GCC keeps the accumulator arrays in memory and
// stores them on every step of k; unrolled, they live in registers.
#include <immintrin.h>

#include <algorithm>

#include "kernels/ops_avx2.h"
#include "kernels/train_lora_internal.h"

namespace ebb::detail {
namespace {

using avx2::hsum_ps;
using avx2::tail_mask;

constexpr int kRowsNN = 6;  // rows of C per block

// C[MB rows, 8 NV columns] += alpha · A[MB, K] · B[K, 8 NV]; with kMasked
// (NV == 1) only the lanes of mask.
template <int MB, int NV, bool kMasked>
inline void nn_block(int64_t K, __m256 alpha, const float* a, int64_t a_sm, int64_t a_sk, const float* b,
                     int64_t ldb, float* c, int64_t ldc, __m256i mask) {
  static_assert(!kMasked || NV == 1);
  __m256 acc[MB][NV];
  #pragma GCC unroll 32
  for (int m = 0; m < MB; ++m)
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    __m256 bv[NV];
    if constexpr (kMasked) {
      bv[0] = _mm256_maskload_ps(bk, mask);
    } else {
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(bk + 8 * v);
    }
    const float* ak = a + k * a_sk;
    #pragma GCC unroll 32
    for (int m = 0; m < MB; ++m) {
      const __m256 am = _mm256_broadcast_ss(ak + m * a_sm);
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(am, bv[v], acc[m][v]);
    }
  }
  #pragma GCC unroll 32
  for (int m = 0; m < MB; ++m) {
    float* cm = c + m * ldc;
    if constexpr (kMasked) {
      _mm256_maskstore_ps(cm, mask, _mm256_fmadd_ps(alpha, acc[m][0], _mm256_maskload_ps(cm, mask)));
    } else {
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v)
        _mm256_storeu_ps(cm + 8 * v, _mm256_fmadd_ps(alpha, acc[m][v], _mm256_loadu_ps(cm + 8 * v)));
    }
  }
}

// MB rows of C, columns [n0, n1).
template <int MB>
void nn_rows(int64_t K, __m256 alpha, const float* a, int64_t a_sm, int64_t a_sk, const float* b, int64_t ldb,
             float* c, int64_t ldc, int64_t n0, int64_t n1) {
  const __m256i none = _mm256_setzero_si256();
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16) nn_block<MB, 2, false>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc, none);
  for (; n + 8 <= n1; n += 8) nn_block<MB, 1, false>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc, none);
  if (n < n1) nn_block<MB, 1, true>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc, tail_mask(n1 - n));
}

void gemm_nn_avx2(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk,
                  const float* b,  // [K, ldb]
                  int64_t ldb,
                  float* c,  // [M, ldc]
                  int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  const __m256 va = _mm256_set1_ps(alpha);
  // A panel of B: K rows of `panel` columns, about 128 KB.
  const int64_t panel = std::max<int64_t>(64, 32768 / K / 64 * 64);
  for (int64_t n0 = 0; n0 < N; n0 += panel) {
    const int64_t n1 = std::min(N, n0 + panel);
    for (int64_t m0 = 0; m0 < M; m0 += kRowsNN) {
      const float* am = a + m0 * a_sm;
      float* cm = c + m0 * ldc;
      switch (std::min<int64_t>(kRowsNN, M - m0)) {
        case 6: nn_rows<6>(K, va, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 5: nn_rows<5>(K, va, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 4: nn_rows<4>(K, va, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 3: nn_rows<3>(K, va, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        case 2: nn_rows<2>(K, va, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
        default: nn_rows<1>(K, va, am, a_sm, a_sk, b, ldb, cm, ldc, n0, n1); break;
      }
    }
  }
}

// C[MR, NR] += alpha · A[MR, K] · B[NR, K]ᵀ.
template <int MR, int NR>
void nt_block(int64_t K, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
              int64_t ldc) {
  __m256 acc[MR][NR];
  #pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 bv[NR];
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) bv[n] = _mm256_loadu_ps(b + n * ldb + k);
    #pragma GCC unroll 32
    for (int m = 0; m < MR; ++m) {
      const __m256 av = _mm256_loadu_ps(a + m * lda + k);
      #pragma GCC unroll 32
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(av, bv[n], acc[m][n]);
    }
  }
  if (k < K) {
    const __m256i mk = tail_mask(K - k);
    __m256 bv[NR];
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) bv[n] = _mm256_maskload_ps(b + n * ldb + k, mk);
    #pragma GCC unroll 32
    for (int m = 0; m < MR; ++m) {
      const __m256 av = _mm256_maskload_ps(a + m * lda + k, mk);
      #pragma GCC unroll 32
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(av, bv[n], acc[m][n]);
    }
  }
  #pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) c[m * ldc + n] += alpha * hsum_ps(acc[m][n]);
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

void gemm_nt_avx2(int64_t M, int64_t N, int64_t K, float alpha,
                  const float* a,  // [M, lda]
                  int64_t lda,
                  const float* b,  // [N, ldb]
                  int64_t ldb,
                  float* c,  // [M, ldc]
                  int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) nt_rows<2>(N, K, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc);
  if (m < M) nt_rows<1>(N, K, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc);
}

}  // namespace

const TrainGemm& train_gemm_avx2() {
  static const TrainGemm g{gemm_nn_avx2, gemm_nt_avx2};
  return g;
}

void lora_backward_avx2(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                        int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                        float* dx) {
  lora_backward_with(train_gemm_avx2(), x, t, dy, a, bt, s, T, r, n_in, n_out, da, dbt, dt, dx);
}

}  // namespace ebb::detail
