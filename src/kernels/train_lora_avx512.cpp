// AVX-512 training products. nn: blocks of 6 rows x 64 columns of C held in
// 24 registers across the sum over k, each load of B shared by the six rows
// and each broadcast of A by four vectors; columns in panels sized so the
// panel of B stays in L2 across all rows of C. nt: blocks of 4 x 4 dot
// products, 16 accumulators, each load shared by four products. Tails use
// k-masks, so they go through the same arithmetic as the body.
// Every loop over a block's rows, vectors or columns is unrolled by
// #pragma GCC unroll: rolled, GCC keeps the accumulator arrays in memory and
// stores them on every step of k; unrolled, they live in registers.
// GCC 12's avx512fintrin.h seeds several intrinsics with _mm512_undefined_ps()
// and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/ops_avx512.h"
#include "kernels/train_lora_internal.h"

namespace ebb::detail {
namespace {

using avx512::tail_mask;

constexpr int kRowsNN = 6;  // rows of C per block
constexpr __mmask16 kFull = 0xFFFF;

// C[MB rows, 16 NV columns] += alpha · A[MB, K] · B[K, 16 NV]; the last
// vector only in the lanes of `last`.
template <int MB, int NV>
inline void nn_block(int64_t K, __m512 alpha, const float* a, int64_t a_sm, int64_t a_sk, const float* b,
                     int64_t ldb, float* c, int64_t ldc, __mmask16 last) {
  __m512 acc[MB][NV];
  #pragma GCC unroll 32
  for (int m = 0; m < MB; ++m)
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    __m512 bv[NV];
    #pragma GCC unroll 32
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm512_loadu_ps(bk + 16 * v);
    bv[NV - 1] = _mm512_maskz_loadu_ps(last, bk + 16 * (NV - 1));
    const float* ak = a + k * a_sk;
    #pragma GCC unroll 32
    for (int m = 0; m < MB; ++m) {
      const __m512 am = _mm512_set1_ps(ak[m * a_sm]);
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(am, bv[v], acc[m][v]);
    }
  }
  #pragma GCC unroll 32
  for (int m = 0; m < MB; ++m) {
    float* cm = c + m * ldc;
    #pragma GCC unroll 32
    for (int v = 0; v < NV - 1; ++v)
      _mm512_storeu_ps(cm + 16 * v, _mm512_fmadd_ps(alpha, acc[m][v], _mm512_loadu_ps(cm + 16 * v)));
    float* cl = cm + 16 * (NV - 1);
    _mm512_mask_storeu_ps(cl, last, _mm512_fmadd_ps(alpha, acc[m][NV - 1], _mm512_maskz_loadu_ps(last, cl)));
  }
}

// MB rows of C, columns [n0, n1).
template <int MB>
void nn_rows(int64_t K, __m512 alpha, const float* a, int64_t a_sm, int64_t a_sk, const float* b, int64_t ldb,
             float* c, int64_t ldc, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 64 <= n1; n += 64) nn_block<MB, 4>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc, kFull);
  for (; n + 16 <= n1; n += 16) nn_block<MB, 1>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc, kFull);
  if (n < n1) nn_block<MB, 1>(K, alpha, a, a_sm, a_sk, b + n, ldb, c + n, ldc, tail_mask(n1 - n));
}

void gemm_nn_avx512(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk,
                    const float* b,  // [K, ldb]
                    int64_t ldb,
                    float* c,  // [M, ldc]
                    int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  const __m512 va = _mm512_set1_ps(alpha);
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
  __m512 acc[MR][NR];
  #pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mk = K - k >= 16 ? kFull : tail_mask(K - k);
    __m512 bv[NR];
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) bv[n] = _mm512_maskz_loadu_ps(mk, b + n * ldb + k);
    #pragma GCC unroll 32
    for (int m = 0; m < MR; ++m) {
      const __m512 av = _mm512_maskz_loadu_ps(mk, a + m * lda + k);
      #pragma GCC unroll 32
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(av, bv[n], acc[m][n]);
    }
  }
  #pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
    #pragma GCC unroll 32
    for (int n = 0; n < NR; ++n) c[m * ldc + n] += alpha * _mm512_reduce_add_ps(acc[m][n]);
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

void gemm_nt_avx512(int64_t M, int64_t N, int64_t K, float alpha,
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

const TrainGemm& train_gemm_avx512() {
  static const TrainGemm g{gemm_nn_avx512, gemm_nt_avx512};
  return g;
}

void lora_backward_avx512(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                          int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                          float* dx) {
  lora_backward_with(train_gemm_avx512(), x, t, dy, a, bt, s, T, r, n_in, n_out, da, dbt, dt, dx);
}

}  // namespace ebb::detail
